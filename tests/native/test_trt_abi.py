"""The native delegate's TensorRT declarations (`native/trt/abi.h`) call the virtual-table slots
that NVIDIA's own TensorRT-RTX bindings call, method by method: both run against a stand-in
library that reports slots (`native/tests/vtable_spy.cpp`), so no GPU is needed, and a TensorRT-RTX
upgrade that moves a method fails here rather than in a user's process."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

NATIVE = Path(__file__).resolve().parents[2] / "native"
# The fake objects the spy hands out: the runtime's slot 3 makes an engine, the engine's 47 a
# context and 48 a runtime config.
RETURNS = "1:3=2,2:47=3,2:48=4"

# Each method the probe calls, as the Python bindings spell the same call.
PYTHON_CALLS = {
    "deserialize_cuda_engine": "e = rt.deserialize_cuda_engine(b'0123456789abcdef')",
    "num_optimization_profiles": "e.num_optimization_profiles",
    "engine.get_tensor_shape": "e.get_tensor_shape('x')",
    "get_tensor_dtype": "e.get_tensor_dtype('x')",
    "get_tensor_mode": "e.get_tensor_mode('x')",
    "get_tensor_profile_shape": "e.get_tensor_profile_shape('x', 0)",
    "num_io_tensors": "e.num_io_tensors",
    "get_tensor_name": "e.get_tensor_name(0)",
    "create_runtime_config": "rc = e.create_runtime_config()",
    "kernel_specialization=": ("rc.dynamic_shapes_kernel_specialization_strategy = "
                               "trt.DynamicShapesKernelSpecializationStrategy.EAGER"),
    "cuda_graph_strategy=": "rc.cuda_graph_strategy = trt.CudaGraphStrategy.WHOLE_GRAPH_CAPTURE",
    "create_execution_context(rc)": "c = e.create_execution_context(rc)",
    "all_binding_shapes_specified": "c.all_binding_shapes_specified",
    "set_optimization_profile_async": "c.set_optimization_profile_async(0, 0)",
    "set_input_shape": "c.set_input_shape('x', (2, 3))",
    "context.get_tensor_shape": "c.get_tensor_shape('x')",
    "set_tensor_address": "c.set_tensor_address('x', 1234)",
    "execute_async_v3": "c.execute_async_v3(0)",
}

ORACLE = """
import os, sys
import tensorrt_rtx as trt
rt = trt.Runtime(trt.Logger(trt.Logger.ERROR))
env = {"trt": trt, "rt": rt}
for name, statement in zip(sys.argv[1::2], sys.argv[2::2]):
    os.write(2, f"CALL {name}\\n".encode())
    try:
        exec(statement, env)
    except Exception as exc:
        os.write(2, f"RAISED {type(exc).__name__}\\n".encode())
os.write(2, b"CALL end\\n")
os._exit(0)
"""


def first_slots(log: str) -> dict[str, str]:
    """The first slot reported after each `CALL name` line: name -> "kind slot"."""
    out: dict[str, str] = {}
    name = None
    for line in log.splitlines():
        if line.startswith("CALL "):
            name = line[5:]
        elif name is not None and (m := re.match(r"SPY (\w+ \d+)$", line)):
            out.setdefault(name, m.group(1))
            name = None
    return out


@pytest.fixture(scope="module")
def spy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("g++") is None:
        pytest.skip("needs g++")
    out = tmp_path_factory.mktemp("abi")
    lib, probe = out / "libspy.so", out / "probe"
    source = NATIVE / "tests" / "vtable_spy.cpp"
    subprocess.run(["g++", "-std=c++17", "-O2", "-shared", "-fPIC", str(source), "-o", str(lib)], check=True)
    subprocess.run(["g++", "-std=c++17", "-O2", "-Wall", "-Werror", str(NATIVE / "tests" / "abi_probe.cpp"), str(source),
                    "-o", str(probe)], check=True)
    return out


def test_declarations_call_the_slots_of_nvidias_bindings(spy: Path) -> None:
    pytest.importorskip("tensorrt_rtx")
    env = {**os.environ, "SPY_RETURN": RETURNS}
    ours = subprocess.run([str(spy / "probe")], env=env, capture_output=True, text=True, timeout=60)
    assert ours.returncode == 0, ours.stderr
    args = [x for name, statement in PYTHON_CALLS.items() for x in (name, statement)]
    theirs = subprocess.run([sys.executable, "-c", ORACLE, *args], env={**env, "LD_PRELOAD": str(spy / "libspy.so")},
                            capture_output=True, text=True, timeout=120)
    # A binding may raise after its call on the spy's zero results (an empty shape, a refused
    # profile): the slot it called is already on record.
    mine, nvidia = first_slots(ours.stderr), first_slots(theirs.stderr)
    assert set(mine) == set(PYTHON_CALLS), f"the probe calls {sorted(mine)}"
    assert mine == nvidia


def test_the_delegate_loads_only_verified_versions(spy: Path) -> None:
    """The delegate's allowlist (abi.h's kVerified) holds the TensorRT-RTX version the test above
    ran against, and nothing wider than one minor release: a library it was not checked on is
    refused before a slot is called."""
    import ctypes

    libs = pytest.importorskip("tensorrt_rtx_libs")
    version = ctypes.CDLL(str(Path(list(libs.__path__)[0]) / "libtensorrt_rtx.so.1")).getInferLibVersion()
    ranges = [tuple(map(int, line.split())) for line in
              subprocess.run([str(spy / "probe"), "--verified"], capture_output=True, text=True, check=True).stdout.splitlines()]
    assert any(first <= version <= last for first, last in ranges), (version, ranges)
    assert all(last - first < 100 and first // 100 == last // 100 for first, last in ranges)


def test_a_moved_slot_is_seen(spy: Path) -> None:
    """The comparison has teeth: the spy tells slots apart, and the probe's log names every call."""
    ours = subprocess.run([str(spy / "probe")], env={**os.environ, "SPY_RETURN": RETURNS}, capture_output=True,
                          text=True, timeout=60)
    slots = first_slots(ours.stderr)
    assert slots["deserialize_cuda_engine"] == "runtime 3"
    assert len(set(slots.values())) == len(slots)


def test_the_real_library_takes_our_logger_and_refuses_a_bad_engine(tmp_path: Path) -> None:
    """Through abi.h, TensorRT-RTX itself (no GPU needed): the runtime is made with the project's
    logger, which receives TensorRT's own error when bytes that are not an engine are deserialized;
    the engine comes back null and the runtime is destroyed cleanly."""
    if shutil.which("g++") is None:
        pytest.skip("needs g++")
    libs = pytest.importorskip("tensorrt_rtx_libs")
    library = Path(list(libs.__path__)[0]) / "libtensorrt_rtx.so.1"
    probe = tmp_path / "library_probe"
    subprocess.run(["g++", "-std=c++17", "-O2", "-Wall", "-Werror", str(NATIVE / "tests" / "library_probe.cpp"), "-ldl",
                    "-o", str(probe)], check=True)
    run = subprocess.run([str(probe), str(library)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert lines[0].endswith(" runtime 1") and lines[1:] == ["engine 0", "destroyed"], run.stdout
    errors = [line for line in run.stderr.splitlines() if line.startswith("LOG 1 ")]
    assert any("deserializeCudaEngine" in line for line in errors), run.stderr
