"""Elementwise portable kernels in a row run as one kernel on CUDA (`fused_kernels.py`): which runs
fuse, from a program's plan on the CPU; each op's code against PyTorch's kernel (compiled by g++ on
the CPU, by NVRTC on a GPU); on a GPU, the fused program computes what its kernels did."""

import ctypes
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import torch

from pipeline.config import objects
from pipeline.config.compose import compose, typed
from pipeline.config.targets import ENV
from pipeline.delegate.pte import read
from pipeline.runtime import load
from pipeline.runtime.fused_kernels import _ARITHMETIC, FusedRun, _fused, _Op, plan_runs
from pipeline.runtime.options import RuntimeOptions
from pipeline.runtime.values import materialise
from pipeline.steps import run_all
from tests.helpers import assert_close

GATES = """import torch
class Gates(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b, self.c = (torch.nn.Linear(64, 64) for _ in range(3))
    def forward(self, x):
        y = self.a(x)
        gated = y * torch.nn.functional.hardsigmoid(y)  # add, clamp, div, mul: one kernel
        half = y * 0.5                                  # an output itself: the relu after it is alone
        return self.b(gated), self.c(torch.relu(half)), half
def make():
    return Gates()
"""


def _build(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *overrides: str) -> tuple[Any, dict[str, Path]]:
    (tmp_path / "gates.py").write_text(GATES)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv(ENV, "gates")
    cfg = typed(compose(list(overrides)))
    return cfg, run_all(cfg, tmp_path / "build")  # type: ignore[arg-type]


def _runs(pte: Path) -> tuple[Any, list[FusedRun]]:
    file = read(pte)
    plan = file.program.execution_plan[0]
    values = materialise(plan, file.program, file.named, torch.device("cpu"))
    steps = [None] * sum(len(chain.instructions) for chain in plan.chains)
    return plan, plan_runs(plan, values, steps)


def _ops(plan: Any, run: FusedRun) -> list[str]:
    calls = [i.instr_args for chain in plan.chains for i in chain.instructions]
    return [plan.operators[calls[at].op_index].name.split("::")[1] for at in run.positions]


GATES_BUILD = ("model._target_=gates.make", "compile.torch_executed_ops=[aten.hardsigmoid,aten.mul,aten.relu]")


