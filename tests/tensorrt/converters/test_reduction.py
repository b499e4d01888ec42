"""Reduction converters: mean, sum, amax, amin."""

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
