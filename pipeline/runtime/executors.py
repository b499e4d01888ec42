"""Which runtime runs a program: `pipeline` (pipeline.runtime, this project's interpreter: engines
on PyTorch's CUDA tensors, method graphs) or `executorch` (ExecuTorch's own runtime with the native
TensorRT delegate, `executorch_runtime.py`). The validate stage (`runtime.executor`), `generate`
(`--runtime`) and the benchmarks pick one by name, and their results say which ran (`describe`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pipeline.errors import ConfigError
from pipeline.runtime.options import EXECUTORS, RuntimeOptions

__all__ = ["EXECUTORS", "describe", "load_with"]


def load_with(executor: str, pte: str | Path, ptd: str | Path | None = None, options: RuntimeOptions | None = None) -> Any:
    """The program loaded by runtime `executor` (both check the files first).

    Raises:
        ConfigError: `executor` names no runtime.
        ArtifactError: a file is malformed or not the program's own.
        RuntimeUnavailableError: the runtime cannot run the program here.
    """
    if executor not in EXECUTORS:
        raise ConfigError(f"no runtime is named {executor!r}; use one of {list(EXECUTORS)}")
    if executor == "executorch":
        from pipeline.runtime import executorch_runtime

        return executorch_runtime.load(pte, ptd, options)
    from pipeline.runtime.program import load

    return load(pte, ptd, options)


def describe(program: Any) -> str:
    """What ran a loaded program, for results: "pipeline.runtime (cuda)", or "executorch
    (TensorRTBackend, <the TensorRT library>)"."""
    from pipeline.runtime.executorch_runtime import ExecuTorchProgram

    if not isinstance(program, ExecuTorchProgram):
        return f"pipeline.runtime ({program.device.type})"
    return f"executorch (TensorRTBackend, {program.backend.pipeline_trt_library().decode() or 'no engine loaded'})"
