"""scaled_dot_product_attention converter."""

import pytest
import torch
import torch.nn.functional as F

from tests.helpers import Fn, check_converter, refusal

torch.manual_seed(0)
Q, K, V = torch.randn(2, 4, 6, 8), torch.randn(2, 4, 9, 8), torch.randn(2, 4, 9, 8)

CASES = {
    "plain": (lambda m, q, k, v: F.scaled_dot_product_attention(q, k, v), (Q, K, V)),
    "causal": (lambda m, q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True), (Q, Q * 0.5, Q + 1)),
    "scale": (lambda m, q, k, v: F.scaled_dot_product_attention(q, k, v, scale=0.3), (Q, K, V)),
    "float_mask": (lambda m, q, k, v, mask: F.scaled_dot_product_attention(q, k, v, attn_mask=mask), (Q, K, V, torch.randn(6, 9))),
    "bool_mask": (lambda m, q, k, v, mask: F.scaled_dot_product_attention(q, k, v, attn_mask=mask),
                  (Q, K, V, torch.rand(6, 9) > 0.3)),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_builds_engine(name: str) -> None:
    fn, inputs = CASES[name]
    check_converter(Fn(fn), inputs)


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_honours_precision(precision: str) -> None:
    check_converter(Fn(CASES["causal"][0]), CASES["causal"][1], precision=precision)


def test_refuses_dropout() -> None:
    reasons = refusal(Fn(lambda m, q, k, v: F.scaled_dot_product_attention(q, k, v, dropout_p=0.5)), (Q, K, V))
    assert any("dropout" in r for r in reasons.values()), reasons
