"""The four build steps, each reading its inputs from disk and writing complete outputs:
compile (-> .pt2 per method) -> export (-> lowered Edge programs + report.json) -> transform
(-> transformed Edge programs) -> serialize (-> .pte, .ptd, manifest.json). DVC stages and the
in-process Hydra app both call these."""

from __future__ import annotations

import hashlib
import logging
import os
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from pipeline.compile import compile_method
from pipeline.config import objects
from pipeline.export import export, write_program
from pipeline.files import atomic_dir, write_json
from pipeline.intermediates import load_edge, load_exported, save_edge, save_exported
from pipeline.tensorrt.trt_api import flavour

log = logging.getLogger("pipeline")


def toolchain(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """What an engine depends on besides the params: TensorRT flavour and version, targets, torch,
    executorch, and `$PIPELINE_TOOLCHAIN_EXTRA` when set."""
    import executorch.version as et_version

    trt = flavour()
    record = {
        "tensorrt_module": trt.module,
        "tensorrt_version": trt.version,
        "target_compute_capabilities": list(cfg["compile"].get("target_compute_capabilities") or []),
        "torch": torch.__version__,
        "executorch": getattr(et_version, "__version__", "unknown"),
    }
    extra = os.environ.get("PIPELINE_TOOLCHAIN_EXTRA")
    if extra:  # what the record cannot see itself, e.g. a container image or driver tag
        record["extra"] = extra
    return record


def run_compile(cfg: Mapping[str, Any], out_dir: str | Path) -> None:
    """Compile every method into `<out_dir>/<method>.pt2`."""
    model = objects.model(cfg)
    with atomic_dir(out_dir) as tmp:
        for method, spec in cfg["model"]["methods"].items():
            start = time.perf_counter()
            log.info("compile: method %r of %s", method, cfg["model"]["name"])
            program = compile_method(
                objects.method_module(model, spec), objects.example_inputs(spec, cfg["model"]["seed"]),
                objects.compile_spec(cfg, method), objects.dynamic_shapes(spec, spec.get("function", "forward")), method,
            )
            save_exported(program, tmp / f"{method}.pt2")
            log.info("compile: method %r done in %.1f s", method, time.perf_counter() - start)


def run_export(cfg: Mapping[str, Any], compiled: str | Path, out_dir: str | Path, report: str | Path) -> None:
    """Lower the compiled methods (TensorRT first, then the configured chain) into Edge programs."""
    methods = list(cfg["model"]["methods"])
    programs = {m: load_exported(Path(compiled) / f"{m}.pt2") for m in methods}
    manager = export(programs, partitioners={m: objects.partitioners(cfg, m) for m in methods},
                     compile_specs={m: objects.compile_spec(cfg, m) for m in methods})
    with atomic_dir(out_dir) as tmp:
        save_edge(manager, methods, tmp)
    write_json(report, manager.tensorrt_report)  # type: ignore[attr-defined]


def run_transform(cfg: Mapping[str, Any], in_dir: str | Path, out_dir: str | Path) -> None:
    """Apply the configured Edge passes per method."""
    methods = list(cfg["model"]["methods"])
    manager = load_edge(methods, in_dir)
    passes = {m: objects.transform_passes(cfg, m) for m in methods}
    if any(passes.values()):
        manager = manager.transform(passes)
    with atomic_dir(out_dir) as tmp:
        save_edge(manager, methods, tmp)


def run_serialize(cfg: Mapping[str, Any], in_dir: str | Path, program_dir: str | Path,
                  manifest_path: str | Path) -> dict[str, Path]:
    """Write `<name>.pte` (+ `.ptd`, ETRecord) into `program_dir`, one directory that appears
    complete or not at all (so DVC caches every file of the program), and `manifest_path`."""
    methods = list(cfg["model"]["methods"])
    manager = load_edge(methods, in_dir)
    name = cfg["serialize"].get("output_name") or cfg["model"]["name"]
    with atomic_dir(program_dir) as tmp:
        written = write_program(manager, tmp / f"{name}.pte", external_data=bool(cfg["serialize"].get("external_data")),
                                etrecord=bool(cfg["serialize"].get("etrecord")))
        record = manifest(cfg, written)
    files = {kind: Path(program_dir) / path.name for kind, path in written.items()}
    write_json(manifest_path, record)
    return files


def manifest(cfg: Mapping[str, Any], files: Mapping[str, Path]) -> dict[str, Any]:
    """Content hashes of the outputs, the composed config, toolchain versions and the git revision."""
    return {
        "files": {kind: {"name": p.name, "sha256": _sha256(p), "bytes": p.stat().st_size} for kind, p in files.items()},
        "config": dict(cfg),
        "toolchain": toolchain(cfg),
        "git_revision": _git_revision(),
    }


def run_validate(cfg: Mapping[str, Any], program_dir: str | Path, metrics: str | Path) -> dict[str, Any]:
    """Run the built program (in `program_dir`) against eager PyTorch and write `metrics`."""
    from pipeline.validate import validate_program

    name = cfg["serialize"].get("output_name") or cfg["model"]["name"]
    pte = Path(program_dir) / f"{name}.pte"
    ptd = pte.with_suffix(".ptd")
    result = validate_program(cfg, pte, ptd if ptd.exists() else None)
    write_json(metrics, result)
    return result


def run_all(cfg: Mapping[str, Any], build_dir: str | Path, validate: bool = False) -> dict[str, Path]:
    """The steps in-process into `build_dir` (what `python -m pipeline` runs), validate optionally."""
    build = Path(build_dir)
    run_compile(cfg, build / "compiled")
    run_export(cfg, build / "compiled", build / "exported", build / "report.json")
    run_transform(cfg, build / "exported", build / "transformed")
    files = run_serialize(cfg, build / "transformed", build / "program", build / "manifest.json")
    if validate:
        run_validate(cfg, build / "program", build / "metrics.json")
        files["metrics"] = build / "metrics.json"
    return files


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _git_revision() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
