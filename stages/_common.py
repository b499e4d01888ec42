"""Shared entry-point plumbing for stage scripts: logging, reading params.yaml, one-line errors.
Stages import the library inside `main`, after `setup` has said what runs (torch takes seconds)."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable
from typing import Any

from pipeline.cli import reported


def parser(doc: str | None) -> argparse.ArgumentParser:
    """The stage's argument parser, with `--target NAME` (a build-matrix target; none: the top-level config)."""
    out = argparse.ArgumentParser(description=doc)
    out.add_argument("--target", help="build-matrix target (params.yaml `targets`); default: the top-level config")
    return out


def setup(target: str | None = None) -> dict[str, Any]:
    """Configure progress logging, say which stage starts, and return the validated params (of
    `target` when given)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    logging.getLogger("pipeline").info("stage %s: starting", os.environ.get("DVC_STAGE") or os.path.basename(sys.argv[0]))
    from pipeline.config.compose import read_params

    return read_params("params.yaml", target)


def run(main: Callable[[], None]) -> None:
    """Run a stage's `main`; an error is one line on stderr and exit status 2."""
    with reported():
        main()
