"""Matrix-product converters: mm, bmm, addmm, linear, matmul."""

import pytest
import torch

from tests.helpers import Fn, check_converter, refusal

torch.manual_seed(0)
W = torch.randn(16, 8)

CASES = {
    "mm": (lambda m, a, b: torch.mm(a, b), (torch.randn(4, 8), torch.randn(8, 5))),
    "bmm": (lambda m, a, b: torch.bmm(a, b), (torch.randn(3, 4, 8), torch.randn(3, 8, 5))),
    "addmm": (lambda m, c, a, b: torch.addmm(c, a, b, beta=0.5, alpha=2.0), (torch.randn(5), torch.randn(4, 8), torch.randn(8, 5))),
    "linear_2d": (lambda m, x: torch.nn.functional.linear(x, m.w, m.b), (torch.randn(4, 8),)),
    "linear_3d": (lambda m, x: torch.nn.functional.linear(x, m.w, m.b), (torch.randn(2, 4, 8),)),
    "linear_no_bias": (lambda m, x: torch.nn.functional.linear(x, m.w), (torch.randn(2, 4, 8),)),
    "matmul_broadcast": (lambda m, a, b: torch.matmul(a, b), (torch.randn(2, 3, 4, 8), torch.randn(8, 5))),
    "matmul_vector": (lambda m, a, b: torch.matmul(a, b), (torch.randn(4, 8), torch.randn(8))),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_builds_engine(name: str) -> None:
    fn, inputs = CASES[name]
    check_converter(Fn(fn, w=W, b=torch.randn(16)), inputs)


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_honours_precision(precision: str) -> None:
    check_converter(Fn(lambda m, x: torch.nn.functional.linear(x, m.w, m.b), w=W, b=torch.randn(16)),
                    (torch.randn(2, 4, 8),), precision=precision)


def test_refuses_integer_matmul() -> None:
    ints = torch.randint(0, 3, (4, 4), dtype=torch.int32)
    reasons = refusal(Fn(lambda m, a, b: torch.mm(a, b)), (ints, ints))
    assert "dtype int32" in reasons["aten.mm.default"]
