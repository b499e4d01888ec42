"""Attention as TensorRT's attention layer: the compile step finds the attention a graph spells out
(transformers' decoders, torch's scaled_dot_product_attention with and without masks, attention
written by hand), computes the same result from the un-repeated K/V heads, leaves alone what is not
an attention whose parts nothing else reads, and never leaves a program needing a kernel for it."""

import copy
import math

import pytest
import torch
from executorch.exir import to_edge_transform_and_lower

from pipeline.config import objects
from pipeline.config.compose import compose, typed
from pipeline.delegate.blob import op_build_info
from pipeline.engine.compile_spec import TensorRTCompileSpec
from pipeline.lowering.compile import compile_program, drop_metadata_asserts, export_method
from pipeline.lowering.fused_attention import fuse_attention
from pipeline.runtime.engine_op import is_engine_call
from tests.helpers import assert_close, assert_not_degenerate
from tests.tensorrt.test_grouped_query import LAYERS, _program, _repeats

F = torch.nn.functional
FUSED = torch.ops.tensorrt.attention.default


def _fused(gm: torch.fx.GraphModule) -> list[torch.fx.Node]:
    return [n for n in gm.graph.nodes if n.target is FUSED]


def _graph(module: torch.nn.Module, inputs: tuple[torch.Tensor, ...]) -> torch.fx.GraphModule:
    """The graph the compile step rewrites (exported, its dtype assertions dropped)."""
    gm = export_method(module, inputs).module()
    drop_metadata_asserts(gm)
    return gm


@pytest.mark.parametrize("dtype, tolerance", [("float32", 1e-6), ("float16", 2e-3)])
def test_a_decoders_attention_fuses_on_its_own_kv_heads(dtype: str, tolerance: float) -> None:
    gm = _program(dtype, kv_heads=2).module()  # 8 query heads, 2 K/V heads
    reference = copy.deepcopy(gm)
    assert fuse_attention(gm) == LAYERS
    assert _repeats(gm) == 0  # the repeated K/V copies are gone
    for node in _fused(gm):
        q, k, v, mask, scale = node.args
        assert q.meta["val"].shape[1] == 8 and k.meta["val"].shape[1] == v.meta["val"].shape[1] == 2
        assert q.meta["val"].dtype == getattr(torch, dtype)  # half precision stays half: no upcast around it
        assert mask.meta["val"].dtype == torch.bool and scale == pytest.approx(1 / math.sqrt(8))
    tokens = next(n for n in gm.graph.nodes if n.op == "placeholder" and n.name == "tokens")
    assert not isinstance(tokens.meta["val"].shape[1], int)
    prompt, zero = torch.randint(0, 256, (1, 16)), torch.zeros(1, dtype=torch.int64)
    for call in [(prompt, zero), (prompt[:, :1], torch.tensor([16]))]:  # a prompt, then one decode step
        want = reference(*call).float()
        assert_not_degenerate(want)
        assert (gm(*call).float() - want).abs().max() <= tolerance * want.abs().max()


class Sdpa(torch.nn.Module):
    def __init__(self, mask: str) -> None:
        super().__init__()
        self.mask = mask

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        keep = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).tril(diagonal=k.shape[-2] - q.shape[-2])
        mask = {"none": None, "bool": keep, "float": torch.zeros(keep.shape, dtype=q.dtype).masked_fill(~keep, -1e4)}[self.mask]
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


class Biased(torch.nn.Module):
    """Written out by hand, T5's way: no scale, a learned bias per head added to the scores."""

    def __init__(self) -> None:
        super().__init__()
        self.bias = torch.nn.Parameter(torch.randn(1, 4, 6, 6))

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return torch.softmax(torch.matmul(q, k.transpose(-1, -2)) + self.bias, dim=-1) @ v


class GroupedBiased(torch.nn.Module):
    """Grouped-query attention (2 K/V heads repeated for 4 query heads, as transformers' `repeat_kv`)
    with a float bias per query head: the converter regroups the bias rows with the query heads."""

    def __init__(self) -> None:
        super().__init__()
        self.bias = torch.nn.Parameter(torch.randn(1, 4, 6, 6))

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        k, v = (x[:, :2, None].expand(x.shape[0], 2, 2, 6, 8).reshape(x.shape[0], 4, 6, 8) for x in (k, v))
        return F.scaled_dot_product_attention(q, k, v, attn_mask=self.bias.to(q.dtype))


class BiasAndMask(torch.nn.Module):
    """T5's way: no scale, a position bias and then a mask added, the softmax taken in fp32 and cast back."""

    def __init__(self) -> None:
        super().__init__()
        self.bias = torch.nn.Parameter(torch.randn(1, 4, 6, 6))

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        keep = torch.ones(6, 6, dtype=torch.bool).tril()
        scores = torch.matmul(q, k.transpose(3, 2)) + self.bias
        scores = scores + torch.zeros(6, 6, dtype=q.dtype).masked_fill(~keep, torch.finfo(q.dtype).min)
        return torch.matmul(torch.softmax(scores.float(), dim=-1).type_as(scores), v)


class UpcastSoftmax(torch.nn.Module):
    """CLIP's way: the softmax asked for in fp32 (a no-op in fp32), a causal mask added."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        keep = torch.ones(6, 6, dtype=torch.bool).tril()
        scores = (q @ k.transpose(-1, -2)) * 0.125 + torch.zeros(6, 6).masked_fill(~keep, float("-inf"))
        return torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype) @ v


class BoolBias(torch.nn.Module):
    """A bool tensor added to the scores adds 0 or 1 (a bias), it masks nothing."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return torch.softmax(q @ k.transpose(-1, -2) + torch.ones(6, 6, dtype=torch.bool).tril(), dim=-1) @ v


