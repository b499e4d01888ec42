"""index_select, gather, scatter, advanced indexing, index_put, constant padding and repeat converters; fp16
and a dynamic batch dim where the op allows."""

import pytest
import torch
import torch.nn.functional as F
from torch.export import Dim

from tests.helpers import Fn, check_converter, refusal

torch.manual_seed(0)
X = torch.randn(2, 5, 6)
LONG = torch.int64
# Distinct positions along the last dim (a scatter writing one place twice has no defined result).
SCATTER_INDEX = torch.stack([torch.randperm(6)[:3] for _ in range(10)]).view(2, 5, 3)


def _write(cache: torch.Tensor, kv: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    cache = cache.clone()
    cache[:, :, pos] = kv  # exported as index_put(cache, [None, None, pos], kv)
    return cache


CASES = {
    "index_select_constant": (lambda m, x: torch.index_select(x, 1, m.idx) * 2, {"idx": torch.tensor([0, 3, 1])}, ()),
    "index_select_input": (lambda m, x, i: torch.index_select(x, 2, i), {}, (torch.tensor([5, 0, 1]),)),
    "gather": (lambda m, x, i: torch.gather(x, 2, i), {}, (torch.randint(0, 6, (2, 5, 3)),)),
    "gather_smaller_index": (lambda m, x, i: torch.gather(x, 1, i), {}, (torch.randint(0, 5, (1, 3, 2)),)),
    "index_one_dim": (lambda m, x, i: x[:, i], {}, (torch.tensor([0, 2, -1, 4]),)),
    "index_first_dim_2d_index": (lambda m, x, i: x[i], {}, (torch.tensor([[1, 0], [0, 1]]),)),
    "index_two_dims": (lambda m, x, i, j: x[:, i, j], {}, (torch.tensor([0, 1, 4]), torch.tensor([5, -2, 0]))),
    "index_broadcast": (lambda m, x, i, j: x[i, j], {}, (torch.tensor([[0], [1]]), torch.tensor([4, 2, 0]))),
    # A KV cache [batch, heads, positions, dim] written at its positions, as transformers' static cache does.
    "index_put_cache": (lambda m, x, kv, pos: _write(x.view(2, 5, 3, 2).transpose(1, 2), kv, pos) * 2,
                        {}, (torch.randn(2, 3, 2, 2), torch.tensor([4, 1]))),
    "index_put_scalar_value": (lambda m, x, i: torch.index_put(x, [i], torch.tensor(0.5)), {}, (torch.tensor([1, -1]),)),
    "index_copy": (lambda m, x, i, src: x.index_copy(2, i, src), {}, (torch.tensor([5, 0]), torch.randn(2, 5, 2))),
    "copy_broadcast": (lambda m, x, src: torch.ops.aten.copy(x, src) + x, {}, (torch.randn(1, 6),)),
    "scatter": (lambda m, x, i, src: torch.scatter(x, 2, i, src), {}, (SCATTER_INDEX, torch.randn(2, 5, 3))),
    "scatter_larger_src": (lambda m, x, i, src: torch.scatter(x, 2, i, src), {}, (SCATTER_INDEX, torch.randn(2, 6, 4))),
    "scatter_value": (lambda m, x, i: torch.scatter(x, 2, i, 0.5) * 3, {}, (SCATTER_INDEX,)),
    "slice_scatter": (lambda m, x, src: torch.slice_scatter(x, src, 1, 1, 4) * 2, {}, (torch.randn(2, 3, 6),)),
    "slice_scatter_step": (lambda m, x, src: torch.slice_scatter(x, src, 2, 0, None, 2), {}, (torch.randn(2, 5, 3),)),
    "slice_scatter_negative": (lambda m, x, src: torch.slice_scatter(x, src, -1, -2), {}, (torch.randn(2, 5, 2),)),
    "pad": (lambda m, x: F.pad(x, (1, 2, 0, 3), value=0.5), {}, ()),
    "pad_crop": (lambda m, x: F.pad(x, (-1, 2)), {}, ()),
    "repeat": (lambda m, x: x.repeat(2, 1, 3), {}, ()),
    "repeat_adds_dims": (lambda m, x: x.repeat(2, 1, 1, 3), {}, ()),
}


def _module(name: str) -> Fn:
    fn, buffers, _ = CASES[name]
    module = Fn(fn)
    for key, value in buffers.items():
        module.register_buffer(key, value)
    return module


@pytest.mark.parametrize("name", sorted(CASES))
def test_builds_engine(name: str) -> None:
    check_converter(_module(name), (X, *CASES[name][2]))


@pytest.mark.parametrize("name", ["index_select_input", "gather", "scatter", "index_two_dims", "index_put_cache", "pad",
                                  "repeat"])
def test_fp16(name: str) -> None:
    check_converter(_module(name), (X, *CASES[name][2]), precision="fp16")


@pytest.mark.parametrize("name", ["index_select_constant", "index_one_dim", "index_put_scalar_value", "copy_broadcast", "pad", "repeat",
                                  "slice_scatter"])
def test_dynamic_batch(name: str) -> None:
    batch = Dim("batch", min=2, max=16)
    extra = CASES[name][2]
    check_converter(_module(name), (X, *extra), dynamic_shapes=(({0: batch}, *({} for _ in extra)),))


def test_refuses_boolean_mask() -> None:
    reasons = refusal(Fn(lambda m, x: x[x > 0] * 2), (X,))
    assert "boolean-mask" in reasons.get("aten.index.Tensor", "") or any("data-dependent" in r for r in reasons.values())


def test_refuses_accumulating_index_put_into_integers() -> None:
    """x[idx] += v adds through a floating-point product (`accumulate.py`): integer sums stay outside."""
    reasons = refusal(Fn(lambda m, x, i: torch.index_put(x, [i], torch.ones(3, 6, dtype=torch.int64), accumulate=True) * 2),
                      (torch.randint(0, 9, (5, 6)), torch.tensor([0, 1, 1])))
    assert reasons.get("aten.index_put.default", "").startswith("x[idx] += v into int64"), reasons
