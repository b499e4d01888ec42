"""The kernels' source built for the CPU: `dp_host` and `da_host` run their code thread by thread (lane by
lane), the same code NVRTC compiles to the PTX a program carries."""

from __future__ import annotations

import ctypes
import shutil
import subprocess

import pytest

from pipeline.kernels import ptx


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> ctypes.CDLL:
    if shutil.which("g++") is None:
        pytest.skip("needs g++")
    folder = tmp_path_factory.mktemp("kernels")
    (folder / ptx.NAME).write_text(ptx.source())
    lib = folder / "decode_kernels_host.so"
    subprocess.run(["g++", "-std=c++17", "-O1", "-Wall", "-Wextra", "-Werror", "-x", "c++", "-shared", "-fPIC",
                    str(folder / ptx.NAME), "-o", str(lib)], check=True)
    return ctypes.CDLL(str(lib))
