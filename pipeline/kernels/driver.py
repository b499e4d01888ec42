"""The project's PTX loaded by the CUDA driver (libcuda, through ctypes) and its kernels launched on
PyTorch's current stream: how `pipeline.runtime` and the benchmarks run them."""

from __future__ import annotations

import ctypes
import functools
import hashlib
from collections.abc import Sequence
from typing import Any

import torch

from pipeline.errors import RuntimeUnavailableError
from pipeline.kernels import decode_attention, formats
from pipeline.kernels.formats import PackedWeight


@functools.cache
def _cuda() -> ctypes.CDLL:
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError as exc:
        raise RuntimeUnavailableError(f"the project's kernels need the CUDA driver (libcuda.so.1): {exc}") from exc
    lib.cuGetErrorString.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
    return lib


def _check(status: int, call: str) -> None:
    if status:
        text = ctypes.c_char_p()
        _cuda().cuGetErrorString(status, ctypes.byref(text))
        raise RuntimeUnavailableError(f"{call} failed: {(text.value or b'?').decode()}")


class Module:
    """PTX loaded into the current device's primary context (PyTorch's)."""

    def __init__(self, ptx: bytes) -> None:
        torch.cuda.init()
        torch.cuda.current_stream()  # makes PyTorch's context current on this thread
        self._handle = ctypes.c_void_p()
        error = ctypes.create_string_buffer(4096)
        options = (ctypes.c_int * 2)(5, 6)  # CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES
        values = (ctypes.c_void_p * 2)(ctypes.cast(error, ctypes.c_void_p), ctypes.c_void_p(len(error)))
        status = _cuda().cuModuleLoadDataEx(ctypes.byref(self._handle), ctypes.c_char_p(ptx), 2, options, values)
        if status:
            text = ctypes.c_char_p()
            _cuda().cuGetErrorString(status, ctypes.byref(text))
            raise RuntimeUnavailableError(
                f"this machine's CUDA driver cannot load the program's kernels ({(text.value or b'?').decode()}: "
                f"{error.value.decode(errors='replace').strip()}); run it where the driver supports the PTX "
                "(CUDA 13's: driver 580 or later) or rebuild it without compile.decode_kernels"
            )
        self._functions: dict[str, ctypes.c_void_p] = {}

    def function(self, name: str) -> ctypes.c_void_p:
        if name not in self._functions:
            handle = ctypes.c_void_p()
            _check(_cuda().cuModuleGetFunction(ctypes.byref(handle), self._handle, name.encode()), f"cuModuleGetFunction({name})")
            self._functions[name] = handle
        return self._functions[name]

    def launch(self, name: str, grid: int | tuple[int, int, int], block: int, args: Sequence[Any],
               stream: torch.cuda.Stream | None = None) -> None:
        """Launch `name` on `stream` (default: PyTorch's current one) over `grid` blocks (x, or x, y, z) with
        `args` (ctypes values, in its parameter order)."""
        x, y, z = grid if isinstance(grid, tuple) else (grid, 1, 1)
        pointers = (ctypes.c_void_p * len(args))(*[ctypes.cast(ctypes.byref(a), ctypes.c_void_p) for a in args])
        handle = ctypes.c_void_p((stream or torch.cuda.current_stream()).cuda_stream)
        _check(_cuda().cuLaunchKernel(self.function(name), x, y, z, block, 1, 1, 0, handle, pointers, None), f"cuLaunchKernel({name})")


_LOADED: dict[tuple[int, str], Module] = {}


def load(ptx: bytes | memoryview) -> Module:
    """`ptx` loaded once per device and content."""
    key = (torch.cuda.current_device(), hashlib.sha256(ptx).hexdigest())
    if key not in _LOADED:
        _LOADED[key] = Module(bytes(ptx))
    return _LOADED[key]


def product(module: Module, x: torch.Tensor, weight: PackedWeight, out: torch.Tensor,
            bias: torch.Tensor | None = None, stream: torch.cuda.Stream | None = None) -> torch.Tensor:
    """out[t, n] = x[t, k] @ weight^T (+ bias) with the project's kernel on `stream` (default: PyTorch's
    current one); every tensor on the GPU, fp16, contiguous."""
    tokens = x.shape[0]
    scales = weight.scales.data_ptr() if weight.scales is not None else 0
    args = [ctypes.c_void_p(x.data_ptr()), ctypes.c_void_p(weight.weight.data_ptr()), ctypes.c_void_p(scales),
            ctypes.c_void_p(bias.data_ptr() if bias is not None else 0), ctypes.c_void_p(out.data_ptr()),
            ctypes.c_int(weight.n), ctypes.c_int(weight.k), ctypes.c_int(weight.group)]
    module.launch(formats.kernel_name(weight.format, tokens), formats.grid(weight.n, weight.format), formats.THREADS, args, stream)
    return out


def attention(module: Module, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
              workspace: torch.Tensor, out: torch.Tensor, scale: float, sizes: decode_attention.Sizes,
              stream: torch.cuda.Stream | None = None) -> torch.Tensor:
    """out = the decode attention of q over k and v (`decode_attention.cu`) on `stream` (default: PyTorch's
    current one), its two kernels in turn; every tensor on the GPU, contiguous, of `sizes` (workspace:
    float32 of `sizes.workspace` values)."""
    pointer = lambda t: ctypes.c_void_p(t.data_ptr() if t is not None else 0)  # noqa: E731
    args = [pointer(q), pointer(k), pointer(v), pointer(mask), pointer(workspace), pointer(out),
            *(ctypes.c_int(d) for d in sizes), ctypes.c_float(scale)]
    for name, grid in zip((decode_attention.SPLIT, decode_attention.COMBINE), sizes.grids):
        module.launch(name, grid, decode_attention.THREADS, args, stream)
    return out
