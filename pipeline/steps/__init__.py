"""The build steps, each reading its inputs from disk and writing complete outputs: compile (-> .pt2
per method) -> export (-> lowered Edge programs + report.json) -> transform (-> transformed Edge
programs) -> serialize (-> .pte, .ptd, manifest.json) -> validate (-> validation.json, metrics). DVC
stages and the in-process Hydra app both call these; each takes the typed config (`PipelineConfig`).
Each step's module loads when first named, so a stage imports only its own step (the compile stage
never loads ExecuTorch, a stage with no Edge passes neither)."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.files import write_json

if TYPE_CHECKING:
    from pipeline.config.schema import PipelineConfig

__all__ = ["run_all", "run_compile", "run_export", "run_serialize", "run_transform", "run_validate"]


def __getattr__(name: str) -> Any:
    if name in __all__ and name != "run_all":
        return getattr(importlib.import_module(f"pipeline.steps.{name.removeprefix('run_')}"), name)
    raise AttributeError(f"module 'pipeline.steps' has no attribute {name!r}")


def run_all(cfg: PipelineConfig, build_dir: str | Path, validate: bool = False) -> dict[str, Path]:
    """The steps in-process into `build_dir` (what `python -m pipeline` runs), validate optionally."""
    from pipeline.steps.compile import run_compile
    from pipeline.steps.export import run_export
    from pipeline.steps.serialize import run_serialize
    from pipeline.steps.transform import run_transform
    from pipeline.steps.validate import run_validate

    build = Path(build_dir)
    write_json(build / "timings.json", run_compile(cfg, build / "compiled"))
    run_export(cfg, build / "compiled", build / "exported", build / "report.json")
    run_transform(cfg, build / "exported", build / "transformed")
    files = run_serialize(cfg, build / "transformed", build / "program", build / "manifest.json")
    if validate:
        run_validate(cfg, build, build / "timings.json", build / "metrics.json", build / "plot.json")
        files["metrics"] = build / "metrics.json"
    return files
