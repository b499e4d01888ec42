"""Pooling converters: max, avg, adaptive avg and max; 2-D and 3-D."""

import pytest
import torch

from pipeline.engine.converters.pooling import box_average
from tests.helpers import check_converter, lower, network_layers, refusal

torch.manual_seed(0)
X = torch.randn(2, 4, 12, 12)
VIDEO = torch.randn(2, 3, 8, 10, 10)  # [N, C, T, H, W]

CASES = {
    "max": torch.nn.MaxPool2d(2),
    "max_stride_pad": torch.nn.MaxPool2d(3, stride=2, padding=1),
    "max_ceil": torch.nn.MaxPool2d(3, stride=2, ceil_mode=True),
    "avg": torch.nn.AvgPool2d(2),
    "avg_pad_exclude": torch.nn.AvgPool2d(3, stride=2, padding=1, count_include_pad=False),
    "avg_pad_include": torch.nn.AvgPool2d(3, stride=2, padding=1),
    "adaptive_1x1": torch.nn.AdaptiveAvgPool2d(1),
    "adaptive_3x3": torch.nn.AdaptiveAvgPool2d(3),
    "adaptive_uneven": torch.nn.AdaptiveAvgPool2d(5),  # 12 -> 5: windows of 3 and 4, overlapping
    "adaptive_uneven_rect": torch.nn.AdaptiveAvgPool2d((7, 1)),
    "adaptive_max_1x1": torch.nn.AdaptiveMaxPool2d(1),
    "adaptive_max_even": torch.nn.AdaptiveMaxPool2d((4, 6)),
    "adaptive_max_uneven": torch.nn.AdaptiveMaxPool2d((5, 7)),  # windows of unequal sizes, overlapping
}
VIDEO_CASES = {
    "max3d": torch.nn.MaxPool3d(2),
    "max3d_stride_pad": torch.nn.MaxPool3d((1, 3, 3), stride=(1, 2, 2), padding=(0, 1, 1)),
    "max3d_ceil": torch.nn.MaxPool3d(3, stride=2, ceil_mode=True),
    "avg3d": torch.nn.AvgPool3d((2, 2, 2)),
    "avg3d_pad_exclude": torch.nn.AvgPool3d(3, stride=2, padding=1, count_include_pad=False),
    "adaptive3d_global": torch.nn.AdaptiveAvgPool3d(1),
    "adaptive3d_even": torch.nn.AdaptiveAvgPool3d((4, 5, 5)),
    "adaptive3d_uneven": torch.nn.AdaptiveAvgPool3d((3, 7, 7)),  # as Swin3D's and S3D's heads take it
    "adaptive_max3d_uneven": torch.nn.AdaptiveMaxPool3d((3, 4, 7)),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_builds_engine(name: str) -> None:
    check_converter(CASES[name], (X,))


@pytest.mark.parametrize("name", sorted(VIDEO_CASES))
def test_builds_video_engine(name: str) -> None:
    check_converter(VIDEO_CASES[name], (VIDEO,))


def test_video_pooling_takes_a_dynamic_batch() -> None:
    batch = torch.export.Dim("batch", min=1, max=8)
    check_converter(torch.nn.Sequential(torch.nn.MaxPool3d(2), torch.nn.AdaptiveAvgPool3d((3, 2, 2))), (VIDEO,),
                    dynamic_shapes=({0: batch},))


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_honours_precision(precision: str) -> None:
    check_converter(torch.nn.Sequential(torch.nn.MaxPool2d(2), torch.nn.AvgPool2d(2)), (X,), precision=precision)


def test_uneven_adaptive_max_pool_takes_a_dynamic_batch() -> None:
    batch = torch.export.Dim("batch", min=1, max=8)
    check_converter(torch.nn.AdaptiveMaxPool2d((5, 7)), (X,), dynamic_shapes=({0: batch},))


def test_refuses_adaptive_max_pool_whose_indices_are_read() -> None:
    reasons = refusal(torch.nn.AdaptiveMaxPool2d(5, return_indices=True), (X,))
    assert any("indices are used" in r for r in reasons.values()), reasons


def test_refuses_dilated_max_pool() -> None:
    reasons = refusal(torch.nn.MaxPool2d(2, dilation=2), (X,))
    assert any("dilation" in r for r in reasons.values())


def test_refuses_adaptive_pool_over_dynamic_spatial_dims() -> None:
    side = torch.export.Dim("side", min=4, max=32)
    _, partitioner = lower(torch.nn.AdaptiveAvgPool2d(3), (X,), dynamic_shapes=({2: side, 3: side},))
    assert any("needs static spatial dims" in r["reason"] for r in partitioner.record.refused.values())


def test_uneven_adaptive_pool_is_one_product_per_dim() -> None:
    layers, _ = network_layers(torch.nn.AdaptiveAvgPool2d(5), X, "aten")
    assert layers.count("LayerType.MATRIX_MULTIPLY") == 2 and "LayerType.POOLING" not in layers, layers


def test_global_average_pool_is_one_reduction() -> None:
    # TensorRT-RTX runs a mean over H and W faster than a full-window pooling layer (results/gpu-log.md).
    for dialect in ("aten", "edge"):
        layers, _ = network_layers(torch.nn.AdaptiveAvgPool2d(1), X, dialect)
        assert layers == ["LayerType.REDUCE"], (dialect, layers)


def test_global_average_pool_takes_dynamic_spatial_dims() -> None:
    side = torch.export.Dim("side", min=4, max=32)
    check_converter(torch.nn.AdaptiveAvgPool2d(1), (X,), dynamic_shapes=({2: side, 3: side},))


@pytest.mark.parametrize("size, out", [(12, 5), (7, 3), (10, 7), (8, 8), (5, 1)])
def test_box_average_is_torch_adaptive_pooling(size: int, out: int) -> None:
    """The matrices the uneven case multiplies by give torch's windows, checked on the CPU."""
    x = torch.randn(2, 3, size, size + 1, dtype=torch.float64)
    got = box_average(size, out) @ x @ box_average(size + 1, out + 1).T
    torch.testing.assert_close(got, torch.nn.functional.adaptive_avg_pool2d(x, (out, out + 1)))
