"""The toolchain record: what engines depend on besides the config (TensorRT flavour and package
versions, target compute capabilities, torch, torchvision, executorch, `$NVIDIA_TF32_OVERRIDE` where
set (TensorRT-RTX keeps it in the engine: `pipeline/engine/build_env.py`), `$PIPELINE_TOOLCHAIN_EXTRA`).
Read from package metadata alone, without importing torch or TensorRT, so the DVC stage that
writes it on every `dvc repro` takes a fraction of a second."""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import importlib.util
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pipeline.engine import build_env
from pipeline.engine.trt_api import CANDIDATES, PIN_ENV

_PACKAGES = ("torch", "torchvision", "executorch")
# The key under which the DVC stage `toolchain` adds the digests of the files `model.weights` names
# (`pipeline.models.weight_files.digests`), which the compile step checks the files it reads against.
WEIGHTS = "weights"


def record(target_compute_capabilities: Sequence[str] = ()) -> dict[str, Any]:
    """The record; equal records mean equal engines for equal configs."""
    versions = _tensorrt_versions()
    for name in _PACKAGES:
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            versions[name] = importlib.metadata.version(name)
    out: dict[str, Any] = {
        "tensorrt_module": _tensorrt_module(),
        "packages": dict(sorted(versions.items())),
        "target_compute_capabilities": list(target_compute_capabilities),
    }
    out.update(build_env.setting())
    extra = os.environ.get("PIPELINE_TOOLCHAIN_EXTRA")
    if extra:  # what the record cannot see itself, e.g. a container image or driver tag
        out["extra"] = extra
    return out


def source_digest(package: Path) -> str:
    """SHA-256 over the relative paths and contents of every `.py` file under `package`."""
    digest = hashlib.sha256()
    for path in sorted(package.rglob("*.py")):
        digest.update(str(path.relative_to(package)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def _tensorrt_versions() -> dict[str, str]:
    """Every installed `tensorrt*` distribution (flavour, bindings, libraries) and its version, read from
    the names of their `NAME-VERSION.dist-info` folders (the wheel format's), the first on `sys.path`
    winning as at import; no other package's metadata is parsed."""
    out: dict[str, str] = {}
    for entry in sys.path:
        with contextlib.suppress(OSError):
            for item in sorted(os.scandir(entry or "."), key=lambda e: e.name):
                name, _, version = item.name.removesuffix(".dist-info").partition("-")
                if item.name.endswith(".dist-info") and name.lower().startswith("tensorrt") and version:
                    out.setdefault(name.lower(), version)
    return out


def _tensorrt_module() -> str | None:
    """The module `trt_api.trt()` would import (found, not imported)."""
    pinned = os.environ.get(PIN_ENV)
    for name in (pinned,) if pinned else CANDIDATES:
        if importlib.util.find_spec(name) is not None:
            return name
    return None


def calibration_files(compile_section: Mapping[str, Any]) -> list[str]:
    """The calibration files a compile config names (its own and its methods')."""
    sections = [compile_section.get("quantize"), *((o or {}).get("quantize") for o in
                                                   (compile_section.get("per_method") or {}).values())]
    return sorted({q["calibration"] for q in sections if isinstance(q, Mapping) and q.get("calibration")})


def calibration_digests(compile_section: Mapping[str, Any]) -> dict[str, str]:
    """SHA-256 of each calibration file the config names (a missing one: "missing"), for the DVC record
    that makes a changed calibration set rebuild the engines."""
    out = {}
    for path in calibration_files(compile_section):
        p = Path(path)
        out[path] = hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "missing"
    return out
