"""Upsampling converters (nearest, bilinear)."""

import pytest
import torch
import torch.nn.functional as F

from tests.helpers import Fn, check_converter, refusal

torch.manual_seed(0)
X = torch.randn(2, 3, 5, 7)

CASES = {
    "nearest_x2": lambda m, x: F.interpolate(x, scale_factor=2, mode="nearest"),
    "nearest_size": lambda m, x: F.interpolate(x, size=(10, 21), mode="nearest"),
    "bilinear_x2": lambda m, x: F.interpolate(x, scale_factor=2, mode="bilinear"),
    "bilinear_align": lambda m, x: F.interpolate(x, size=(9, 13), mode="bilinear", align_corners=True),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_builds_engine(name: str) -> None:
    check_converter(Fn(CASES[name]), (X,))


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_honours_precision(precision: str) -> None:
    check_converter(Fn(CASES["bilinear_x2"]), (X,), precision=precision)


def test_refuses_integer_upsample() -> None:
    reasons = refusal(Fn(lambda m, x: F.interpolate(x, scale_factor=2, mode="nearest")), (torch.ones(1, 1, 2, 2, dtype=torch.uint8),))
    assert any("dtype" in r for r in reasons.values()), reasons
