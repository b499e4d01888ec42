"""Constant folding in the compile step: what models compute from constants in `forward` (position
ids, masks, relative-position tables, standardized weights) becomes a constant before partitioning."""

import pytest
import torch

from pipeline.engine.compile_spec import TensorRTCompileSpec
from pipeline.lowering.compile import compile_method
from pipeline.lowering.constant_fold import fold_constants
from pipeline.runtime.engine_op import is_engine_call
from tests.helpers import assert_close, assert_engines_checked, gpu


class Tables(torch.nn.Module):
    """A relative-position table indexed through a mask built from zeros with ops TensorRT lacks."""

    def __init__(self) -> None:
        super().__init__()
        self.table = torch.nn.Parameter(torch.randn(9, 4), requires_grad=False)
        coords = torch.stack(torch.meshgrid(torch.arange(3), torch.arange(3), indexing="ij")).flatten(1)
        self.register_buffer("index", (coords[:, :, None] - coords[:, None, :]).abs().sum(0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bias = self.table[self.index.flatten()].view(9, 9, 4).permute(2, 0, 1)  # [4, 9, 9]
        mask = torch.zeros(9, 9).index_put_((torch.arange(9), torch.arange(9)), torch.tensor(-1.0))
        return torch.softmax(x + bias + torch.atan2(mask, mask + 2), dim=-1)


def test_constant_subgraphs_fold_away() -> None:
    model = Tables()
    gm = torch.export.export(model, (torch.randn(1, 4, 9, 9),)).run_decompositions().module()
    assert any("atan2" in str(n.target) for n in gm.graph.nodes)
    assert fold_constants(gm) >= 1
    ops = {str(n.target) for n in gm.graph.nodes if n.op == "call_function"}
    assert not any(name in op for op in ops for name in ("atan2", "index_put", "index.Tensor", "arange"))
    x = torch.randn(1, 4, 9, 9)
    torch.testing.assert_close(gm(x), model(x))


def test_folded_model_lowers_to_one_engine() -> None:
    model = Tables()
    x = torch.randn(1, 4, 9, 9)
    program = compile_method(model, (x,))
    calls = [n for n in program.graph.nodes if is_engine_call(n)]
    left = [n for n in program.graph.nodes if n.op == "call_function" and not is_engine_call(n) and "getitem" not in str(n.target)]
    assert len(calls) == 1 and left == []
    assert_engines_checked(program)


@gpu
def test_folded_model_runs_on_the_gpu() -> None:
    model, x = Tables(), torch.randn(1, 4, 9, 9)
    assert_close(compile_method(model, (x,)).module()(x.cuda()), model(x), "fp32")


def test_large_results_stay_operators() -> None:
    class Expand(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("row", torch.randn(1, 4096))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + self.row.expand(8192, 4096).sum(0)  # 128 MiB if folded step by step

    gm = torch.export.export(Expand(), (torch.randn(4096),)).module()
    fold_constants(gm)
    sizes = [getattr(gm, n.target).numel() for n in gm.graph.nodes if n.op == "get_attr"]
    assert max(sizes) <= 1 << 24


class PositionEncoding(torch.nn.Module):
    """XCiT's pattern: a convolution on a grid `forward` computes from constants, added to the input;
    `alone` returns the encoding by itself (the input unread)."""

    def __init__(self, alone: bool = False) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(8, 16, 1)
        self.alone = alone

    def forward(self, x: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        grid = torch.arange(16.0).view(1, 1, 4, 4).expand(1, 8, 4, 4).sin()
        encoding = self.conv(grid)
        return encoding if self.alone else x + encoding


def test_convolutions_on_constants_stay_in_the_engine() -> None:
    model, x = PositionEncoding().eval(), torch.randn(1, 16, 4, 4)
    gm = torch.export.export(model, (x,)).run_decompositions().module()
    fold_constants(gm)
    ops = [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]
    assert ops == ["aten.convolution.default", "aten.add.Tensor"]  # the grid folded, the convolution kept
    program = compile_method(model, (x,))
    assert [n for n in program.graph.nodes if n.op == "call_function" and not is_engine_call(n)
            and "getitem" not in str(n.target)] == []
    assert_engines_checked(program)


@gpu
def test_convolutions_on_constants_run_on_the_gpu() -> None:
    model, x = PositionEncoding().eval(), torch.randn(1, 16, 4, 4)
    assert_close(compile_method(model, (x,)).module()(x.cuda()), model(x), "fp32")


@pytest.mark.parametrize(("alone", "min_block_size"), [(True, 1), (False, 3)], ids=["no-input", "below-min-block"])
def test_convolutions_on_constants_no_engine_takes_with_an_input_are_folded(alone: bool, min_block_size: int) -> None:
    """An engine of the encoding alone would have no input; a block below min_block_size would leave a
    portable convolution recomputing a constant every call."""
    model, x = PositionEncoding(alone).eval(), torch.randn(1, 16, 4, 4)
    program = compile_method(model, (x,), TensorRTCompileSpec(min_block_size=min_block_size))
    assert not any("convolution" in str(n.target) or is_engine_call(n) for n in program.graph.nodes)
    torch.testing.assert_close(program.module()(x), model(x))
