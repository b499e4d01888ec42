"""Converters for resizing images (nearest, bilinear; antialiased bilinear and bicubic) and for
sampling them at the points of a grid (`grid_sample`)."""

from __future__ import annotations

from typing import Any

import torch

from pipeline.engine.context import ConversionContext
from pipeline.engine.converters import _validators as v
from pipeline.engine.converters._layers import out_val, separable_linear
from pipeline.engine.converters.registry import aten_op, converter
from pipeline.engine.trt_api import trt

aten = torch.ops.aten
Node = torch.fx.Node


def _static_out(node: Node, spec: Any) -> str | None:
    if not all(isinstance(d, int) for d in out_val(node).shape[1:]):
        return "upsampling needs static channel and spatial output sizes"
    return v.FLOAT_ONLY(node, spec)


def _resize(ctx: ConversionContext, node: Node, x: Any, mode: Any, transform: Any) -> Any:
    layer = ctx.network.add_resize(x)
    out_shape = list(out_val(node).shape)
    if isinstance(out_shape[0], int):
        layer.shape = tuple(out_shape)
    else:  # dynamic batch: scale 1 on it, exact factors elsewhere
        in_shape = node.args[0].meta["val"].shape  # type: ignore[union-attr]
        layer.scales = [1.0] + [o / i for o, i in zip(out_shape[1:], in_shape[1:])]
    layer.resize_mode = mode
    layer.coordinate_transformation = transform
    layer.nearest_rounding = trt().ResizeRoundMode.FLOOR  # torch's "nearest" floors the source index
    return layer.get_output(0)


@converter(aten.upsample_nearest2d.vec, aten.upsample_nearest2d.default, validator=_static_out)
def upsample_nearest2d(ctx: ConversionContext, node: Node, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    t = trt()
    return _resize(ctx, node, args[0], t.InterpolationMode.NEAREST, t.ResizeCoordinateTransformation.ASYMMETRIC)


@converter(aten.upsample_bilinear2d.vec, aten.upsample_bilinear2d.default, validator=_static_out)
def upsample_bilinear2d(ctx: ConversionContext, node: Node, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    t = trt()
    align = bool(v.arg(node, 2, "align_corners", False))
    transform = t.ResizeCoordinateTransformation.ALIGN_CORNERS if align else t.ResizeCoordinateTransformation.HALF_PIXEL
    return _resize(ctx, node, args[0], t.InterpolationMode.LINEAR, transform)


def _static_spatial(node: Node, spec: Any) -> str | None:
    shape = node.args[0].meta["val"].shape  # type: ignore[union-attr]
    if not all(isinstance(d, int) for d in [*shape[-2:], *out_val(node).shape[-2:]]):
        return "antialiased resizing needs static spatial input and output sizes"
    return v.FLOAT_ONLY(node, spec)


_AA = {aten._upsample_bilinear2d_aa.default: aten._upsample_bilinear2d_aa.default,
       aten._upsample_bilinear2d_aa.vec: aten._upsample_bilinear2d_aa.default,
       aten._upsample_bicubic2d_aa.default: aten._upsample_bicubic2d_aa.default,
       aten._upsample_bicubic2d_aa.vec: aten._upsample_bicubic2d_aa.default}


def resize_matrices(op: Any, size: tuple[int, int], out: tuple[int, int], align_corners: bool,
                    scales: tuple[float | None, float | None]) -> list[torch.Tensor]:
    """The [out, in] matrix per spatial dim of a separable resize `op` (antialiased bilinear or
    bicubic: each output a weighted sum of inputs along H, then along W), read from torch's own op
    applied to one unit image per input row (column), in float64."""
    matrices = []
    for axis in range(2):
        basis = torch.eye(size[axis], dtype=torch.float64)  # channel c: 1 at input row (column) c
        # The other dim kept at 2, mapped to itself (torch's kernel treats a dim of 1 apart).
        image = (basis[:, :, None].expand(-1, -1, 2) if axis == 0 else basis[:, None, :].expand(-1, 2, -1))[None]
        target = [out[0], 2] if axis == 0 else [2, out[1]]
        scale = [scales[0], None] if axis == 0 else [None, scales[1]]
        mapped = op(image.contiguous(), target, align_corners, *scale)  # [1, in, out0 or 2, 2 or out1]
        matrices.append((mapped[0, :, :, 0] if axis == 0 else mapped[0, :, 0, :]).T.contiguous())
    return matrices


@converter(*_AA, validator=_static_spatial)
def upsample_aa(ctx: ConversionContext, node: Node, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Antialiased resize (`interpolate(..., antialias=True)`, torchvision's `Resize` on tensors):
    separable, so one matrix product per spatial dim with the weights torch's op gives."""
    size = tuple(int(d) for d in node.args[0].meta["val"].shape[-2:])  # type: ignore[union-attr]
    out = tuple(int(d) for d in out_val(node).shape[-2:])
    scales: tuple[float | None, float | None] = (None, None)
    if aten_op(node.target)._overloadname == "vec":
        factors = v.arg(node, 3, "scale_factors")
        scales = (float(factors[0]), float(factors[1])) if factors else (None, None)
    else:
        scales = (v.arg(node, 3, "scales_h"), v.arg(node, 4, "scales_w"))
    matrices = resize_matrices(_AA[aten_op(node.target)], size, out, bool(args[2]), scales)  # type: ignore[arg-type]
    return separable_linear(ctx, args[0], matrices)


_GRID_MODES = {0: "LINEAR", 1: "NEAREST", 2: "CUBIC"}  # torch's interpolation_mode -> TensorRT's
_GRID_PADDING = {0: "FILL", 1: "CLAMP", 2: "REFLECT"}  # torch's padding_mode (zeros, border, reflection)


@converter(aten.grid_sampler_2d.default, validator=v.all_of(v.FLOAT_ONLY, v.rank_between(4, 4)))
def grid_sampler_2d(ctx: ConversionContext, node: Node, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """`grid_sample`: the input [N, C, H, W] read at the grid's [N, H', W', 2] points (x, y in -1..1)."""
    t = trt()
    dtype = ctx.node_dtype(node)
    layer = ctx.network.add_grid_sample(ctx.cast(args[0], dtype), ctx.cast(args[1], dtype))
    layer.interpolation_mode = getattr(t.InterpolationMode, _GRID_MODES[int(args[2])])
    layer.sample_mode = getattr(t.SampleMode, _GRID_PADDING[int(args[3])])
    layer.align_corners = bool(args[4])
    return layer.get_output(0)
