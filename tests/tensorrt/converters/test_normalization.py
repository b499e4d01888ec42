"""Batch norm (inference) and layer norm converters."""

import pytest
import torch

from tests.helpers import Fn, check_converter, refusal

torch.manual_seed(0)


def _bn(channels: int) -> torch.nn.BatchNorm2d:
    bn = torch.nn.BatchNorm2d(channels)
    with torch.no_grad():  # non-trivial statistics, or the test proves nothing
        bn.running_mean.uniform_(-1, 1)
        bn.running_var.uniform_(0.5, 2)
        bn.weight.uniform_(0.5, 1.5)
        bn.bias.uniform_(-1, 1)
    return bn.eval()


def test_batch_norm() -> None:
    check_converter(_bn(6), (torch.randn(2, 6, 5, 5),))


def test_batch_norm_1d() -> None:
    bn = torch.nn.BatchNorm1d(6).eval()
    with torch.no_grad():
        bn.running_mean.uniform_(-1, 1)
    check_converter(bn, (torch.randn(3, 6),))


@pytest.mark.parametrize("shape", [(16,), (4, 16)])
def test_layer_norm(shape: tuple[int, ...]) -> None:
    ln = torch.nn.LayerNorm(shape)
    with torch.no_grad():
        ln.weight.uniform_(0.5, 1.5)
        ln.bias.uniform_(-1, 1)
    check_converter(ln, (torch.randn(2, 4, 16),))


def test_layer_norm_no_affine() -> None:
    check_converter(torch.nn.LayerNorm(16, elementwise_affine=False), (torch.randn(2, 4, 16),))


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_honours_precision(precision: str) -> None:
    check_converter(torch.nn.Sequential(_bn(6), torch.nn.LayerNorm(5)), (torch.randn(2, 6, 5, 5),), precision=precision)


def test_refuses_used_statistics() -> None:
    fn = Fn(lambda m, x: torch.ops.aten.native_layer_norm(x, [8], None, None, 1e-5)[1] * 2)
    reasons = refusal(fn, (torch.randn(2, 8),))
    assert any("mean/rstd" in r for r in reasons.values()), reasons
