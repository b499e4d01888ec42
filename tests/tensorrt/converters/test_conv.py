"""Convolution converter: groups/depthwise, stride, padding, dilation, bias, transposed, 3-D; F.fold (col2im)."""

import pytest
import torch

from tests.helpers import check_converter, network_layers, refusal

torch.manual_seed(0)
X = torch.randn(2, 8, 16, 16)

CASES = {
    "plain": torch.nn.Conv2d(8, 4, 3),
    "stride_padding": torch.nn.Conv2d(8, 6, 3, stride=2, padding=1),
    "dilation": torch.nn.Conv2d(8, 6, 3, dilation=2, padding=2),
    "groups": torch.nn.Conv2d(8, 4, 3, groups=2, padding=1),
    "depthwise": torch.nn.Conv2d(8, 8, 3, groups=8, padding=1),
    "no_bias": torch.nn.Conv2d(8, 4, 1, bias=False),
    "asymmetric": torch.nn.Conv2d(8, 4, (3, 1), stride=(2, 1), padding=(1, 0)),
    "transposed": torch.nn.ConvTranspose2d(8, 4, 2, stride=2),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_builds_engine(name: str) -> None:
    check_converter(CASES[name], (X,))


def test_conv3d() -> None:
    check_converter(torch.nn.Conv3d(2, 3, 3, padding=1), (torch.randn(1, 2, 6, 6, 6),))


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_honours_precision(precision: str) -> None:
    check_converter(torch.nn.Conv2d(8, 4, 3, padding=1), (X,), precision=precision)


@pytest.mark.parametrize("kwargs", [{}, {"stride": 2, "padding": 1}, {"padding": 2, "dilation": 2, "groups": 2}])
def test_1d_convolution(kwargs: dict) -> None:
    check_converter(torch.nn.Conv1d(4, 6, 3, **kwargs), (torch.randn(2, 4, 17),))


def test_1d_convolution_fp16_dynamic_length() -> None:
    length = torch.export.Dim("length", min=8, max=64)
    check_converter(torch.nn.Conv1d(4, 6, 3, padding=1), (torch.randn(2, 4, 17),), precision="fp16",
                    dynamic_shapes=({2: length},))
    check_converter(torch.nn.ConvTranspose1d(4, 6, 3, stride=2), (torch.randn(2, 4, 17),))


def test_refuses_transposed_output_padding() -> None:
    reasons = refusal(torch.nn.ConvTranspose2d(8, 4, 3, stride=2, output_padding=1), (X,))
    assert "output_padding" in reasons["aten.convolution.default"]


class PadThenConv(torch.nn.Module):
    """TensorFlow-style "same" padding: an explicit (often asymmetric) pad, then the convolution."""

    def __init__(self, conv: torch.nn.Module, pad: tuple[int, ...], value: float = 0.0) -> None:
        super().__init__()
        self.conv, self.pad, self.value = conv, pad, value

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(torch.nn.functional.pad(x, self.pad, value=self.value))


class PadReadTwice(PadThenConv):
    """The padded tensor is also read by something else than the convolution."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        padded = torch.nn.functional.pad(x, self.pad, value=self.value)
        return self.conv(padded) * padded.mean()


PADDED = {  # (convolution, pad, input)
    "2d_same_stride2": (torch.nn.Conv2d(8, 4, 3, stride=2), (0, 1, 0, 1), X),
    "2d_with_own_padding": (torch.nn.Conv2d(8, 4, 3, padding=1, groups=4), (2, 0, 1, 3), X),
    "1d": (torch.nn.Conv1d(4, 6, 5, stride=2), (1, 2), torch.randn(2, 4, 17)),
    "3d": (torch.nn.Conv3d(2, 3, 3), (0, 1, 1, 0, 1, 1), torch.randn(1, 2, 6, 6, 6)),
}


@pytest.mark.parametrize("name", sorted(PADDED))
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_zero_pad_is_taken_into_the_convolution(name: str, precision: str) -> None:
    conv, pad, x = PADDED[name]
    layers, _ = network_layers(PadThenConv(conv, pad), x)
    assert not any("SLICE" in t for t in layers), layers
    check_converter(PadThenConv(conv, pad), (x,), precision=precision)


def test_zero_pad_taken_in_with_a_dynamic_batch_and_height() -> None:
    dims = {0: torch.export.Dim("batch", min=1, max=4), 2: torch.export.Dim("height", min=9, max=32)}
    check_converter(PadThenConv(torch.nn.Conv2d(8, 4, 3, stride=2), (0, 1, 0, 1)), (X,), dynamic_shapes=(dims,))


@pytest.mark.parametrize("model", [
    PadThenConv(torch.nn.Conv2d(8, 4, 3), (1, 1, 1, 1), value=1.0),  # not zeros
    PadThenConv(torch.nn.Conv2d(8, 4, 3), (1, 1, -1, 2)),  # crops a row
    PadThenConv(torch.nn.Conv2d(9, 4, 1), (0, 0, 0, 0, 1, 0)),  # pads the channels
    PadReadTwice(torch.nn.Conv2d(8, 4, 3), (1, 1, 1, 1)),
], ids=["value", "crop", "channels", "second_reader"])
def test_pad_stays_a_layer_when_the_convolution_cannot_take_it(model: torch.nn.Module) -> None:
    layers, _ = network_layers(model, X)
    assert any("SLICE" in t for t in layers), layers
    check_converter(model, (X,))


# F.fold (col2im): (output size, kernel, dilation, padding, stride); overlapping blocks sum, and the
# second and last leave rows or columns no block reaches (zeros).
FOLDS = [((14, 14), (3, 3), 1, 1, 1), ((15, 13), (3, 2), (1, 2), (1, 0), (2, 3)), ((8, 8), 2, 1, 0, 2),
         ((9, 9), 3, (2, 1), (2, 1), 2)]


class Fold(torch.nn.Module):
    def __init__(self, size: tuple[int, int], kernel: object, dilation: object, padding: object, stride: object) -> None:
        super().__init__()
        self.args = (size, kernel, dilation, padding, stride)

    def forward(self, cols: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.fold(cols, *self.args) * 2  # type: ignore[arg-type]


def _columns(size: tuple[int, int], kernel: object, dilation: object, padding: object, stride: object,
             batch: int = 2) -> torch.Tensor:
    return torch.nn.functional.unfold(torch.randn(batch, 3, *size), kernel, dilation, padding, stride)  # type: ignore[arg-type]


@pytest.mark.parametrize("fold", FOLDS, ids=str)
def test_fold(fold: tuple) -> None:
    check_converter(Fold(*fold), (_columns(*fold),))


def test_fold_fp16_dynamic_batch() -> None:
    batch = torch.export.Dim("batch", min=1, max=8)
    check_converter(Fold(*FOLDS[1]), (_columns(*FOLDS[1], batch=3),), precision="fp16", dynamic_shapes=({0: batch},))


def test_unbatched_fold() -> None:
    check_converter(Fold(*FOLDS[0]), (_columns(*FOLDS[0])[0],))
