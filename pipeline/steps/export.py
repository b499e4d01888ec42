"""The export step: the compiled methods lowered (TensorRT first, then the configured partitioner chain)
into Edge programs, and the lowering report."""

from __future__ import annotations

from pathlib import Path

from pipeline.config import objects
from pipeline.config.schema import PipelineConfig
from pipeline.files import atomic_dir, write_json
from pipeline.lowering.export import export
from pipeline.steps.intermediates import load_constants, load_exported, save_edge
from pipeline.steps.progress import step


def run_export(cfg: PipelineConfig, compiled: str | Path, out_dir: str | Path, report: str | Path) -> None:
    """Lower the compiled methods (TensorRT first, then the configured chain) into Edge programs."""
    methods = list(cfg.model.methods)
    programs = {m: load_exported(Path(compiled) / f"{m}.pt2") for m in methods}
    with step(f"export: lowering {', '.join(methods)}"):
        lowered = export(programs, partitioners={m: objects.partitioners(cfg, m) for m in methods},
                         compile_specs={m: objects.compile_spec(cfg, m) for m in methods},
                         constant_methods=load_constants(compiled))
    with atomic_dir(out_dir) as tmp:
        save_edge(lowered.manager, methods, tmp)
    write_json(report, lowered.report)
