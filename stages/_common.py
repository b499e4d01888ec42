"""Shared entry-point plumbing for stage scripts: logging, reading params.yaml, where each stage
reads and writes, one-line errors. Stages import the library inside `main`, after `setup` has said
what runs (torch takes seconds).

Stage commands in `dvc.yaml` carry no value from params.yaml: DVC runs a command in a shell, so a
value interpolated into one (a model name, a target key) could run code before any stage could
refuse it. Each stage instead finds its target in `$DVC_STAGE` (`target_compile@<target>`) and
its paths in `Layout`, from the validated params; `dvc.yaml` states the same paths for DVC as
outputs (`tests/test_dvc_pipeline.py` holds the two against each other)."""

from __future__ import annotations

import argparse
import gc
import logging
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.cli import reported


@dataclass(frozen=True)
class Layout:
    """Where a build's stages read and write: `build/<model>/` and the root's metrics files, or for a
    build-matrix target `build/targets/<target>/` and `matrix/<target>/`."""

    build: Path
    timings: Path
    metrics: Path
    plot: Path

    @classmethod
    def of(cls, cfg: Any, target: str | None) -> Layout:
        """`cfg`: the typed config, or params.yaml as plain data (stages that run before validation)."""
        if target is None:
            name = cfg["model"]["name"] if isinstance(cfg, dict) else cfg.model.name
            return cls(Path("build") / name, Path("timings.json"), Path("metrics.json"),
                       Path("plots") / "build.json")
        matrix = Path("matrix") / target
        return cls(Path("build") / "targets" / target, matrix / "timings.json", matrix / "metrics.json", matrix / "plot.json")


def parser(doc: str | None) -> argparse.ArgumentParser:
    """The stage's argument parser, with `--target NAME` (a build-matrix target; default: the one
    `$DVC_STAGE` names, else the top-level config)."""
    out = argparse.ArgumentParser(description=doc)
    stage = os.environ.get("DVC_STAGE") or ""
    out.add_argument("--target", default=stage.rpartition("@")[2] if "@" in stage else None,
                     help="build-matrix target (params.yaml `targets`); default: the top-level config")
    return out


def setup(doc: str | None) -> tuple[Any, Layout]:
    """Configure progress logging, say which stage starts, and return the validated params as the typed
    config (`PipelineConfig`, of the target the command line or `$DVC_STAGE` names) with the target's layout."""
    args = parser(doc).parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    logging.getLogger("pipeline").info("stage %s: starting", os.environ.get("DVC_STAGE") or os.path.basename(sys.argv[0]))
    from pipeline.config.compose import read_params

    cfg = read_params("params.yaml", args.target)
    return cfg, Layout.of(cfg, args.target)


def run(main: Callable[[], None], warm: bool = False) -> None:
    """Run a stage's `main`; an error is one line on stderr and exit status 2. A stage that imports
    torch and ExecuTorch (`warm`) runs in a fork of the warm stage server, which imported them once
    (`pipeline.stage_server`), where one is reachable. Its outputs are complete when `main` returns,
    so the interpreter's last collections over torch's and ExecuTorch's module graph (1-2 s of every
    stage's exit) are skipped: what is left is frozen (`gc.freeze`)."""
    if warm:
        from pipeline.stage_server import hand_over

        hand_over()
    with reported():
        main()
    gc.freeze()
