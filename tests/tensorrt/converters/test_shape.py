"""Shape converters: view/reshape, permute, transpose, expand, squeeze/unsqueeze, flatten, cat,
slice, select, pixel_shuffle, unfold; and the same with a dynamic batch dim."""

import pytest
import torch
from torch.export import Dim

from pipeline.engine.compile_spec import TensorRTCompileSpec
from pipeline.engine.support import refusal_reason
from tests.helpers import Fn, check_converter

torch.manual_seed(0)
X = torch.randn(2, 3, 4, 6)

CASES = {
    "flip": lambda m, x: x.flip(-1, 1) * 2,
    "view": lambda m, x: x.view(6, 24) * 2,
    "reshape_infer": lambda m, x: x.reshape(2, -1) * 2,
    "permute": lambda m, x: x.permute(0, 2, 3, 1) * 2,
    "transpose": lambda m, x: x.transpose(1, 3) * 2,
    "expand": lambda m, x: x[:, :1].expand(2, 5, 4, 6) * 2,
    "squeeze": lambda m, x: x[:, :1].squeeze(1) * 2,
    "unsqueeze": lambda m, x: x.unsqueeze(2) * 2,
    "flatten": lambda m, x: torch.flatten(x, 1) * 2,
    "cat": lambda m, x: torch.cat([x, x * 2], dim=1),
    "slice": lambda m, x: x[:, 1:, ::2, -3:] * 2,
    "select": lambda m, x: x[:, -1] * 2,
    "pixel_shuffle": lambda m, x: torch.pixel_shuffle(x.reshape(2, 12, 2, 3), 2) * 2,
    "t": lambda m, x: x[0, 0].t() * 2,
    "split": lambda m, x: torch.split(x, [1, 2], dim=1)[1] * 2,
    "chunk": lambda m, x: sum(torch.chunk(x, 3, dim=3)),
    "unfold": lambda m, x: x.unfold(3, 3, 2) * 2,  # windows overlap; the last element is left out
    "unfold_middle_dim": lambda m, x: x.unfold(1, 2, 1).sum(-1),
    "unfold_negative_dim": lambda m, x: x.unfold(-2, 2, 2) * 2,
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_builds_engine(name: str) -> None:
    check_converter(Fn(CASES[name]), (X,))


DYNAMIC = {
    "view": lambda m, x: x.view(x.shape[0], -1) * 2,
    "flatten": lambda m, x: torch.flatten(x, 1) * 2,
    "unsqueeze_squeeze": lambda m, x: x.unsqueeze(1).squeeze(1) * 2,
    "expand": lambda m, x: x[:, :1].expand(-1, 3, 4, 6) * 2,
    "slice": lambda m, x: x[:, 1:, ::2] * 2,
    # a bound the batch gives (GPT-Neo's causal mask: the last T rows of a fixed one)
    "slice_symbolic_bound": lambda m, x: x * torch.arange(16.0)[16 - x.shape[0]:].reshape(-1, 1, 1, 1),
    "select": lambda m, x: x[:, 0] * 2,
    "cat": lambda m, x: torch.cat([x, x], dim=0) * 2,
    "unfold": lambda m, x: x.unfold(3, 2, 2) * 2,
}


@pytest.mark.parametrize("name", sorted(DYNAMIC))
def test_dynamic_batch(name: str) -> None:
    batch = Dim("batch", min=2, max=16)
    edge = check_converter(Fn(DYNAMIC[name]), (torch.randn(4, 3, 4, 6),), dynamic_shapes=(({0: batch},),))  # Fn takes *xs
    from pipeline.delegate import blob
    from tests.helpers import tensorrt_blobs

    meta, _ = blob.decode(tensorrt_blobs(edge)[0])
    assert meta.inputs[0].shape[0] == -1


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_honours_precision(precision: str) -> None:
    check_converter(Fn(lambda m, x: torch.cat([x.permute(0, 1, 3, 2).reshape(2, 3, 4, 6), x], 1)[:, 1:]), (X,),
                    precision=precision)


def test_refuses_unfold_along_a_dynamic_dim() -> None:
    batch = Dim("batch", min=2, max=16)
    ep = torch.export.export(Fn(lambda m, x: x.unfold(0, 2, 1)), (torch.randn(4, 3),), dynamic_shapes=(({0: batch},),))
    (node,) = [n for n in ep.graph.nodes if n.target is torch.ops.aten.unfold.default]
    assert "unfold along dim 0 needs a static size" in refusal_reason(node, TensorRTCompileSpec())


def test_refuses_pixel_shuffle_with_batch_dims() -> None:
    ep = torch.export.export(Fn(lambda m, x: torch.pixel_shuffle(x, 2)), (torch.randn(1, 2, 8, 3, 3),))
    (node,) = [n for n in ep.graph.nodes if n.target is torch.ops.aten.pixel_shuffle.default]
    assert "4-D input" in refusal_reason(node, TensorRTCompileSpec())
