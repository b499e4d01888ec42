"""Our runtime for `.pte` programs: portable operator calls through PyTorch kernels, TensorRT
delegates through the TensorRT runtime on one shared CUDA stream (see `program.py`)."""

from pipeline.runtime.program import Method, Program, load

__all__ = ["Method", "Program", "load"]
