"""The toolchain record: what engines depend on besides the config (TensorRT flavour and package
versions, target compute capabilities, torch, torchvision, executorch, `$NVIDIA_TF32_OVERRIDE` where
set (TensorRT-RTX keeps it in the engine: `pipeline/engine/build_env.py`), `$PIPELINE_TOOLCHAIN_EXTRA`).
Read from package metadata alone, without importing torch or TensorRT, so the DVC stage that
writes it on every `dvc repro` takes a fraction of a second."""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pipeline.engine import build_env
from pipeline.engine.trt_api import CANDIDATES, PIN_ENV

_PACKAGES = ("torch", "torchvision", "executorch")
# The key under which the DVC stage `toolchain` adds the digests of the files `model.weights` names
# (`pipeline.models.checkpoint.digests`), which the compile step checks the files it reads against.
WEIGHTS = "weights"


def record(target_compute_capabilities: Sequence[str] = ()) -> dict[str, Any]:
    """The record; equal records mean equal engines for equal configs."""
    versions = {}
    for dist in importlib.metadata.distributions():
        name = str(dist.metadata["Name"] or "").lower().replace("-", "_")
        if name.startswith("tensorrt") or name in _PACKAGES:
            versions[name] = dist.version
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


def _tensorrt_module() -> str | None:
    """The module `trt_api.trt()` would import (found, not imported)."""
    pinned = os.environ.get(PIN_ENV)
    for name in (pinned,) if pinned else CANDIDATES:
        if importlib.util.find_spec(name) is not None:
            return name
    return None
