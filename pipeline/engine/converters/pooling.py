"""Converters for max/avg pooling and adaptive average and max pooling, 2-D (images) and 3-D (video)."""

from __future__ import annotations

import math
import operator
from typing import Any

import torch

from pipeline.engine.context import ConversionContext
from pipeline.engine.converters import _validators as v
from pipeline.engine.converters._layers import axes_mask, separable_linear, slice_layer
from pipeline.engine.converters.registry import aten_op, converter
from pipeline.engine.trt_api import trt

aten = torch.ops.aten
Node = torch.fx.Node
# Spatial dims of each op's window (the dims that follow batch and channels).
_SPATIAL = {
    aten.max_pool2d.default: 2, aten.max_pool2d_with_indices.default: 2, aten.avg_pool2d.default: 2,
    aten.adaptive_avg_pool2d.default: 2, aten._adaptive_avg_pool2d.default: 2,
    aten.max_pool3d.default: 3, aten.max_pool3d_with_indices.default: 3, aten.avg_pool3d.default: 3,
    aten.adaptive_avg_pool3d.default: 3, aten._adaptive_avg_pool3d.default: 3,
    aten.adaptive_max_pool2d.default: 2, aten.adaptive_max_pool3d.default: 3,
}
_WITH_INDICES = (aten.max_pool2d_with_indices.default, aten.max_pool3d_with_indices.default)
_WINDOWS_LIMIT = 256  # unequal windows along one dim an adaptive max pooling takes (a slice and a reduction each)


def _spatial(node: Node) -> int:
    return _SPATIAL[aten_op(node.target)]


def _sizes(values: Any, n: int, default: Any = None) -> tuple[int, ...]:
    """`n` window sizes from torch's argument: one value for every dim, or one per dim."""
    values = list(values) if values else list(default)
    return tuple(int(values[i] if len(values) == n else values[0]) for i in range(n))


def _in_shape(node: Node) -> Any:
    return node.args[0].meta["val"].shape  # type: ignore[union-attr]


def _pool(ctx: ConversionContext, node: Node, x: Any, kind: Any, kernel: Any, stride: Any, padding: Any, ceil: bool) -> Any:
    n = _spatial(node)
    layer = ctx.network.add_pooling_nd(x, kind, _sizes(kernel, n))
    layer.stride_nd = _sizes(stride, n, kernel)
    layer.padding_nd = _sizes(padding, n, (0,))
    if ceil:
        layer.padding_mode = trt().PaddingMode.EXPLICIT_ROUND_UP
    return layer


def _indices_unused(node: Node) -> bool:
    return all(u.target is operator.getitem and u.args[1] == 0 for u in node.users)


def _rank_ok(node: Node, spec: Any) -> str | None:
    n = _spatial(node)
    return v.rank_between(n + 1, n + 2)(node, spec)


_MAX_OK = v.all_of(
    v.FLOAT_ONLY,
    _rank_ok,
    v.predicate(lambda n: all(d == 1 for d in v.arg(n, 4, "dilation", [1])), "max pooling with dilation != 1"),
    v.predicate(lambda n: aten_op(n.target) not in _WITH_INDICES or _indices_unused(n), "max pooling indices are used"),
)


@converter(aten.max_pool2d.default, aten.max_pool2d_with_indices.default, aten.max_pool3d.default,
           aten.max_pool3d_with_indices.default, validator=_MAX_OK)
