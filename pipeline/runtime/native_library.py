"""The native TensorRT delegate library (`native/`, built by the install into `pipeline/native/`):
where it is, and loading it into this process so that ExecuTorch's runtime has `TensorRTBackend`.

ExecuTorch 1.4.1's Python runtime keeps its backend registry in the QNN backend library that
`_portable_lib` links, and the tensor helpers in `_portable_lib` itself; 1.5's `_C` keeps both in
`executorch/lib/libexecutorch.so`. These are loaded without global symbols, so they are promoted
before the delegate library (whose ExecuTorch symbols are left to the process that loads it) is
opened. TensorRT comes from the installed TensorRT-RTX wheel
unless `PIPELINE_TENSORRT_LIBRARY` names a library.
"""

from __future__ import annotations

import ctypes
import functools
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

from pipeline.errors import RuntimeUnavailableError

LIBRARY = "libpipeline_trt.so"
RUNNER = "pipeline-runner"


def native_dir() -> Path:
    """Where the install put the native files: next to this package, or (an editable install, whose
    Python files stay in the checkout) under `pipeline/native` of the environment's site-packages."""
    here = Path(__file__).resolve().parent / "native"
    for folder in [here, *(Path(p) / "pipeline" / "native" for p in sys.path if p)]:
        if (folder / LIBRARY).is_file():
            return folder
    return here


def library_path() -> Path:
    """The delegate library (`PIPELINE_NATIVE_LIBRARY` overrides).

    Raises:
        RuntimeUnavailableError: it was not built.
    """
    path = Path(os.environ.get("PIPELINE_NATIVE_LIBRARY") or native_dir() / LIBRARY)
    if not path.is_file():
        raise RuntimeUnavailableError(f"the native TensorRT delegate is not built ({path} is missing); install the project "
                                      "with `pip install -e '.[tensorrt-rtx,dev]'`, which builds it")
    return path


def runner_path() -> Path:
    """The Python-free runner executable.

    Raises:
        RuntimeUnavailableError: it was not built.
    """
    path = native_dir() / RUNNER
    if not path.is_file():
        raise RuntimeUnavailableError(f"the native runner is not built ({path} is missing); install the project with "
                                      "`pip install -e '.[tensorrt-rtx,dev]'`, which builds it")
    return path


def tensorrt_library() -> str | None:
    """The TensorRT library the delegate should open: `PIPELINE_TENSORRT_LIBRARY`, else the TensorRT-RTX
    wheel's, else None (the system's search)."""
    if os.environ.get("PIPELINE_TENSORRT_LIBRARY"):
        return os.environ["PIPELINE_TENSORRT_LIBRARY"]
    spec = importlib.util.find_spec("tensorrt_rtx_libs")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        candidate = Path(folder) / "libtensorrt_rtx.so.1"
        if candidate.is_file():
            return str(candidate)
    return None


@functools.cache
def load_backend() -> ctypes.CDLL:
    """The delegate library, loaded (once) into this process's ExecuTorch runtime.

    Raises:
        RuntimeUnavailableError: it is not built, or ExecuTorch's runtime did not register it.
    """
    path = library_path()
    try:
        from pipeline.executorch_api import portable_lib, registered_backends

        _portable_lib = portable_lib()
    except ImportError as exc:  # e.g. a torch other than the one ExecuTorch's wheel was built for
        import torch

        raise RuntimeUnavailableError(f"ExecuTorch's Python runtime does not import here ({exc}; torch {torch.__version__} is "
                                      "installed): install the torch it was built for, or run the program with the native "
                                      "runner (pipeline-runner)") from exc

    et = Path(str(_portable_lib.__file__)).parent.parent.parent
    for lib in (et / "backends" / "qualcomm" / "libqnn_executorch_backend.so", et / "lib" / "libexecutorch.so",
                Path(str(_portable_lib.__file__))):
        try:  # promoted where this runtime loaded it (RTLD_NOLOAD: never loaded here)
            ctypes.CDLL(str(lib), mode=os.RTLD_GLOBAL | os.RTLD_NOLOAD)
        except OSError:
            continue
    backend = ctypes.CDLL(str(path))
    for name in ("pipeline_trt_last_error", "pipeline_trt_library"):
        getattr(backend, name).restype = ctypes.c_char_p
    for name in ("pipeline_trt_bytes_to_device", "pipeline_trt_bytes_to_host"):
        getattr(backend, name).restype = ctypes.c_ulonglong
    backend.pipeline_trt_set_library.argtypes = [ctypes.c_char_p]
    backend.pipeline_trt_set_stream.argtypes = [ctypes.c_void_p]
    found = tensorrt_library()
    if found:
        backend.pipeline_trt_set_library(found.encode())
    if backend.pipeline_trt_registered() != 0 or "TensorRTBackend" not in registered_backends():
        raise RuntimeUnavailableError(f"{path} loaded but ExecuTorch's runtime has no TensorRTBackend (registration "
                                      f"error {backend.pipeline_trt_registered()}); rebuild it against this ExecuTorch")
    return backend


def runner_env() -> dict[str, str]:
    """The environment the runner needs: this one, with `PIPELINE_TENSORRT_LIBRARY` naming the
    TensorRT library when the TensorRT-RTX wheel has it (the bare executable otherwise searches the
    system's library path)."""
    env = dict(os.environ)
    found = tensorrt_library()
    if found:
        env["PIPELINE_TENSORRT_LIBRARY"] = found
    return env


def run_runner(*args: object, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """Run `pipeline-runner ARGS...` (see `native/runner/runner.cpp`), output captured."""
    return subprocess.run([str(runner_path()), *map(str, args)], capture_output=True, text=True, timeout=timeout,
                          env=runner_env())


def main() -> None:
    """`pipeline-runner ...`: the Python-free runner, started with the TensorRT library found."""
    try:
        path = runner_path()
    except RuntimeUnavailableError as exc:
        raise SystemExit(f"pipeline-runner: {exc}") from exc
    os.execve(path, [str(path), *sys.argv[1:]], runner_env())

