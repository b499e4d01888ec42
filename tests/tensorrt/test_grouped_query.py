"""Grouped-query attention without repeated key/value heads: the compile-step rewrite computes the
same attention, reads each K/V head once, keeps the token count symbolic, and leaves alone what is
not a head repeat."""

import copy

import pytest
import torch
from torch.export import Dim

from pipeline.lowering.compile import export_method
from pipeline.lowering.grouped_query import share_kv_heads
from pipeline.models.hf import decoder
from tests.helpers import assert_not_degenerate

aten = torch.ops.aten
LAYERS = 2


class Step(torch.nn.Module):
    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, tokens: torch.Tensor, start: torch.Tensor) -> torch.Tensor:
        return self.model.step(tokens, start)  # type: ignore[operator]


def _program(dtype: str, kv_heads: int) -> torch.export.ExportedProgram:
    torch.manual_seed(0)
    model = decoder("llama", 64, dtype=dtype, hidden_size=64, intermediate_size=128, num_hidden_layers=LAYERS,
                    num_attention_heads=8, num_key_value_heads=kv_heads, vocab_size=256, max_position_embeddings=128)
    inputs = (torch.randint(0, 256, (1, 16)), torch.zeros(1, dtype=torch.int64))
    return export_method(Step(model), inputs, ({1: Dim("tokens", min=1, max=64)}, None))


def _repeats(gm: torch.fx.GraphModule) -> int:
    return sum(1 for n in gm.graph.nodes if n.target is aten.expand.default and n.meta["val"].dim() == 5)


@pytest.mark.parametrize("dtype, tolerance", [("float32", 1e-6), ("float16", 1e-3)])
def test_the_rewrite_computes_the_same_attention_from_each_head_once(dtype: str, tolerance: float) -> None:
    program = _program(dtype, kv_heads=2)  # 4 query heads per K/V head
    gm = program.module()
    reference = copy.deepcopy(gm)
    assert _repeats(gm) == 2 * LAYERS
    assert share_kv_heads(gm) == 2 * LAYERS  # q k^T and p v in every layer
    assert _repeats(gm) == 0
    tokens = next(n for n in gm.graph.nodes if n.op == "placeholder" and n.name == "tokens")
    assert not isinstance(tokens.meta["val"].shape[1], int)  # the token count stays symbolic
    prompt, zero = torch.randint(0, 256, (1, 16)), torch.zeros(1, dtype=torch.int64)
    for call in [(prompt, zero), (prompt[:, :1], torch.tensor([16]))]:  # a prompt, then one decode step
        want = reference(*call).float()
        assert_not_degenerate(want)
        got = gm(*call).float()
        assert (got - want).abs().max() <= tolerance * want.abs().max()


def test_attention_without_grouped_heads_is_left_alone() -> None:
    gm = _program("float32", kv_heads=8).module()  # one K/V head per query head: nothing is repeated
    assert share_kv_heads(gm) == 0


class RepeatThenShift(torch.nn.Module):
    """A repeated head set changed per head before the product: not a shared head any more."""

    def __init__(self) -> None:
        super().__init__()
        self.shift = torch.nn.Parameter(torch.randn(1, 4, 8, 16))

    def forward(self, q: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
        k = kv[:, :, None].expand(1, 2, 2, 8, 16).reshape(1, 4, 8, 16) + self.shift
        return q @ k.transpose(-2, -1)


class RepeatPositions(torch.nn.Module):
    """The same unsqueeze and expand, merged into the positions: every head sees its keys twice."""

    def forward(self, q: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
        k = kv[:, :, None].expand(1, 2, 2, 8, 16).reshape(1, 2, 16, 16)
        return q @ k.transpose(-2, -1)


@pytest.mark.parametrize("module, q_heads", [(RepeatThenShift(), 4), (RepeatPositions(), 2)])
def test_what_is_not_a_head_repeat_is_left_alone(module: torch.nn.Module, q_heads: int) -> None:
    inputs = (torch.randn(1, q_heads, 3, 16), torch.randn(1, 2, 8, 16))
    gm = export_method(module, inputs).module()
    assert _repeats(gm) == 1
    assert share_kv_heads(gm) == 0
    torch.testing.assert_close(gm(*inputs), module(*inputs))
