"""One import shim: the TensorRT Python API from `tensorrt` when installed, else from `tensorrt_rtx`.

Everything else in the project gets TensorRT through `trt()` and never imports either module itself.
"""

from __future__ import annotations

import functools
import importlib
import os
from dataclasses import dataclass
from types import ModuleType

from pipeline.errors import TensorRTUnavailableError

# Order matters: a datacenter install wins over the RTX flavour. PIPELINE_TRT_MODULE pins one.
CANDIDATES = ("tensorrt", "tensorrt_rtx")
PIN_ENV = "PIPELINE_TRT_MODULE"
INSTALL_HINT = (
    "install one of them: `pip install -e '.[tensorrt]'` (TensorRT, datacenter GPUs) or "
    "`pip install -e '.[tensorrt-rtx]'` (TensorRT-RTX, builds engines without a GPU)"
)


@dataclass(frozen=True)
class Flavour:
    """Which TensorRT module is in use and its version."""

    module: str
    version: str

    @property
    def is_rtx(self) -> bool:
        return self.module == "tensorrt_rtx"


@functools.cache
def trt() -> ModuleType:
    """Return the TensorRT module (``tensorrt`` or ``tensorrt_rtx``).

    Raises:
        TensorRTUnavailableError: neither module imports; the message names both install commands.
    """
    pinned = os.environ.get(PIN_ENV)
    candidates = (pinned,) if pinned else CANDIDATES
    failures = []
    for name in candidates:
        try:
            return importlib.import_module(name)
        except Exception as exc:  # a broken install raises more than ImportError (missing .so, driver)
            failures.append(f"{name}: {type(exc).__name__}: {exc}")
    raise TensorRTUnavailableError(
        "TensorRT is not available (tried " + "; ".join(failures) + "); " + INSTALL_HINT
    )


def flavour() -> Flavour:
    """Name and version of the TensorRT module `trt()` returns."""
    mod = trt()
    return Flavour(module=mod.__name__.split(".")[0], version=str(mod.__version__))


def available() -> bool:
    """True when `trt()` would succeed."""
    try:
        trt()
    except TensorRTUnavailableError:
        return False
    return True
