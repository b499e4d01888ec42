"""Elementwise converters: one engine per one-op model, built for real; refusals with reasons."""

import pytest
import torch

from tests.helpers import Fn, check_converter, refusal

torch.manual_seed(0)
A, B = torch.randn(2, 3, 4), torch.randn(3, 4)
POS = torch.rand(2, 3, 4) + 0.5

CASES = {
    "tan": (lambda m, a: torch.tan(a * 0.5), (A,)),
    "asin_acos_atan": (lambda m, a: torch.asin(a.clamp(-0.9, 0.9)) + torch.acos(a.clamp(-0.9, 0.9)) + torch.atan(a), (A,)),
    "hyperbolic": (lambda m, a: torch.sinh(a) + torch.cosh(a) + torch.asinh(a) + torch.atanh(a.clamp(-0.9, 0.9)), (A,)),
    "acosh": (lambda m, a: torch.acosh(a + 1.5), (POS,)),
    "sign": (lambda m, a: torch.sign(a) * 2, (A,)),
    "expm1_log1p": (lambda m, a: torch.expm1(a) + torch.log1p(a), (POS,)),
    "log2_log10": (lambda m, a: torch.log2(a) + torch.log10(a), (POS,)),
    "trunc": (lambda m, a: torch.trunc(a * 3), (A,)),
    "remainder": (lambda m, a: torch.remainder(a * 3, 0.7), (A,)),
    "fmod": (lambda m, a, b: torch.fmod(a * 3, b), (A, POS[0])),
    "bitwise_bool": (lambda m, a, b: ((a > 0) & (b > 0)) | ((a > 1) ^ ~(b < 0)), (A, B)),
    "isnan": (lambda m, a: torch.isnan(torch.log(a)), (A,)),
    "add_broadcast": (lambda m, a, b: a + b, (A, B)),
    "add_alpha_scalar": (lambda m, a: torch.add(a, 2.0, alpha=3), (A,)),
    "add_int32": (lambda m, a, b: a + b, (torch.randint(-5, 5, (4, 3), dtype=torch.int32), torch.randint(-5, 5, (4, 3), dtype=torch.int32))),
    "sub": (lambda m, a, b: a - b, (A, B)),
    "rsub": (lambda m, a: 1.5 - a, (A,)),
    "mul": (lambda m, a, b: a * b, (A, B)),
    "mul_scalar": (lambda m, a: a * 0.25, (A,)),
    "div": (lambda m, a, b: a / b, (A, POS[0])),
    "div_floor": (lambda m, a, b: torch.div(a, b, rounding_mode="floor"), (A * 4, POS[0])),
    "pow_scalar": (lambda m, a: a**3, (A,)),
    "pow_square": (lambda m, a: a**2, (A,)),
    "pow_tensor": (lambda m, a, b: torch.pow(a, b), (POS, B)),
    "maximum": (lambda m, a, b: torch.maximum(a, b), (A, B)),
    "minimum": (lambda m, a, b: torch.minimum(a, b), (A, B)),
    "eq": (lambda m, a: a == torch.round(a), (torch.randint(0, 3, (2, 3, 4)).float() / 2,)),
    "ne": (lambda m, a, b: a != b, (torch.randint(0, 2, (3, 4)).float(), torch.randint(0, 2, (3, 4)).float())),
    "lt": (lambda m, a, b: a < b, (A, B)),
    "le": (lambda m, a: a <= 0.1, (A,)),
    "gt": (lambda m, a, b: a > b, (A, B)),
    "ge": (lambda m, a: a >= -0.1, (A,)),
    "where": (lambda m, a, b: torch.where(a > 0, a, b), (A, B)),
    "sqrt": (lambda m, a: torch.sqrt(a), (POS,)),
    "rsqrt": (lambda m, a: torch.rsqrt(a), (POS,)),
    "exp": (lambda m, a: torch.exp(a), (A,)),
    "log": (lambda m, a: torch.log(a), (POS,)),
    "neg": (lambda m, a: -a, (A,)),
    "abs": (lambda m, a: torch.abs(a), (A,)),
    "reciprocal": (lambda m, a: torch.reciprocal(a), (POS,)),
    "erf": (lambda m, a: torch.erf(a), (A,)),
    "sin_cos": (lambda m, a: torch.sin(a) + torch.cos(a), (A,)),
    "floor_ceil_round": (lambda m, a: torch.floor(a * 3) + torch.ceil(a * 2) + torch.round(a * 5), (A,)),
    "round_decimals": (lambda m, a: torch.round(a * 7, decimals=2) + torch.round(a * 700, decimals=-2), (A,)),
    "logical": (lambda m, a, b: torch.logical_xor(torch.logical_and(a > 0, b > 0), torch.logical_or(a > 1, b < -1)),
                (A, B)),
    "logical_not": (lambda m, a: torch.logical_not(a > 0), (A,)),
    "erfinv": (lambda m, a: torch.erfinv(torch.tanh(a) * 0.999), (A,)),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_builds_engine(name: str) -> None:
    fn, inputs = CASES[name]
    check_converter(Fn(fn), inputs)


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_honours_precision(precision: str) -> None:
    check_converter(Fn(lambda m, a, b: torch.sqrt(a * b + 1.0) - a / 3), (POS, POS), precision=precision)


def test_refuses_trunc_division() -> None:
    reasons = refusal(Fn(lambda m, a, b: torch.div(a, b, rounding_mode="trunc")), (A, POS[0]))
    assert "rounding_mode='trunc'" in reasons["aten.div.Tensor_mode"]


def test_refuses_float_math_on_integers() -> None:
    reasons = refusal(Fn(lambda m, a: torch.logical_not(a)), (torch.randint(0, 3, (4,)),))
    assert "dtype int64" in reasons["aten.logical_not.default"]


def test_erfinv_tails_fp16_and_dynamic() -> None:
    tails = torch.tensor([[-0.9999, -0.99, -0.9, -0.5, 0.0, 0.3, 0.97, 0.999, 0.99999]])  # both polynomials
    check_converter(Fn(lambda m, a: torch.erfinv(a)), (tails,))
    batch = torch.export.Dim("batch", min=2, max=16)
    check_converter(Fn(lambda m, a: torch.erfinv(torch.tanh(a) * 0.99)), (A,), precision="fp16",
                    dynamic_shapes=(({0: batch},),))
