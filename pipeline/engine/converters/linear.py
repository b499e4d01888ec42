"""Converters for matrix products: mm, bmm, addmm, linear, matmul."""

from __future__ import annotations

from typing import Any

import torch

from pipeline.engine.context import ConversionContext
from pipeline.engine.converters import _validators as v
from pipeline.engine.converters._layers import elementwise, ew_ops, promoted, unsqueeze_to
from pipeline.engine.converters.registry import converter
from pipeline.engine.trt_api import trt

aten = torch.ops.aten
Node = torch.fx.Node
_FLOAT = v.FLOAT_ONLY


def matmul_layer(ctx: ConversionContext, a: Any, b: Any, transpose_b: bool = False, dtype: torch.dtype | None = None) -> Any:
    """a @ b with torch's rules for 1-D operands and broadcast batch dims, in `dtype` (default: the
    compute precision)."""
    mop = trt().MatrixOperation
    dtype = dtype or ctx.compute(torch.float32)
    a, b = ctx.cast(a, dtype), ctx.cast(b, dtype)
    op_a = mop.VECTOR if len(a.shape) == 1 else mop.NONE
    op_b = mop.VECTOR if len(b.shape) == 1 else (mop.TRANSPOSE if transpose_b else mop.NONE)
    if op_a != mop.VECTOR and op_b != mop.VECTOR:
        rank = max(len(a.shape), len(b.shape))
        a, b = unsqueeze_to(ctx, a, rank), unsqueeze_to(ctx, b, rank)
    return ctx.network.add_matrix_multiply(a, op_a, b, op_b).get_output(0)


@converter(aten.mm.default, validator=v.all_of(_FLOAT, v.rank_between(2, 2)))
def mm(ctx: ConversionContext, node: Node, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return matmul_layer(ctx, args[0], args[1], dtype=ctx.node_dtype(node))


@converter(aten.bmm.default, validator=v.all_of(_FLOAT, v.rank_between(3, 3)))
def bmm(ctx: ConversionContext, node: Node, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return matmul_layer(ctx, args[0], args[1], dtype=ctx.node_dtype(node))


@converter(aten.matmul.default, validator=v.all_of(_FLOAT, v.rank_between(1, 8)))
def matmul(ctx: ConversionContext, node: Node, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return matmul_layer(ctx, args[0], args[1], dtype=ctx.node_dtype(node))


def _times(ctx: ConversionContext, node: Node, x: Any, factor: Any) -> Any:
    if factor == 1:
        return x
    return elementwise(ctx, ew_ops().PROD, *promoted(ctx, node, x, factor, ctx.node_dtype(node)))


@converter(aten.addmm.default, validator=_FLOAT)
def addmm(ctx: ConversionContext, node: Node, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    product = _times(ctx, node, matmul_layer(ctx, args[1], args[2]), kwargs.get("alpha", 1))
    bias = _times(ctx, node, args[0], kwargs.get("beta", 1))
    return elementwise(ctx, ew_ops().SUM, *promoted(ctx, node, product, bias, ctx.node_dtype(node)))


@converter(aten.linear.default, validator=v.all_of(_FLOAT, v.rank_between(1, 8)))
def linear(ctx: ConversionContext, node: Node, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    out = matmul_layer(ctx, args[0], args[1], transpose_b=True)
    bias = args[2] if len(args) > 2 else kwargs.get("bias")
    if bias is None:
        return out
    return elementwise(ctx, ew_ops().SUM, *promoted(ctx, node, out, bias, ctx.node_dtype(node)))
