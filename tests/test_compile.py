"""The compile step: engine-bearing ExportedPrograms with one custom-op call per engine."""

import operator
from pathlib import Path

import pytest
import torch
from torch.export import Dim

from pipeline.delegate.blob import CHANNELS_LAST, decode_op_metadata
from pipeline.engine.compile_spec import TensorRTCompileSpec
from pipeline.errors import CompileSpecError, RuntimeUnavailableError
from pipeline.lowering.compile import compile_method
from pipeline.models.decoder import MethodView, tiny_decoder
from pipeline.runtime.engine_op import is_engine_call
from tests.helpers import GPU, MIXED_SPEC, MODEL_TOLERANCE, Mixed, assert_close, assert_engines_checked, gpu
from tests.helpers import MIXED_INPUT as X


def _calls(program: torch.export.ExportedProgram) -> list[torch.fx.Node]:
    return [n for n in program.graph.nodes if is_engine_call(n)]


def test_engines_are_op_calls_with_constant_payloads(tmp_path: Path) -> None:
    program = compile_method(Mixed(), (X,), MIXED_SPEC)
    calls = _calls(program)
    assert len(calls) == 3  # conv1d and cumsum split the graph
    buffers = program.graph_signature.inputs_to_buffers
    for call in calls:
        engine = program.state_dict[buffers[call.args[1].name]]
        assert engine.dtype == torch.uint8 and engine.numel() > 1000
    left = {str(n.target) for n in program.graph.nodes if n.op == "call_function" and not is_engine_call(n)}
    assert "aten.cumsum.default" in left and "aten.convolution.default" in left
    torch.export.save(program, tmp_path / "mixed.pt2")
    loaded = torch.export.load(tmp_path / "mixed.pt2")
    assert len(_calls(loaded)) == 3


def test_dynamic_dims_stay_shared_and_output_shapes_follow_inputs() -> None:
    model = tiny_decoder()
    tokens = torch.randint(0, 256, (1, 8))
    _, keys, values = model.prefill(tokens)
    cache = Dim("cache", min=1, max=100)
    program = compile_method(MethodView(model, "decode"), (tokens[:, :1], torch.tensor([8]), keys, values),
                             dynamic_shapes=(({}, {}, {3: cache}, {3: cache}),), method="decode")
    (call,) = _calls(program)
    meta, shapes = decode_op_metadata(call.args[2])
    assert shapes[1][3].endswith("+ 1")  # the grown cache is one longer than the input cache
    placeholders = {n.name: n for n in program.graph.nodes if n.op == "placeholder"}
    k, v = (placeholders[name].meta["val"].shape[3] for name in program.graph_signature.user_inputs[2:])
    assert str(k) == str(v) and not isinstance(k, int)
    lo, hi = (int(b) for b in (program.range_constraints[k.node.expr].lower, program.range_constraints[k.node.expr].upper))
    assert (lo, hi) == (1, 100)
    assert meta.inputs and all(b.dtype in ("float32", "int64") for b in meta.io_bindings)


