"""Pooling converters: max, avg, adaptive avg."""

import pytest
import torch

from tests.helpers import check_converter, network_layers, refusal

torch.manual_seed(0)
X = torch.randn(2, 4, 12, 12)

CASES = {
    "max": torch.nn.MaxPool2d(2),
    "max_stride_pad": torch.nn.MaxPool2d(3, stride=2, padding=1),
    "max_ceil": torch.nn.MaxPool2d(3, stride=2, ceil_mode=True),
    "avg": torch.nn.AvgPool2d(2),
    "avg_pad_exclude": torch.nn.AvgPool2d(3, stride=2, padding=1, count_include_pad=False),
    "avg_pad_include": torch.nn.AvgPool2d(3, stride=2, padding=1),
    "adaptive_1x1": torch.nn.AdaptiveAvgPool2d(1),
    "adaptive_3x3": torch.nn.AdaptiveAvgPool2d(3),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_builds_engine(name: str) -> None:
    check_converter(CASES[name], (X,))


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_honours_precision(precision: str) -> None:
    check_converter(torch.nn.Sequential(torch.nn.MaxPool2d(2), torch.nn.AvgPool2d(2)), (X,), precision=precision)


def test_refuses_dilated_max_pool() -> None:
    reasons = refusal(torch.nn.MaxPool2d(2, dilation=2), (X,))
    assert any("dilation" in r for r in reasons.values())


def test_refuses_uneven_adaptive_pool() -> None:
    reasons = refusal(torch.nn.AdaptiveAvgPool2d(5), (X,))
    assert any("divide evenly" in r for r in reasons.values()), reasons


def test_global_average_pool_is_one_reduction() -> None:
    # TensorRT-RTX runs a mean over H and W faster than a full-window pooling layer (docs/gpu-results.md).
    for dialect in ("aten", "edge"):
        layers, _ = network_layers(torch.nn.AdaptiveAvgPool2d(1), X, dialect)
        assert layers == ["LayerType.REDUCE"], (dialect, layers)


def test_global_average_pool_takes_dynamic_spatial_dims() -> None:
    side = torch.export.Dim("side", min=4, max=32)
    check_converter(torch.nn.AdaptiveAvgPool2d(1), (X,), dynamic_shapes=({2: side, 3: side},))
