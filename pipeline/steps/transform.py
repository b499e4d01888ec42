"""The transform step: the configured Edge passes applied per method."""

from __future__ import annotations

import logging
from pathlib import Path

from pipeline.config import objects
from pipeline.config.schema import PipelineConfig
from pipeline.files import atomic_dir
from pipeline.steps.intermediates import load_edge, save_edge
from pipeline.steps.progress import step

log = logging.getLogger("pipeline")


def run_transform(cfg: PipelineConfig, in_dir: str | Path, out_dir: str | Path) -> None:
    """Apply the configured Edge passes per method."""
    methods = list(cfg.model.methods)
    manager = load_edge(methods, in_dir)
    passes = {m: objects.transform_passes(cfg, m) for m in methods}
    if any(passes.values()):
        with step(f"transform: {sum(map(len, passes.values()))} pass(es)"):
            manager = manager.transform(passes)
    else:
        log.info("transform: no passes configured; the programs pass through")
    with atomic_dir(out_dir) as tmp:
        save_edge(manager, methods, tmp)