class SizeTwice(torch.nn.Module):
    """The token count used on both sides of an op left outside: the second engine would take it as
    an input (a number, which engines do not take) where it computes it from its own inputs."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[1]
        y = (x * torch.arange(n).float()[:, None]).relu()
        return y * torch.full((2, n, 4), 2.0) + torch.arange(2 * n + 1)[:n].float()[:, None]


def _size_twice() -> torch.export.ExportedProgram:
    return compile_method(SizeTwice(), (torch.randn(2, 7, 4),), TensorRTCompileSpec(torch_executed_ops=("aten.relu.default",)),
                          dynamic_shapes=({1: Dim("tokens", min=1, max=64)},))


def test_a_size_two_engines_use_is_computed_in_each() -> None:
    program = _size_twice()
    calls = _calls(program)
    assert len(calls) == 2
    for call in calls:
        assert all(isinstance(arg.meta["val"], torch.Tensor) for arg in call.args[0])
    assert_engines_checked(program)


@gpu
def test_a_size_two_engines_use_is_computed_in_each_on_the_gpu() -> None:
    x = torch.randn(2, 11, 4)
    assert_close(_size_twice().module()(x.cuda()), SizeTwice()(x), "fp32")


class Gated(torch.nn.Module):
    """Squeeze-and-excitation with its gate left outside (`torch_executed_ops=[aten.hardsigmoid]`): the
    feature map passes from the first engine to the second only; the second gate reads a whole map,
    and the program returns one (those stay in the program's order)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = torch.nn.Conv2d(3, 16, 3, padding=1)
        self.conv2 = torch.nn.Conv2d(16, 16, 3, padding=1)
        self.conv3 = torch.nn.Conv2d(16, 8, 1)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = torch.relu(self.conv1(x))
        gate = torch.nn.functional.hardsigmoid(y.mean((2, 3), keepdim=True))
        z = self.conv2(y * gate)
        return self.conv3(torch.nn.functional.hardsigmoid(z)), z


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])  # TensorRT's HWC; HWC8 (16 channels)
def test_values_only_engines_touch_are_held_channels_last(dtype: torch.dtype) -> None:
    model, x = Gated().eval().to(dtype), torch.randn(1, 3, 12, 10, dtype=dtype)
    program = compile_method(model, (x,), TensorRTCompileSpec(torch_executed_ops=("aten.hardsigmoid",)))
    assert_engines_checked(program, "fp32" if dtype == torch.float32 else "fp16")
    calls = _calls(program)
    assert len(calls) == 3
    layouts: dict[str, set[str]] = {}  # program value -> the layouts its bindings give it
    for call in calls:
        meta, _ = decode_op_metadata(call.args[2])
        results = [u for u in call.users if u.target is operator.getitem]
        for binding, value in zip(meta.inputs, call.args[0]):
            layouts.setdefault(value.name, set()).add(binding.layout)
        for user in results:
            layouts.setdefault(user.name, set()).add(meta.outputs[user.args[1]].layout)
    held = {name for name, kinds in layouts.items() if CHANNELS_LAST in kinds}
    assert all(len(kinds) == 1 for kinds in layouts.values()), layouts  # writer and readers agree
    nodes = {n.name: n for n in program.graph.nodes}
    (y,) = held  # the first feature map: the gate's mean is 1 x 1, the second map reaches a kernel and the output
    assert tuple(nodes[y].meta["val"].shape) == (1, 16, 12, 10)
    assert all(is_engine_call(u) for u in nodes[y].users)


@gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_values_only_engines_touch_run_channels_last_on_the_gpu(dtype: torch.dtype) -> None:
    model, x = Gated().eval().to(dtype), torch.randn(1, 3, 12, 10, dtype=dtype)
    program = compile_method(model, (x,), TensorRTCompileSpec(torch_executed_ops=("aten.hardsigmoid",)))
    with torch.no_grad():
        want = model.float()(x.float())
    for got, ref in zip(program.module()(x.cuda()), want):  # TensorRT-RTX's fp32 convolutions: TF32's error
        assert_close(got.float(), ref, "fp32" if dtype == torch.float32 else "fp16", MODEL_TOLERANCE)


def test_a_profile_naming_no_dynamic_dim_is_one_line() -> None:
    batch = Dim("batch", min=1, max=8)
    spec = TensorRTCompileSpec(profiles=({"s999": (1, 1, 1)},))
    with pytest.raises(CompileSpecError, match=r"^compile profiles\[0\] names 's999', which is not a dynamic dim of the "
                                               r"program \(its symbolic dims: \['s\d+'\]\)$"):
        compile_method(torch.nn.Linear(4, 4), (torch.randn(2, 4),), spec, dynamic_shapes=({0: batch},))


@pytest.mark.skipif(GPU, reason="checks the CPU error message")
def test_running_without_gpu_names_what_is_needed() -> None:
    program = compile_method(torch.nn.Linear(4, 4), (torch.randn(2, 4),))
    with pytest.raises(RuntimeUnavailableError, match="CUDA GPU"):
        program.module()(torch.randn(2, 4))


@pytest.mark.skipif(not GPU, reason="needs CUDA and TensorRT")
def test_engine_bearing_program_runs_in_pytorch_on_gpu() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 8)).eval()
    x = torch.randn(4, 16)
    program = compile_method(model, (x,), TensorRTCompileSpec())
    out = program.module()(x.cuda())
    with torch.no_grad():
        assert_close(out, model(x), "fp32")
