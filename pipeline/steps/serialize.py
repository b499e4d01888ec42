"""The serialize step: the `.pte` (and `.ptd`, ETRecord) of the transformed programs, and its manifest
(what the build is: content hashes, weights, config, toolchain)."""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

from pipeline.config import objects
from pipeline.config.schema import PipelineConfig
from pipeline.delegate import pte
from pipeline.engine import toolchain
from pipeline.errors import ExportError
from pipeline.files import atomic_dir, write_json
from pipeline.lowering.serialize import write_program
from pipeline.runtime import library_kernels
from pipeline.steps.intermediates import load_constants, load_edge
from pipeline.steps.progress import step

log = logging.getLogger("pipeline")


def run_serialize(cfg: PipelineConfig, in_dir: str | Path, program_dir: str | Path,
                  manifest_path: str | Path) -> dict[str, Path]:
    """Write `<name>.pte` (+ `.ptd`, ETRecord) into `program_dir`, one directory that appears
    complete or not at all (so DVC caches every file of the program), and `manifest_path`."""
    methods = list(cfg.model.methods)
    manager = load_edge(methods, in_dir)
    name = cfg.serialize.output_name or cfg.model.name
    with step(f"serialize: {name}.pte"), atomic_dir(program_dir) as tmp:
        written = write_program(manager, tmp / f"{name}.pte", external_data=cfg.serialize.external_data,
                                etrecord=cfg.serialize.etrecord)
        record = manifest(cfg, written, load_constants(in_dir) or {})
        check_kernels(cfg, record["runtime_kernels"])
    files = {kind: Path(program_dir) / path.name for kind, path in written.items()}
    write_json(manifest_path, record)
    return files


def check_kernels(cfg: PipelineConfig, found: Mapping[str, Any]) -> None:
    """Warn when the program calls kernels ExecuTorch's runtime library lacks (`runtime_kernels`).

    Raises:
        ExportError: it does, or that could not be checked, under `serialize.runtime_kernels=error`.
    """
    line = library_kernels.summary(found)
    if line is None:
        return
    if cfg.serialize.runtime_kernels == "error":
        raise ExportError(f"{line} (serialize.runtime_kernels=error; =warn writes the program anyway)")
    log.warning("%s", line)


def manifest(cfg: PipelineConfig, files: Mapping[str, Path], constants: Mapping[str, Any]) -> dict[str, Any]:
    """Content hashes of the outputs and of every named entry in them (engines, external tensors: key,
    file, bytes, SHA-256), of the weight files the program was built from (`weights`, null for
    seeded weights), the composed config and the toolchain: what the build is, and nothing about
    when or from which commit (dvc.lock in git says that), so it caches like the program."""
    program = pte.read(files["pte"], files.get("ptd"))
    return {
        "weights": json.loads(constants[objects.WEIGHTS]) if objects.WEIGHTS in constants else None,
        "files": {kind: {"name": p.name, "sha256": _sha256(p), "bytes": p.stat().st_size} for kind, p in files.items()},
        "named_data": pte.named_entries(program),
        "runtime_kernels": library_kernels.report(program.program),
        "config": asdict(cfg),
        "toolchain": toolchain.record(cfg.compile.target_compute_capabilities),
    }


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()
