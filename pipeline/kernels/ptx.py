"""The project's CUDA kernels compiled to PTX with NVRTC, which needs no GPU: a program built on the CPU
carries the PTX and the driver of the machine that runs it loads it (`pipeline.kernels.driver`).

NVRTC and CUDA's headers come with PyTorch's CUDA wheels (`nvidia/cu13/`); `PIPELINE_NVRTC` names
another libnvrtc.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
from importlib import resources
from pathlib import Path

from pipeline.errors import RuntimeUnavailableError

# The kernels' sources, compiled as one text (one PTX module every kernel step of a program names).
SOURCES = ("prelude.cuh", "decode_products.cu", "decode_attention.cu")
NAME = "decode_kernels.cu"  # the text's name in NVRTC's messages
# The virtual architecture the PTX is written for: the driver compiles it for any GPU of compute
# capability 8.0 or later (A100, H100, H200, L40, Blackwell).
ARCH = "compute_80"
_OPTIONS = ("-std=c++17", "--use_fast_math", "-default-device")


def source() -> str:
    """The kernels' CUDA C source (package data), as NVRTC and the tests' host compiler take it."""
    return "\n".join(resources.files("pipeline.kernels").joinpath(name).read_text() for name in SOURCES)


def _cuda_root() -> Path | None:
    try:
        import nvidia  # noqa: PLC0415  (the namespace package of NVIDIA's wheels)
    except ImportError:
        return None
    for base in nvidia.__path__:
        for name in ("cu13", "cu12", "cuda_nvrtc"):
            if (Path(base) / name / "include" / "cuda_fp16.h").exists() or (Path(base) / name / "lib").is_dir():
                return Path(base) / name
    return None


@functools.cache
def _nvrtc() -> ctypes.CDLL:
    names = [os.environ["PIPELINE_NVRTC"]] if os.environ.get("PIPELINE_NVRTC") else []
    root = _cuda_root()
    if root is not None:
        lib = root / "lib"
        # NVRTC opens its builtins by name: load the wheel's first, so the lookup finds it loaded.
        for builtins in sorted(lib.glob("libnvrtc-builtins.so.*")):
            if ".alt." not in builtins.name:
                ctypes.CDLL(str(builtins), mode=ctypes.RTLD_GLOBAL)
        names += sorted(str(p) for p in lib.glob("libnvrtc.so.*"))
    names += ["libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"]
    errors = []
    for name in names:
        try:
            return ctypes.CDLL(name)
        except OSError as exc:
            errors.append(str(exc))
    raise RuntimeUnavailableError(
        "NVRTC (libnvrtc) was not found, so the project's kernels cannot be compiled to PTX; install PyTorch's "
        f"CUDA wheels (they bring nvidia/cu13/lib/libnvrtc.so.13) or set PIPELINE_NVRTC ({'; '.join(errors[-1:])})"
    )


def nvrtc_version() -> str:
    """NVRTC's version ("13.0"), which the build records beside the PTX."""
    major, minor = ctypes.c_int(), ctypes.c_int()
    _nvrtc().nvrtcVersion(ctypes.byref(major), ctypes.byref(minor))
    return f"{major.value}.{minor.value}"


@functools.cache
def compile_ptx(text: str, arch: str = ARCH) -> bytes:
    """`text` (CUDA C) as PTX for `arch`, NUL-terminated as the driver loads it.

    Raises:
        RuntimeUnavailableError: NVRTC is missing, or refused the source (its log in the message).
    """
    lib = _nvrtc()
    program = ctypes.c_void_p()
    _check(lib, lib.nvrtcCreateProgram(ctypes.byref(program), text.encode(), NAME.encode(), 0, None, None), "nvrtcCreateProgram")
    try:
        options = [*_OPTIONS, f"--gpu-architecture={arch}"]
        root = _cuda_root()
        if root is not None and (root / "include").is_dir():
            options.append(f"--include-path={root / 'include'}")
        argv = (ctypes.c_char_p * len(options))(*[o.encode() for o in options])
        status = lib.nvrtcCompileProgram(program, len(options), argv)
        if status:
            size = ctypes.c_size_t()
            lib.nvrtcGetProgramLogSize(program, ctypes.byref(size))
            log = ctypes.create_string_buffer(size.value)
            lib.nvrtcGetProgramLog(program, log)
            raise RuntimeUnavailableError(f"NVRTC could not compile {NAME} for {arch}: {log.value.decode(errors='replace').strip()}")
        size = ctypes.c_size_t()
        _check(lib, lib.nvrtcGetPTXSize(program, ctypes.byref(size)), "nvrtcGetPTXSize")
        ptx = ctypes.create_string_buffer(size.value)
        _check(lib, lib.nvrtcGetPTX(program, ptx), "nvrtcGetPTX")
        return ptx.raw
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(program))


def _check(lib: ctypes.CDLL, status: int, call: str) -> None:
    if status:
        lib.nvrtcGetErrorString.restype = ctypes.c_char_p
        raise RuntimeUnavailableError(f"{call} failed: {lib.nvrtcGetErrorString(status).decode()}")


def kernels_ptx() -> bytes:
    """The kernels' PTX (compiled once a process)."""
    return compile_ptx(source())


def digest(ptx: bytes) -> str:
    """The PTX's SHA-256 (its named-data key derives from it)."""
    return hashlib.sha256(ptx).hexdigest()
