"""The transform step: the configured Edge passes applied per method. With none configured the
exported programs pass through as they are, copied without loading them (no torch, no ExecuTorch:
the DVC stage decides this from params.yaml alone, `configured`)."""

from __future__ import annotations

import logging
import shutil
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.files import atomic_dir
from pipeline.steps.progress import step

if TYPE_CHECKING:
    from pipeline.config.schema import PipelineConfig

log = logging.getLogger("pipeline")


def configured(passes: Mapping[str, Any], methods: Iterable[str]) -> bool:
    """Whether `transforms.passes` gives any of `methods` a pass (its own or the "*" entries)."""
    return any(passes.get(key) for key in ("*", *methods))


def pass_through(in_dir: str | Path, out_dir: str | Path) -> None:
    """The exported programs, unchanged, as the transformed ones."""
    log.info("transform: no passes configured; the programs pass through")
    with atomic_dir(out_dir) as tmp:
        shutil.copytree(in_dir, tmp, dirs_exist_ok=True)


def run_transform(cfg: PipelineConfig, in_dir: str | Path, out_dir: str | Path) -> None:
    """Apply the configured Edge passes per method."""
    methods = list(cfg.model.methods)
    if not configured(cfg.transforms.passes, methods):
        pass_through(in_dir, out_dir)
        return
    from pipeline.config import objects
    from pipeline.steps.intermediates import load_edge, save_edge

    manager = load_edge(methods, in_dir)
    passes = {m: objects.transform_passes(cfg, m) for m in methods}
    with step(f"transform: {sum(map(len, passes.values()))} pass(es)"):
        manager = manager.transform(passes)
    with atomic_dir(out_dir) as tmp:
        save_edge(manager, methods, tmp)
