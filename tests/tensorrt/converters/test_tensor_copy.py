"""Copies, aliases, casts, and constant-creating ops."""

import pytest
import torch

from tests.helpers import Fn, check_converter, refusal

torch.manual_seed(0)
X = torch.randn(3, 5) * 4

CASES = {
    "clone": lambda m, x: x.clone() * 2,
    "to_half_and_back": lambda m, x: (x.to(torch.float16) * 2).to(torch.float32),
    "to_int": lambda m, x: x.to(torch.int32) + 1,
    "contiguous": lambda m, x: x.t().contiguous() * 2,
    "full": lambda m, x: x + torch.full((3, 5), 1.5),
    "arange": lambda m, x: x * torch.arange(5, dtype=torch.float32),
    "ones_like": lambda m, x: x + torch.ones_like(x),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_builds_engine(name: str) -> None:
    check_converter(Fn(CASES[name]), (X,))


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_honours_precision(precision: str) -> None:
    check_converter(Fn(lambda m, x: x.clone().to(torch.float32) * 2), (X,), precision=precision)


def test_refuses_channels_last_copy() -> None:
    reasons = refusal(Fn(lambda m, x: x.to(memory_format=torch.channels_last) * 2), (torch.randn(1, 3, 4, 4),))
    assert any("dim_order" in r or "memory_format" in r for r in reasons.values()), reasons
