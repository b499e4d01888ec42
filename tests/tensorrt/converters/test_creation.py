"""arange up to a dynamic size (the positions of a variable-length input, as a decoder's prefill
computes them) becomes a fill layer inside the engine; a float one stays out, with its reason.
full and full_like of a dynamic shape (a mask over the tokens, the unit magnitudes of rotary angles)
are one element broadcast."""

from typing import Any

import pytest
import torch
from torch.export import Dim

from pipeline.engine.compile_spec import TensorRTCompileSpec
from pipeline.lowering.compile import compile_method
from pipeline.runtime.engine_op import is_engine_call
from tests import helpers
from tests.helpers import Fn, assert_close, assert_engines_checked, check_converter, lower

TOKENS = torch.randint(0, 50, (1, 7))
CASES = {
    "positions": lambda m, x: x + torch.arange(x.shape[1]),
    "offset": lambda m, x: x[:, 2:] * torch.arange(2, x.shape[1]),
    "int32": lambda m, x: x.to(torch.int32) - torch.arange(x.shape[1], dtype=torch.int32),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_dynamic_arange_builds_engine(name: str) -> None:
    check_converter(Fn(CASES[name]), (TOKENS,), dynamic_shapes=(({1: Dim("tokens", min=4, max=64)},),))


def test_float_dynamic_arange_is_refused_with_its_reason() -> None:
    _, partitioner = lower(Fn(lambda m, x: x * torch.arange(x.shape[1], dtype=torch.float32)), (torch.randn(1, 7),),
                           TensorRTCompileSpec(), dynamic_shapes=(({1: Dim("n", min=3, max=64)},),))
    reasons = {r["op"]: r["reason"] for r in partitioner.record.refused.values()}
    assert reasons.get("aten.arange.start_step") == "an arange up to a dynamic size must be of integers", reasons


@pytest.mark.parametrize("fill", {
    "full_like": lambda m, x: x * torch.full_like(x, 3.0) + torch.ones_like(x),
    "full": lambda m, x: x * torch.full((x.shape[0], x.shape[1], 1), 3.0) + torch.ones(x.shape[1], 4),
}.items(), ids=lambda item: item[0])
def test_a_fill_of_a_dynamic_shape_builds_engine(fill: tuple[str, Any]) -> None:
    check_converter(Fn(fill[1]), (torch.randn(2, 7, 4),), dynamic_shapes=(({1: Dim("tokens", min=1, max=64)},),))


def test_an_empty_buffer_written_whole_stays_in_the_engine() -> None:
    """`empty` (memory written before it is read: DeepSeek-V3.2's indexer scores) over a dynamic size,
    then written: one engine, the written values."""
    module = Fn(lambda m, x: torch.empty(x.shape[0], x.shape[1], 4).copy_(x) * 2)
    x = torch.randn(2, 7, 4)
    program = compile_method(module, (x,), dynamic_shapes=(({1: Dim("tokens", min=1, max=64)},),))
    assert [str(n.target) for n in program.graph.nodes if n.op == "call_function" and not is_engine_call(n)
            and "getitem" not in str(n.target)] == []
    assert_engines_checked(program)
    if helpers.CHECK_ON == "gpu":  # [gpu]: the engine itself
        x = torch.randn(2, 11, 4)
        assert_close(program.module()(x.cuda()), module(x), "fp32")


class Positions(torch.nn.Module):
    """Positions start .. start + T - 1 from numbers read out of a tensor, as TrOCR computes them from
    its cache's length (the end read on its own: the size is `end - start`, which export asserts is T)."""

    def forward(self, x: torch.Tensor, start: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(start[0].item(), (start[0] + x.shape[1]).item())
        return x * 2 + positions[None, :, None]


def test_positions_from_numbers_read_out_of_a_tensor_stay_in_the_engine() -> None:
    x, start = torch.randn(1, 7, 4), torch.tensor([3])
    program = compile_method(Positions(), (x, start), dynamic_shapes=({1: Dim("tokens", min=1, max=64)}, None))
    outside = [str(n.target) for n in program.graph.nodes if n.op == "call_function" and not is_engine_call(n)
               and "getitem" not in str(n.target)]
    assert outside == [], outside  # the numbers, and the assertions only they fed, are gone from outside
    assert_engines_checked(program)
    if helpers.CHECK_ON == "gpu":  # [gpu]: the engine itself
        x, start = torch.randn(1, 11, 4), torch.tensor([5])
        assert_close(program.module()(x.cuda(), start.cuda()), Positions()(x, start), "fp32")


def test_a_number_the_op_outside_reads_is_read_outside() -> None:
    """With the positions' arange kept out of TensorRT, the numbers it reads are read outside too (an
    engine returns tensors), and the engines take the rest."""
    x, start = torch.randn(1, 7, 4), torch.tensor([3])
    spec = TensorRTCompileSpec(torch_executed_ops=("aten.arange.start_step",))
    program = compile_method(Positions(), (x, start), spec, dynamic_shapes=({1: Dim("tokens", min=1, max=64)}, None))
    outside = {str(n.target) for n in program.graph.nodes if n.op == "call_function" and not is_engine_call(n)}
    assert {"aten._local_scalar_dense.default", "aten.arange.start_step"} <= outside, outside
    assert_engines_checked(program)
    if helpers.CHECK_ON == "gpu":  # [gpu]: the engine itself
        x, start = torch.randn(1, 11, 4), torch.tensor([5])
        assert_close(program.module()(x.cuda(), start.cuda()), Positions()(x, start), "fp32")
