"""Converters for reductions (mean, sum, prod, amax/amin, max/min with indices, argmax/argmin,
var, any, vector norms), top-k and sort, and cumulative sums."""

from __future__ import annotations

import math
from typing import Any

import torch

from pipeline.engine.context import ConversionContext
from pipeline.engine.converters import _validators as v
from pipeline.engine.converters._layers import axes_mask, elementwise, ew_ops, norm_dim, unary, unary_ops
from pipeline.engine.converters.registry import aten_op, converter
from pipeline.engine.trt_api import trt

aten = torch.ops.aten
Node = torch.fx.Node


def _reduce(ctx: ConversionContext, node: Node, x: Any, op: str, dims: Any, keepdim: bool) -> Any:
    x = ctx.cast(x, ctx.node_dtype(node))
    rank = len(x.shape)
    if rank == 0:
        return x
    dims = list(range(rank)) if dims is None or len(dims) == 0 else list(dims)
    layer = ctx.network.add_reduce(x, getattr(trt().ReduceOperation, op), axes_mask(dims, rank), bool(keepdim))
    return layer.get_output(0)


@converter(aten.mean.dim, aten.mean.default, validator=v.FLOAT_ONLY)
def mean(ctx: ConversionContext, node: Node, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return _reduce(ctx, node, args[0], "AVG", v.arg(node, 1, "dim"), v.arg(node, 2, "keepdim", False))


@converter(aten.sum.dim_IntList, aten.sum.default, validator=v.tensor_dtypes(v.NUMERIC_DTYPES))
def sum_(ctx: ConversionContext, node: Node, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    if aten_op(node.target) is aten.sum.default:
        return _reduce(ctx, node, args[0], "SUM", None, False)
    return _reduce(ctx, node, args[0], "SUM", v.arg(node, 1, "dim"), v.arg(node, 2, "keepdim", False))


@converter(aten.amax.default, validator=v.tensor_dtypes(v.NUMERIC_DTYPES))
def amax(ctx: ConversionContext, node: Node, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return _reduce(ctx, node, args[0], "MAX", v.arg(node, 1, "dim", []), v.arg(node, 2, "keepdim", False))


@converter(aten.amin.default, validator=v.tensor_dtypes(v.NUMERIC_DTYPES))
def amin(ctx: ConversionContext, node: Node, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return _reduce(ctx, node, args[0], "MIN", v.arg(node, 1, "dim", []), v.arg(node, 2, "keepdim", False))


@converter(aten.cumsum.default, validator=v.tensor_dtypes(v.NUMERIC_DTYPES))
def cumsum(ctx: ConversionContext, node: Node, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    x = ctx.cast(args[0], ctx.node_dtype(node))
    if len(x.shape) == 0:
        return x
    axis = ctx.constant(torch.tensor(norm_dim(int(args[1]), len(x.shape))), torch.int32)
    return ctx.network.add_cumulative(x, axis, trt().CumulativeOperation.SUM, False, False).get_output(0)


@converter(aten.cumprod.default, validator=v.FLOAT_ONLY)
def cumprod(ctx: ConversionContext, node: Node, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """A running product as TensorRT has only running sums: exp(cumsum(log|x|)) (a zero makes the sum
    -inf, so every product after it 0), with the sign of the running count of negative factors; in
    fp32 whatever the input's dtype."""
    x = ctx.cast(args[0], torch.float32)
    if len(x.shape) == 0:
        return ctx.cast(x, ctx.node_dtype(node))
    axis = ctx.constant(torch.tensor(norm_dim(int(args[1]), len(x.shape))), torch.int32)

    def running_sum(t: Any) -> Any:
        return ctx.network.add_cumulative(t, axis, trt().CumulativeOperation.SUM, False, False).get_output(0)

    magnitude = unary(ctx, running_sum(unary(ctx, unary(ctx, x, unary_ops().ABS), unary_ops().LOG)), unary_ops().EXP)
    negatives = running_sum(ctx.cast(elementwise(ctx, ew_ops().LESS, x, ctx.tensor(0.0, like=x)), torch.float32))
    half = elementwise(ctx, ew_ops().PROD, negatives, ctx.tensor(0.5, like=negatives))
    odd = elementwise(ctx, ew_ops().SUB, half, unary(ctx, half, unary_ops().FLOOR))  # 0.5 where the count is odd
    sign = elementwise(ctx, ew_ops().SUB, ctx.tensor(1.0, like=odd), elementwise(ctx, ew_ops().PROD, odd, ctx.tensor(4.0, like=odd)))
    return ctx.cast(elementwise(ctx, ew_ops().PROD, magnitude, sign), ctx.node_dtype(node))


@converter(aten.prod.dim_int, aten.prod.default, validator=v.tensor_dtypes(v.NUMERIC_DTYPES))
def prod(ctx: ConversionContext, node: Node, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    if aten_op(node.target) is aten.prod.default:
        return _reduce(ctx, node, args[0], "PROD", None, False)
    return _reduce(ctx, node, args[0], "PROD", [v.arg(node, 1, "dim")], v.arg(node, 2, "keepdim", False))


@converter(aten.max.default, aten.min.default, validator=v.tensor_dtypes(v.NUMERIC_DTYPES))
def max_all(ctx: ConversionContext, node: Node, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return _reduce(ctx, node, args[0], "MAX" if aten_op(node.target) is aten.max.default else "MIN", None, False)


@converter(aten.any.dim, aten.any.dims, aten.any.default, validator=v.NUMERIC)
def any_(ctx: ConversionContext, node: Node, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    x = args[0]
    nonzero = x if x.dtype == trt().bool else elementwise(ctx, ew_ops().EQUAL, x, ctx.tensor(0, like=x))
    if x.dtype != trt().bool:
        nonzero = unary(ctx, nonzero, unary_ops().NOT)
    as_int = ctx.cast(nonzero, torch.int32)
    dims = v.arg(node, 1, "dim")
    dims = None if dims is None else (list(dims) if isinstance(dims, (list, tuple)) else [dims])
    rank = len(as_int.shape)
    dims = list(range(rank)) if not dims else dims
    layer = ctx.network.add_reduce(as_int, trt().ReduceOperation.MAX, axes_mask(dims, rank), bool(v.arg(node, 2, "keepdim", False)))
    return ctx.cast(layer.get_output(0), torch.bool)


def _topk_layer(ctx: ConversionContext, x: Any, k: int, dim: int, largest: bool) -> tuple[Any, Any]:
    """Top-k values and int64 indices along `dim` (TensorRT's layer wants two dims or more)."""
    rank = len(x.shape)
    if rank < 2:
        x, dim = ctx.reshape(x, [1] * (2 - rank) + ctx.dims(x)), dim + 2 - rank
    op = trt().TopKOperation.MAX if largest else trt().TopKOperation.MIN
    layer = ctx.network.add_topk(x, op, int(k), axes_mask([dim], 2 if rank < 2 else rank))
    values, indices = layer.get_output(0), ctx.cast(layer.get_output(1), torch.int64)
    if rank < 2:
        values, indices = (ctx.reshape(t, ctx.dims(t)[2 - rank:]) for t in (values, indices))
    return values, indices


def _static_dim(index: int, name: str) -> Any:
    def check(node: Node, spec: Any) -> str | None:
        shape = node.args[0].meta["val"].shape  # type: ignore[union-attr]
        dim = v.arg(node, index, name)
        if dim is None or not shape:
            return None
        if not isinstance(shape[norm_dim(int(dim), len(shape))], int):
            return f"{name} must be a static dim"
        return None

    return check


@converter(aten.max.dim, aten.min.dim, validator=v.all_of(v.tensor_dtypes(v.NUMERIC_DTYPES), _static_dim(1, "dim")))
def max_dim(ctx: ConversionContext, node: Node, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Values and int64 indices of the largest (smallest) element along `dim` (one top-k)."""
    x = ctx.cast(args[0], ctx.node_dtype(node))
    dim = norm_dim(int(args[1]), len(x.shape))
    values, indices = _topk_layer(ctx, x, 1, dim, aten_op(node.target) is aten.max.dim)
    if not v.arg(node, 2, "keepdim", False):
        values, indices = (_drop_dim(ctx, t, dim) for t in (values, indices))
    return values, indices


@converter(aten.argmax.default, aten.argmin.default, validator=v.tensor_dtypes(v.NUMERIC_DTYPES))
def argmax(ctx: ConversionContext, node: Node, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    x = args[0]
    dim = v.arg(node, 1, "dim")
    keepdim = bool(v.arg(node, 2, "keepdim", False))
    if dim is None:  # over the flattened input
        x, dim, keepdim = ctx.reshape(x, (-1,)), 0, False
    dim = norm_dim(int(dim), len(x.shape))
    _, indices = _topk_layer(ctx, x, 1, dim, aten_op(node.target) is aten.argmax.default)
    return indices if keepdim else _drop_dim(ctx, indices, dim)


def _drop_dim(ctx: ConversionContext, x: Any, dim: int) -> Any:
    dims = ctx.dims(x)
    return ctx.reshape(x, dims[:dim] + dims[dim + 1:])


def _topk_ok(node: Node, spec: Any) -> str | None:
    if not isinstance(node.args[1], int) or node.args[1] > 3840:
        return "k must be a constant of at most 3840 (TensorRT's top-k limit)"
    return _static_dim(2, "dim")(node, spec)


@converter(aten.topk.default, validator=v.all_of(v.tensor_dtypes(v.NUMERIC_DTYPES), _topk_ok))
def topk(ctx: ConversionContext, node: Node, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """TensorRT's top-k, largest or smallest first; `sorted=False` (any order: a mixture of experts'
    router) gets that order too."""
    x = ctx.cast(args[0], ctx.node_dtype(node))
    dim = norm_dim(int(v.arg(node, 2, "dim", -1)), len(x.shape))
    return _topk_layer(ctx, x, int(args[1]), dim, bool(v.arg(node, 3, "largest", True)))


def _sort_ok(node: Node, spec: Any) -> str | None:
    shape = node.args[0].meta["val"].shape  # type: ignore[union-attr]
    dim = norm_dim(int(v.arg(node, 1, "dim", -1)), max(len(shape), 1))
    if shape and not isinstance(shape[dim], int):
        return "sort needs a static size along its dim"
    if shape and shape[dim] > 3840:
        return f"sort along a dim of {shape[dim]} elements: TensorRT's top-k takes at most 3840"
    if node.kwargs.get("stable"):
        return "a stable sort: TensorRT's top-k does not promise the order of equal values"
    return None


@converter(aten.sort.default, aten.sort.stable, validator=v.all_of(v.tensor_dtypes(v.NUMERIC_DTYPES), _sort_ok))
def sort(ctx: ConversionContext, node: Node, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Values and int64 indices in order along `dim`: a top-k of every element."""
    x = ctx.cast(args[0], ctx.node_dtype(node))
    if not x.shape:
        return x, ctx.constant(torch.tensor(0), torch.int64)
    dim = norm_dim(int(v.arg(node, 1, "dim", -1)), len(x.shape))
    return _topk_layer(ctx, x, int(x.shape[dim]), dim, bool(v.arg(node, 2, "descending", False)))


def _reduced_count(node: Node) -> int | None:
    shape = node.args[0].meta["val"].shape  # type: ignore[union-attr]
    dims = v.arg(node, 1, "dim")
    dims = range(len(shape)) if dims is None or len(dims) == 0 else dims
    count = 1
    for d in dims:
        size = shape[norm_dim(int(d), len(shape))]
        if not isinstance(size, int):
            return None
        count *= size
    return count


_VAR_OK = v.all_of(v.FLOAT_ONLY, v.predicate(lambda n: _reduced_count(n) is not None, "var over a dynamic dim"))


@converter(aten.var.correction, aten.var_mean.correction, validator=_VAR_OK)
def var(ctx: ConversionContext, node: Node, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Mean of squared deviations over `dim`, divided by (N - correction) / N."""
    x = ctx.cast(args[0], ctx.node_dtype(node))
    rank = len(x.shape)
    dims = v.arg(node, 1, "dim")
    dims = list(range(rank)) if dims is None or len(dims) == 0 else [norm_dim(int(d), rank) for d in dims]
    keepdim = bool(kwargs.get("keepdim", False))
    correction = kwargs.get("correction")
    correction = 1 if correction is None else correction
    count = _reduced_count(node)
    mask = axes_mask(dims, rank)
    mean = ctx.network.add_reduce(x, trt().ReduceOperation.AVG, mask, True).get_output(0)
    deviation = elementwise(ctx, ew_ops().SUB, x, mean)
    squared = elementwise(ctx, ew_ops().PROD, deviation, deviation)
    out = ctx.network.add_reduce(squared, trt().ReduceOperation.SUM, mask, keepdim).get_output(0)
    out = elementwise(ctx, ew_ops().PROD, out, ctx.tensor(1.0 / max(count - correction, 0) if count > correction else float("inf"), like=out))
    if aten_op(node.target) is aten.var.correction:
        return out
    mean = mean if keepdim else ctx.network.add_reduce(x, trt().ReduceOperation.AVG, mask, False).get_output(0)
    return out, mean


def _norm_ok(node: Node, spec: Any) -> str | None:
    order = v.arg(node, 1, "ord", 2)
    if isinstance(order, Node) or order == 0:
        return f"vector norm of order {order!r} is not supported"
    return v.FLOAT_ONLY(node, spec)


@converter(aten.linalg_vector_norm.default, validator=_norm_ok)
def vector_norm(ctx: ConversionContext, node: Node, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    x = ctx.cast(args[0], ctx.node_dtype(node))
    order = float(v.arg(node, 1, "ord", 2))
    rank = len(x.shape)
    dims = v.arg(node, 2, "dim")
    dims = list(range(rank)) if dims is None or len(dims) == 0 else list(dims)
    keepdim = bool(v.arg(node, 3, "keepdim", False))
    if order == 2:  # x * x is |x| * |x|
        return unary(ctx, _reduce(ctx, node, elementwise(ctx, ew_ops().PROD, x, x), "SUM", dims, keepdim), unary_ops().SQRT)
    magnitude = unary(ctx, x, unary_ops().ABS)
    if math.isinf(order):
        return _reduce(ctx, node, magnitude, "MAX" if order > 0 else "MIN", dims, keepdim)
    if order == 1:
        return _reduce(ctx, node, magnitude, "SUM", dims, keepdim)
    powered = elementwise(ctx, ew_ops().POW, magnitude, ctx.tensor(order, like=magnitude))
    total = _reduce(ctx, node, powered, "SUM", dims, keepdim)
    return elementwise(ctx, ew_ops().POW, total, ctx.tensor(1.0 / order, like=total))