class ScaledAfter(torch.nn.Module):
    """The scale on the scores, divided, as older BERT code writes it."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), dim=-1) @ v


@pytest.mark.parametrize("module", [Sdpa("none"), Sdpa("bool"), Sdpa("float"), Biased(), GroupedBiased(), BiasAndMask(),
                                    UpcastSoftmax(), BoolBias(), ScaledAfter()],
                         ids=["sdpa", "sdpa_bool_mask", "sdpa_float_mask", "biased", "grouped_biased", "bias_and_mask",
                              "upcast_softmax", "bool_bias", "scaled_after"])
def test_attention_as_torch_and_by_hand_fuses_and_computes_the_same(module: torch.nn.Module) -> None:
    inputs = tuple(torch.randn(2, 4, 6, 8) for _ in range(3))
    gm = _graph(module, inputs)
    assert fuse_attention(gm) == 1
    (fused,) = _fused(gm)
    assert fused.args[1].meta["val"].shape[1] == (2 if isinstance(module, GroupedBiased) else 4)  # K/V heads once
    torch.testing.assert_close(gm(*inputs), module(*inputs), rtol=1e-5, atol=1e-5)


class ReturnsWeights(torch.nn.Module):
    """The probabilities are an output too: fusing would have to compute them anyway."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        probs = torch.softmax(q @ k.transpose(-2, -1), dim=-1)
        return probs @ v, probs


class ReturnsCastWeights(torch.nn.Module):
    """The probabilities, cast, are an output too."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        probs = torch.softmax(q @ k.transpose(-2, -1), dim=-1).half()
        return probs.float() @ v, probs


class SoftmaxOverHeads(torch.nn.Module):
    """A softmax over another dim than the keys: not attention."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return torch.softmax(q @ k.transpose(-2, -1), dim=1) @ v


class ScaledValues(torch.nn.Module):
    """V scaled before the product scales the output, not the scores."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return torch.softmax(q @ k.transpose(-2, -1), dim=-1) @ (v * 2.0)


@pytest.mark.parametrize("module", [ReturnsWeights(), ReturnsCastWeights(), SoftmaxOverHeads()])
def test_what_is_not_a_self_contained_attention_is_left_alone(module: torch.nn.Module) -> None:
    inputs = tuple(torch.randn(2, 4, 6, 8) for _ in range(3))
    gm = _graph(module, inputs)
    assert fuse_attention(gm) == 0


def test_a_scaling_of_v_stays_outside_the_fused_attention() -> None:
    inputs = tuple(torch.randn(2, 4, 6, 8) for _ in range(3))
    module = ScaledValues()
    gm = _graph(module, inputs)
    assert fuse_attention(gm) == 1
    torch.testing.assert_close(gm(*inputs), module(*inputs), rtol=1e-5, atol=1e-5)


def test_the_compile_option_builds_each_form_in_one_engine() -> None:
    inputs = (torch.randint(0, 256, (1, 16)), torch.zeros(1, dtype=torch.int64))
    layers = {}
    for form in ("fused", "grouped", "as_written"):
        spec = objects.compile_spec(typed(compose(["model=llama_tiny", f"compile.attention={form}"])), "prefill")
        assert spec.attention == form
        compiled = compile_program(_program("float32", kv_heads=2), inputs, spec, "prefill")
        calls = [n for n in compiled.graph.nodes if is_engine_call(n)]
        assert len(calls) == 1
        layers[form] = op_build_info(calls[0].args[2])["num_layers"]
    assert len(set(layers.values())) == 3, layers  # three forms of the attention


def test_a_fused_attention_no_engine_takes_lowers_as_torch_attention() -> None:
    """Where no engine takes it (here: no block is big enough), the program decomposes it again:
    ExecuTorch lowers it with its own kernels, never needing one for `tensorrt::attention`."""
    inputs = tuple(torch.randn(2, 4, 6, 8) for _ in range(3))
    program = compile_program(export_method(Sdpa("bool"), inputs), inputs, TensorRTCompileSpec(min_block_size=10_000))
    assert not any(is_engine_call(n) for n in program.graph.nodes)
    edge = to_edge_transform_and_lower(program)
    assert not [n for n in edge.exported_program().graph.nodes if "tensorrt" in str(n.target)]


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("module", [Sdpa("bool"), Sdpa("float"), Biased(), GroupedBiased(), BiasAndMask()],
                         ids=["bool_mask", "float_mask", "biased", "grouped_biased", "bias_and_mask"])
def test_the_fused_attention_engine_matches_eager_on_gpu(module: torch.nn.Module, precision: str) -> None:
    dtype = torch.float16 if precision == "fp16" else torch.float32
    module = module.to(dtype)
    inputs = tuple(torch.randn(2, 4, 6, 8, dtype=dtype) for _ in range(3))
    program = compile_program(export_method(module, inputs), inputs, TensorRTCompileSpec(precision=precision))
    calls = [n for n in program.graph.nodes if is_engine_call(n)]
    assert len(calls) == 1
    with torch.no_grad():
        want = module(*inputs)
    assert_close(program.module()(*(x.cuda() for x in inputs)), want, precision)
