"""Shared entry-point plumbing for stage scripts: logging, reading params.yaml, one-line errors."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from pipeline.cli import reported
from pipeline.config.compose import read_params


def setup() -> dict[str, Any]:
    """Configure progress logging and return the validated params."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    return read_params("params.yaml")


def run(main: Callable[[], None]) -> None:
    """Run a stage's `main`; an error is one line on stderr and exit status 2."""
    with reported():
        main()
