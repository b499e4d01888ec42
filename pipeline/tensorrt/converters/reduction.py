"""Converters for mean, sum and amax/amin reductions."""

from __future__ import annotations

from typing import Any

import torch

from pipeline.tensorrt.context import ConversionContext
from pipeline.tensorrt.converters import _validators as v
from pipeline.tensorrt.converters._layers import axes_mask
from pipeline.tensorrt.converters.registry import aten_op, converter
from pipeline.tensorrt.trt_api import trt

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