def test_runs_whose_results_only_the_run_reads_fuse(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _, files = _build(tmp_path, monkeypatch, *GATES_BUILD)
    plan, runs = _runs(files["pte"])
    assert [_ops(plan, run) for run in runs] == [["add", "clamp", "div", "mul"]]
    (run,) = runs
    assert len(run.inputs) == 3 and "float v2 = float(T(v1 / float(in2)));" in run.code, run.code
    assert plan.outputs[2] not in {run.out, *run.inputs}  # `half` is an output: the relu reads it alone


def test_mobilenet_with_hardsigmoid_outside_fuses_each_site(tmp_path: Path) -> None:
    cfg = typed(compose(["model=mobilenet_v3_small", "compile.torch_executed_ops=[aten.hardsigmoid]"]))
    files = run_all(cfg, tmp_path)  # type: ignore[arg-type]
    plan, runs = _runs(files["pte"])
    assert [_ops(plan, run) for run in runs] == [["add", "clamp", "div"]] * 9


@pytest.mark.gpu
@pytest.mark.parametrize("method_graph", [False, True])
def test_fused_kernels_compute_what_the_kernels_did_on_gpu(method_graph: bool, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    cfg, files = _build(tmp_path, monkeypatch, *GATES_BUILD)
    fused = load(files["pte"], options=RuntimeOptions(method_graph=method_graph)).method("forward")
    apart = load(files["pte"], options=RuntimeOptions(method_graph=method_graph, fuse_kernels=False)).method("forward")
    assert sum(type(step).__name__ == "_FusedStep" for step in fused._steps) == 1
    assert not any(type(step).__name__ == "_FusedStep" for step in apart._steps)
    module = objects.model(cfg).cuda()
    for size in (4, 4, 4, 9, 9, 9):
        x = torch.randn(size, 64, device="cuda") * 4  # past hardsigmoid's clamps on both sides
        with torch.no_grad():
            want = module(x)
        got, ref = fused.execute([x]), apart.execute([x])
        for out, kernels, eager in zip(got, ref, want):
            torch.testing.assert_close(out, kernels, rtol=0, atol=0)  # the same arithmetic, the same rounding
            assert_close(out, eager, "fp32")


# Every op the fused kernels compute, with PyTorch's own kernel of it: operands by schema name, tensor
# operands as positions in the inputs, scalars as the literals a program's constants become.
_X, _Y = 0, 1
OPS = {
    "aten::add.out": (lambda x, y: torch.add(x, y, alpha=2), {"self": _X, "other": _Y, "alpha": "2.0f"}),
    "aten::add.Scalar_out": (lambda x, y: torch.add(x, 0.5, alpha=3), {"self": _X, "other": "0.5f", "alpha": "3.0f"}),
    "aten::sub.out": (lambda x, y: torch.sub(x, y, alpha=2), {"self": _X, "other": _Y, "alpha": "2.0f"}),
    "aten::sub.Scalar_out": (lambda x, y: torch.sub(x, 0.5), {"self": _X, "other": "0.5f", "alpha": "1.0f"}),
    "aten::mul.out": (torch.mul, {"self": _X, "other": _Y}),
    "aten::mul.Scalar_out": (lambda x, y: x * 0.25, {"self": _X, "other": "0.25f"}),
    "aten::div.out": (torch.div, {"self": _X, "other": _Y}),
    "aten::div.Scalar_out": (lambda x, y: x / 3.0, {"self": _X, "other": "3.0f"}),
    "aten::clamp.out": (lambda x, y: torch.clamp(x, -1.0, 2.0), {"self": _X, "min": "-1.0f", "max": "2.0f"}),
    "aten::clamp.Tensor_out": (lambda x, y: torch.clamp(x, min=y), {"self": _X, "min": _Y, "max": None}),
    "aten::hardtanh.out": (lambda x, y: torch.nn.functional.hardtanh(x, -0.5, 0.5), {"self": _X, "min_val": "-0.5f", "max_val": "0.5f"}),
    "aten::relu.out": (lambda x, y: torch.relu(x), {"self": _X}),
    "aten::neg.out": (lambda x, y: -x, {"self": _X}),
    "aten::abs.out": (lambda x, y: x.abs(), {"self": _X}),
    "aten::exp.out": (lambda x, y: x.exp(), {"self": _X}),
    "aten::sqrt.out": (lambda x, y: x.sqrt(), {"self": _X}),
    "aten::rsqrt.out": (lambda x, y: x.rsqrt(), {"self": _X}),
    "aten::tanh.out": (lambda x, y: x.tanh(), {"self": _X}),
    "aten::sigmoid.out": (lambda x, y: x.sigmoid(), {"self": _X}),
    "aten::silu.out": (lambda x, y: torch.nn.functional.silu(x), {"self": _X}),
    "aten::hardsigmoid.out": (lambda x, y: torch.nn.functional.hardsigmoid(x), {"self": _X}),
    "aten::hardswish.out": (lambda x, y: torch.nn.functional.hardswish(x), {"self": _X}),
}


def test_every_fused_op_has_a_reference() -> None:
    assert set(OPS) == set(_ARITHMETIC)


# The kernels' code as C++ on the host (float): what NVRTC compiles, less the CUDA-only rsqrtf.
_HOST = """#include <math.h>
inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
"""


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
def test_each_fused_op_computes_what_its_kernel_does_on_cpu(tmp_path: Path) -> None:
    """Each op's code, compiled by g++ for float, against PyTorch's kernel (NaN and clamp edges too)."""
    keys = sorted(OPS)
    runs = [_fused([(0, _Op(key, dict(OPS[key][1]), out=9))]) for key in keys]
    source = _HOST
    for n, run in enumerate(runs):
        source += run.code.replace(" fused(", f" fused{n}(") + "\n"
        args = ", ".join(f"in[{k}][i]" for k in range(len(run.inputs)))
        source += (f'extern "C" void run{n}(const float** in, float* out, int count) '
                   f"{{ for (int i = 0; i < count; ++i) out[i] = fused{n}<float>({args}); }}\n")
    (tmp_path / "ops.cpp").write_text(source)
    subprocess.run(["g++", "-O1", "-shared", "-fPIC", "-o", str(tmp_path / "ops.so"), str(tmp_path / "ops.cpp")], check=True)
    library = ctypes.CDLL(str(tmp_path / "ops.so"))
    x = torch.randn(1000) * 4
    x[:3] = torch.tensor([float("nan"), 0.0, -3.0])
    y = torch.rand(1000) + 0.5
    for n, (key, run) in enumerate(zip(keys, runs)):
        got = torch.empty(1000)
        ins = [(x, y)[i] for i in run.inputs]
        pointers = (ctypes.c_void_p * len(ins))(*[t.data_ptr() for t in ins])
        getattr(library, f"run{n}")(pointers, ctypes.c_void_p(got.data_ptr()), 1000)
        torch.testing.assert_close(got, OPS[key][0](x, y), equal_nan=True, msg=key)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("key", sorted(OPS))
def test_each_fused_op_computes_what_its_kernel_does_on_gpu(key: str, dtype: torch.dtype) -> None:
    reference, operands = OPS[key]
    x = torch.randn(1000, device="cuda", dtype=dtype) * 4
    x[:3] = torch.tensor([float("nan"), 0.0, -3.0])  # NaN passes through; edges of the clamps
    y = torch.rand(1000, device="cuda", dtype=dtype) + 0.5
    run = _fused([(0, _Op(key, dict(operands), out=9))])
    kernel = torch.cuda.jiterator._create_jit_fn(run.code)
    got = kernel(*[(x, y)[i] for i in run.inputs])
    want = reference(x, y)
    torch.testing.assert_close(got, want, equal_nan=True, **({} if dtype == torch.float32 else {"rtol": 1e-3, "atol": 1e-3}))
