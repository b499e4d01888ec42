"""Reduction converters: mean, sum, amax, amin, top-k and sort."""

import pytest
import torch

from tests.helpers import Fn, check_converter, refusal

torch.manual_seed(0)
X = torch.randn(2, 3, 4, 5)

CASES = {
    "mean_dims": lambda m, x: x.mean((2, 3)),
    "mean_keepdim": lambda m, x: x.mean(-1, keepdim=True),
    "mean_all": lambda m, x: x.mean(),
    "sum_dim": lambda m, x: x.sum(1),
    "sum_all": lambda m, x: x.sum(),
    "amax": lambda m, x: x.amax(-1),
    "amin": lambda m, x: x.amin((0, 2), keepdim=True),
    "cumsum": lambda m, x: x.cumsum(1),
    "prod": lambda m, x: x.prod(-1),
    "max_dim": lambda m, x: x.max(1).values + x.min(-1, keepdim=True).values.sum(),
    "max_dim_indices": lambda m, x: x.max(1).indices,
    "argmax": lambda m, x: x.argmax(-1) + x.argmin(),
    "max_all": lambda m, x: x.max() - x.min(),
    "any": lambda m, x: (x > 1).any(-1),
    "all": lambda m, x: torch.stack([(x > -9).all(), (x > 0).all()]),  # True and False: not a constant
    "topk": lambda m, x: x.topk(2, -1).values,
    "topk_indices": lambda m, x: x.topk(3, 1, largest=False).indices,
    "topk_unsorted": lambda m, x: x.topk(3, -1, sorted=False).values.sum(-1),  # any order: summed
    "var": lambda m, x: x.var(-1) + x.std((1, 2), keepdim=True).sum(),
    "var_mean": lambda m, x: torch.var_mean(x, -1, correction=0)[0],
    "norm": lambda m, x: torch.linalg.vector_norm(x, dim=-1) + x.norm(p=1, dim=1).sum(),
    "normalize": lambda m, x: torch.nn.functional.normalize(x, dim=-1),
    "norm_inf_p3": lambda m, x: torch.linalg.vector_norm(x, float("inf"), dim=-1) + torch.linalg.vector_norm(x, 3, dim=-1),
    "cumsum_last": lambda m, x: torch.cumsum(x, -1) - x,
    "cumprod": lambda m, x: x.cumprod(1),
    "sort": lambda m, x: x.sort(-1).values,
    "sort_descending_indices": lambda m, x: x.sort(1, descending=True).indices,
    "argsort": lambda m, x: x.argsort(-1, descending=True),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_builds_engine(name: str) -> None:
    check_converter(Fn(CASES[name]), (X,))


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_honours_precision(precision: str) -> None:
    check_converter(Fn(lambda m, x: x.mean((2, 3)) + x.sum(-1).amax(-1)), (X,), precision=precision)


def test_refuses_integer_mean_input() -> None:
    reasons = refusal(Fn(lambda m, x: x.sum(0, dtype=torch.float32).mean()), (torch.ones(3, dtype=torch.bool),))
    assert any("dtype bool" in r for r in reasons.values()), reasons


def test_cumsum_integer_fp16_and_dynamic() -> None:
    check_converter(Fn(lambda m, x: x.cumsum(-1)), (torch.randint(0, 5, (3, 7)),))
    check_converter(Fn(lambda m, x: x.cumsum(1)), (X,), precision="fp16")
    batch = torch.export.Dim("batch", min=2, max=16)
    check_converter(Fn(lambda m, x: x.cumsum(1)), (X,), dynamic_shapes=(({0: batch},),))


def test_sort_takes_a_dynamic_batch_and_fp16() -> None:
    batch = torch.export.Dim("batch", min=2, max=16)
    check_converter(Fn(lambda m, x: x.sort(-1).values * 2), (X,), dynamic_shapes=(({0: batch},),))
    check_converter(Fn(lambda m, x: x.sort(2).values), (X,), precision="fp16")


def test_refuses_stable_sort() -> None:
    reasons = refusal(Fn(lambda m, x: x.sort(stable=True, dim=-1).indices), (X,))
    assert any("does not promise the order of equal values" in r for r in reasons.values()), reasons


def test_cumprod_signs_zeros_fp16_and_dynamic() -> None:
    x = torch.tensor([[1.5, -2.0, 0.5, -1.0, 3.0, 0.0, 2.0], [-1.0, -1.0, -1.0, 2.0, -0.5, 4.0, -3.0]])
    check_converter(Fn(lambda m, x: x.cumprod(-1)), (x,))  # negative factors flip the sign; after a zero, zeros
    batch = torch.export.Dim("batch", min=2, max=16)
    check_converter(Fn(lambda m, x: (x * 0.5 + 1.0).cumprod(1)), (X,), precision="fp16", dynamic_shapes=(({0: batch},),))
