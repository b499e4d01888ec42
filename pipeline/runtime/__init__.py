"""Our runtime for `.pte` programs: portable operator calls through PyTorch kernels, TensorRT
delegates through the TensorRT runtime on one shared CUDA stream (see `program.py`). `load`,
`Program` and `Method` import torch when first used, so the light modules here (`options`) stay light."""

from typing import Any

__all__ = ["Method", "Program", "load"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from pipeline.runtime import program

        return getattr(program, name)
    raise AttributeError(f"module 'pipeline.runtime' has no attribute {name!r}")
