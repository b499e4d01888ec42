"""Resizing converters (nearest, bilinear, antialiased bilinear and bicubic) and grid sampling."""

import pytest
import torch
import torch.nn.functional as F

from pipeline.engine.converters.resize import resize_matrices
from tests.helpers import Fn, check_converter, network_layers, refusal

torch.manual_seed(0)
X = torch.randn(2, 3, 5, 7)

CASES = {
    "nearest_x2": lambda m, x: F.interpolate(x, scale_factor=2, mode="nearest"),
    "nearest_size": lambda m, x: F.interpolate(x, size=(10, 21), mode="nearest"),
    "bilinear_x2": lambda m, x: F.interpolate(x, scale_factor=2, mode="bilinear"),
    "bilinear_align": lambda m, x: F.interpolate(x, size=(9, 13), mode="bilinear", align_corners=True),
    # Antialiased (torchvision's Resize on tensors): down, up, by a factor, bicubic.
    "bilinear_aa_down": lambda m, x: F.interpolate(x, size=(3, 4), mode="bilinear", antialias=True),
    "bilinear_aa_up": lambda m, x: F.interpolate(x, size=(8, 11), mode="bilinear", antialias=True),
    "bilinear_aa_scale": lambda m, x: F.interpolate(x, scale_factor=0.6, mode="bilinear", antialias=True),
    "bicubic_aa": lambda m, x: F.interpolate(x, size=(4, 3), mode="bicubic", antialias=True, align_corners=True),
}
# grid_sample: every interpolation and padding mode, the grid reaching outside [-1, 1].
GRID = torch.rand(2, 4, 6, 2) * 2.4 - 1.2
GRID_CASES = {f"{mode}_{padding}_{align}": (mode, padding, align)
              for mode in ("bilinear", "nearest", "bicubic") for padding in ("zeros", "border", "reflection")
              for align in (False, True)}


@pytest.mark.parametrize("name", sorted(CASES))
def test_builds_engine(name: str) -> None:
    check_converter(Fn(CASES[name]), (X,))


@pytest.mark.parametrize("name", sorted(GRID_CASES))
def test_grid_sample_builds_engine(name: str) -> None:
    mode, padding, align = GRID_CASES[name]
    check_converter(Fn(lambda m, x, g: F.grid_sample(x, g, mode=mode, padding_mode=padding, align_corners=align)),
                    (X, GRID))


def test_grid_sample_fp16_and_dynamic_batch() -> None:
    sample = Fn(lambda m, x, g: F.grid_sample(x, g, align_corners=False))
    check_converter(sample, (X, GRID), precision="fp16")
    batch = torch.export.Dim("batch", min=1, max=8)
    check_converter(sample, (X, GRID), dynamic_shapes=(({0: batch}, {0: batch}),))


def test_antialiased_resize_is_one_product_per_dim() -> None:
    layers, _ = network_layers(Fn(CASES["bilinear_aa_down"]), X)
    assert layers.count("LayerType.MATRIX_MULTIPLY") == 2 and "LayerType.RESIZE" not in layers, layers


@pytest.mark.parametrize("op, size, out, align, scales", [
    (torch.ops.aten._upsample_bilinear2d_aa.default, (12, 10), (5, 7), False, (None, None)),
    (torch.ops.aten._upsample_bilinear2d_aa.default, (13, 17), (4, 6), False, (0.37, 0.37)),
    (torch.ops.aten._upsample_bilinear2d_aa.default, (1, 5), (3, 7), False, (None, None)),
    (torch.ops.aten._upsample_bicubic2d_aa.default, (9, 16), (4, 6), True, (None, None)),
])
def test_resize_matrices_are_torch_resize(op: object, size: tuple[int, int], out: tuple[int, int], align: bool,
                                          scales: tuple[float | None, float | None]) -> None:
    """The matrices the antialiased converter multiplies by give torch's own result, on the CPU."""
    x = torch.randn(2, 3, *size, dtype=torch.float64)
    first, second = resize_matrices(op, size, out, align, scales)
    torch.testing.assert_close(first @ x @ second.T, op(x, list(out), align, *scales))  # type: ignore[operator]


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_honours_precision(precision: str) -> None:
    check_converter(Fn(CASES["bilinear_x2"]), (X,), precision=precision)


def test_refuses_integer_upsample() -> None:
    reasons = refusal(Fn(lambda m, x: F.interpolate(x, scale_factor=2, mode="nearest")), (torch.ones(1, 1, 2, 2, dtype=torch.uint8),))
    assert any("dtype" in r for r in reasons.values()), reasons
