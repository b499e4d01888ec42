"""Converters for max/avg pooling and adaptive average pooling (2-D)."""

from __future__ import annotations

from typing import Any

import torch

from pipeline.tensorrt.context import ConversionContext
from pipeline.tensorrt.converters import _validators as v
from pipeline.tensorrt.converters._layers import axes_mask
from pipeline.tensorrt.converters.registry import converter
from pipeline.tensorrt.trt_api import trt

aten = torch.ops.aten
Node = torch.fx.Node


def _pair(values: Any, default: Any = None) -> tuple[int, int]:
    values = list(values) if values else list(default)
    return (int(values[0]), int(values[-1]))


def _static_spatial(node: Node) -> bool:
    shape = node.args[0].meta["val"].shape  # type: ignore[union-attr]
    return all(isinstance(d, int) for d in shape[-2:])


def _pool(ctx: ConversionContext, x: Any, kind: Any, kernel: Any, stride: Any, padding: Any, ceil: bool) -> Any:
    layer = ctx.network.add_pooling_nd(x, kind, _pair(kernel))
    layer.stride_nd = _pair(stride, kernel)
    layer.padding_nd = _pair(padding, (0,))
    if ceil:
        layer.padding_mode = trt().PaddingMode.EXPLICIT_ROUND_UP
    return layer


def _indices_unused(node: Node) -> bool:
    return all(u.target.__name__ == "getitem" and u.args[1] == 0 for u in node.users)  # type: ignore[union-attr]


_MAX_OK = v.all_of(
    v.FLOAT_ONLY,
    v.rank_between(3, 4),
    v.predicate(lambda n: all(d == 1 for d in v.arg(n, 4, "dilation", [1])), "max pooling with dilation != 1"),
    v.predicate(lambda n: "with_indices" not in str(n.target) or _indices_unused(n), "max pooling indices are used"),
)


@converter(aten.max_pool2d.default, aten.max_pool2d_with_indices.default, validator=_MAX_OK)
def max_pool2d(ctx: ConversionContext, node: Node, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    kernel = args[1]
    stride = v.arg(node, 2, "stride", None) or kernel
    padding = v.arg(node, 3, "padding", [0])
    ceil = bool(v.arg(node, 5, "ceil_mode", False))
    out = _pool(ctx, args[0], trt().PoolingType.MAX, kernel, stride, padding, ceil).get_output(0)
    return (out, None) if "with_indices" in str(node.target) else out


_AVG_OK = v.all_of(
    v.FLOAT_ONLY,
    v.rank_between(3, 4),
    v.predicate(lambda n: v.arg(n, 6, "divisor_override") is None, "avg pooling with divisor_override"),
)


@converter(aten.avg_pool2d.default, validator=_AVG_OK)
def avg_pool2d(ctx: ConversionContext, node: Node, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    kernel = args[1]
    stride = v.arg(node, 2, "stride", None) or kernel
    layer = _pool(ctx, args[0], trt().PoolingType.AVERAGE, kernel, stride, v.arg(node, 3, "padding", [0]),
                  bool(v.arg(node, 4, "ceil_mode", False)))
    layer.average_count_excludes_padding = not bool(v.arg(node, 5, "count_include_pad", True))
    return layer.get_output(0)


def _adaptive_ok(node: Node, spec: Any) -> str | None:
    if _pair(node.args[1]) == (1, 1):  # global pooling: a reduction, for any spatial size
        return v.FLOAT_ONLY(node, spec)
    if not _static_spatial(node):
        return "adaptive pooling needs static spatial dims"
    shape = node.args[0].meta["val"].shape  # type: ignore[union-attr]
    out = _pair(node.args[1])
    if any(s % o for s, o in zip(shape[-2:], out)):
        return f"adaptive pooling from {tuple(shape[-2:])} to {out} needs sizes that divide evenly"
    return v.FLOAT_ONLY(node, spec)


@converter(aten.adaptive_avg_pool2d.default, aten._adaptive_avg_pool2d.default, validator=_adaptive_ok)
def adaptive_avg_pool2d(ctx: ConversionContext, node: Node, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    out = _pair(args[1])
    if out == (1, 1):
        # Global pooling as a mean over H and W: TensorRT-RTX runs it faster than a full-window
        # pooling layer (MobileNetV3-Small on the H200: 0.229 instead of 0.255 ms per engine run).
        rank = len(args[0].shape)
        return ctx.network.add_reduce(args[0], trt().ReduceOperation.AVG, axes_mask((rank - 2, rank - 1), rank),
                                      True).get_output(0)
    shape = node.args[0].meta["val"].shape  # type: ignore[union-attr]
    kernel = tuple(int(s) // o for s, o in zip(shape[-2:], out))
    return _pool(ctx, args[0], trt().PoolingType.AVERAGE, kernel, kernel, (0,), False).get_output(0)