def max_pool(ctx: ConversionContext, node: Node, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    kernel = args[1]
    stride = v.arg(node, 2, "stride", None) or kernel
    padding = v.arg(node, 3, "padding", [0])
    ceil = bool(v.arg(node, 5, "ceil_mode", False))
    out = _pool(ctx, node, args[0], trt().PoolingType.MAX, kernel, stride, padding, ceil).get_output(0)
    return (out, None) if aten_op(node.target) in _WITH_INDICES else out


_AVG_OK = v.all_of(
    v.FLOAT_ONLY,
    _rank_ok,
    v.predicate(lambda n: v.arg(n, 6, "divisor_override") is None, "avg pooling with divisor_override"),
)


@converter(aten.avg_pool2d.default, aten.avg_pool3d.default, validator=_AVG_OK)
def avg_pool(ctx: ConversionContext, node: Node, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    kernel = args[1]
    stride = v.arg(node, 2, "stride", None) or kernel
    layer = _pool(ctx, node, args[0], trt().PoolingType.AVERAGE, kernel, stride, v.arg(node, 3, "padding", [0]),
                  bool(v.arg(node, 4, "ceil_mode", False)))
    layer.average_count_excludes_padding = not bool(v.arg(node, 5, "count_include_pad", True))
    return layer.get_output(0)


def _adaptive_ok(node: Node, spec: Any) -> str | None:
    n = _spatial(node)
    if _sizes(node.args[1], n) == (1,) * n:  # global pooling: a reduction, for any spatial size
        return v.FLOAT_ONLY(node, spec)
    if not all(isinstance(d, int) for d in _in_shape(node)[-n:]):
        return "adaptive pooling to more than one value per channel needs static spatial dims"
    return v.FLOAT_ONLY(node, spec)


def box_average(size: int, out: int) -> torch.Tensor:
    """The [out, size] matrix of adaptive average pooling along one dim: row o averages torch's
    window floor(o*size/out) .. ceil((o+1)*size/out)."""
    matrix = torch.zeros(out, size, dtype=torch.float64)
    for o in range(out):
        start, end = (o * size) // out, math.ceil((o + 1) * size / out)
        matrix[o, start:end] = 1.0 / (end - start)
    return matrix


@converter(aten.adaptive_avg_pool2d.default, aten._adaptive_avg_pool2d.default, aten.adaptive_avg_pool3d.default,
           aten._adaptive_avg_pool3d.default, validator=_adaptive_ok)
def adaptive_avg_pool(ctx: ConversionContext, node: Node, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    n = _spatial(node)
    out = _sizes(args[1], n)
    rank = len(args[0].shape)
    if out == (1,) * n:
        # Global pooling as a mean over the spatial dims: TensorRT-RTX runs it faster than a
        # full-window pooling layer (MobileNetV3-Small on the H200: 0.229 instead of 0.255 ms per engine run).
        return ctx.network.add_reduce(args[0], trt().ReduceOperation.AVG, axes_mask(range(rank - n, rank), rank),
                                      True).get_output(0)
    sizes = [int(s) for s in _in_shape(node)[-n:]]
    if all(s % o == 0 for s, o in zip(sizes, out)):  # equal windows: one pooling layer
        kernel = tuple(s // o for s, o in zip(sizes, out))
        return _pool(ctx, node, args[0], trt().PoolingType.AVERAGE, kernel, kernel, (0,), False).get_output(0)
    # Windows of unequal sizes (7 -> 3: 0..3, 2..5, 4..7): an average over boxes is separable, one
    # matrix product per dim.
    return separable_linear(ctx, args[0], [box_average(s, o) for s, o in zip(sizes, out)])


_ADAPTIVE_MAX_OK = v.all_of(
    _adaptive_ok,
    _rank_ok,
    v.predicate(_indices_unused, "adaptive max pooling indices are used"),
    v.predicate(lambda n: max(_sizes(n.args[1], _spatial(n))) <= _WINDOWS_LIMIT,
                f"adaptive max pooling to more than {_WINDOWS_LIMIT} values along a dim"),
)


@converter(aten.adaptive_max_pool2d.default, aten.adaptive_max_pool3d.default, validator=_ADAPTIVE_MAX_OK)
def adaptive_max_pool(ctx: ConversionContext, node: Node, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """torch's windows floor(o*size/out) .. ceil((o+1)*size/out) per dim: one pooling layer where they are
    equal, else (a maximum over boxes is separable) each dim's windows sliced and reduced in turn."""
    n, x = _spatial(node), args[0]
    out, rank = _sizes(args[1], n), len(x.shape)
    if out == (1,) * n:
        return ctx.network.add_reduce(x, trt().ReduceOperation.MAX, axes_mask(range(rank - n, rank), rank), True).get_output(0), None
    sizes = [int(s) for s in _in_shape(node)[-n:]]
    if all(s % o == 0 for s, o in zip(sizes, out)):
        kernel = tuple(s // o for s, o in zip(sizes, out))
        return _pool(ctx, node, x, trt().PoolingType.MAX, kernel, kernel, (0,), False).get_output(0), None
    for axis, size, count in zip(range(rank - n, rank), sizes, out):
        if size != count:
            x = _window_maxima(ctx, x, axis, size, count)
    return x, None


def _window_maxima(ctx: ConversionContext, x: Any, axis: int, size: int, out: int) -> Any:
    """Along `axis`, the maximum of each of adaptive pooling's `out` windows over `size` values."""
    dims, rank, parts = ctx.dims(x), len(x.shape), []
    for o in range(out):
        start, end = (o * size) // out, math.ceil((o + 1) * size / out)
        window = slice_layer(ctx, x, [start if d == axis else 0 for d in range(rank)],
                             [end - start if d == axis else dims[d] for d in range(rank)], [1] * rank)
        parts.append(ctx.network.add_reduce(window, trt().ReduceOperation.MAX, 1 << axis, True).get_output(0))
    layer = ctx.network.add_concatenation(parts)
    layer.axis = axis
    return layer.get_output(0)
