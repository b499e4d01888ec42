"""Converters for nearest and bilinear upsampling (2-D)."""

from __future__ import annotations

from typing import Any

import torch

from pipeline.tensorrt.context import ConversionContext
from pipeline.tensorrt.converters import _validators as v
from pipeline.tensorrt.converters._layers import out_val
from pipeline.tensorrt.converters.registry import converter
from pipeline.tensorrt.trt_api import trt

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
