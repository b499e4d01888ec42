"""Converters for batch norm (running or batch statistics: instance norm comes here), layer norm and group norm."""

from __future__ import annotations

from typing import Any

import torch

from pipeline.engine.context import ConversionContext
from pipeline.engine.converters import _validators as v
from pipeline.engine.converters._layers import axes_mask, elementwise, ew_ops, unary, unary_ops, unsqueeze_to
from pipeline.engine.converters.registry import aten_op, converter
from pipeline.engine.trt_api import trt

aten = torch.ops.aten
Node = torch.fx.Node


def _only_first_output_used(node: Node) -> bool:
    return all(getattr(u.target, "__name__", "") == "getitem" and u.args[1] == 0 for u in node.users)


def _per_channel(ctx: ConversionContext, t: Any, rank: int, dtype: torch.dtype) -> Any:
    """A [C] tensor reshaped to [1, C, 1, ...] for a rank-`rank` input."""
    return ctx.reshape(ctx.cast(t, dtype), (1, -1) + (1,) * (rank - 2))


_BN_OK = v.all_of(
    v.FLOAT_ONLY,
    v.rank_between(2, 5),
    v.predicate(_only_first_output_used, "batch-norm statistics outputs are used (training mode?)"),
)


def batch_norm_folded_into(ctx: ConversionContext, conv: Node) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The (weight, bias) of convolution `conv` with its only consumer, an inference batch norm on
    constant statistics, folded in (computed in float64, kept as fp32); None when it does not apply.

    The batch norm's converter then passes the convolution's output through (`ctx.folded`).
    """
    users = list(conv.users)
    weight = ctx.constants.get(conv.args[1])  # type: ignore[arg-type]
    if conv.args[6] or len(users) != 1 or weight is None:  # transposed kernels keep out-channels on dim 1
        return None
    bn = users[0]
    if aten_op(bn.target) != aten._native_batch_norm_legit_no_training.default or not _only_first_output_used(bn):
        return None
    known = [conv.args[2], *bn.args[1:5]]  # conv bias, gamma, beta, running mean, running var
    if any(isinstance(a, Node) and a not in ctx.constants for a in known):
        return None
    bias, gamma, beta, mean, var = (ctx.constants[a].double() if isinstance(a, Node) else a for a in known)
    if mean is None or var is None:
        return None
    scale = torch.rsqrt(var + float(bn.args[6]))  # type: ignore[arg-type]
    scale = scale if gamma is None else scale * gamma
    shift = ((bias if bias is not None else 0.0) - mean) * scale + (beta if beta is not None else 0.0)
    folded_weight = weight.double() * scale.reshape((-1,) + (1,) * (weight.dim() - 1))
    ctx.folded.add(bn)
    return folded_weight.to(torch.float32), shift.to(torch.float32)


@converter(aten._native_batch_norm_legit_no_training.default, validator=_BN_OK)
def batch_norm(ctx: ConversionContext, node: Node, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    x, weight, bias, mean, var, _, eps = args[:7]
    if node in ctx.folded:  # the convolution before it applies it
        return (x, None, None)
    dtype = ctx.node_dtype(node)
    x = ctx.cast(x, dtype)
    rank = len(x.shape)
    # Statistics combine in fp32 before the cast: var + eps underflows in fp16 for small eps.
    f32 = torch.float32
    eps_t = ctx.constant(torch.tensor([eps]), f32)
    inv_std = unary(ctx, unary(ctx, elementwise(ctx, ew_ops().SUM, ctx.cast(var, f32), eps_t), unary_ops().SQRT), unary_ops().RECIP)
    scale = inv_std if weight is None else elementwise(ctx, ew_ops().PROD, inv_std, ctx.cast(weight, f32))
    shift = elementwise(ctx, ew_ops().PROD, ctx.cast(mean, f32), scale)
    shift = unary(ctx, shift, unary_ops().NEG) if bias is None else elementwise(ctx, ew_ops().SUB, ctx.cast(bias, f32), shift)
    y = elementwise(ctx, ew_ops().PROD, x, _per_channel(ctx, scale, rank, dtype))
    return (elementwise(ctx, ew_ops().SUM, y, _per_channel(ctx, shift, rank, dtype)), None, None)


def _layer_norm_ok(node: Node, spec: Any) -> str | None:
    if aten_op(node.target) == aten.native_layer_norm.default and not _only_first_output_used(node):
        return "layer-norm mean/rstd outputs are used"
    return v.FLOAT_ONLY(node, spec)


@converter(aten.native_layer_norm.default, aten.layer_norm.default, validator=_layer_norm_ok)
def layer_norm(ctx: ConversionContext, node: Node, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    x, shape = args[0], list(args[1])
    weight = args[2] if len(args) > 2 else None
    bias = args[3] if len(args) > 3 else kwargs.get("bias")
    eps = args[4] if len(args) > 4 else kwargs.get("eps", 1e-5)
    dtype = ctx.node_dtype(node)
    x = ctx.cast(x, dtype)
    rank = len(x.shape)
    n = len(shape)
    weight = ctx.cast(weight, dtype) if weight is not None else ctx.constant(torch.ones(shape), dtype)
    bias = ctx.cast(bias, dtype) if bias is not None else ctx.constant(torch.zeros(shape), dtype)
    mask = sum(1 << (rank - 1 - i) for i in range(n))
    layer = ctx.network.add_normalization(x, unsqueeze_to(ctx, weight, rank), unsqueeze_to(ctx, bias, rank), mask)
    layer.epsilon = float(eps)
    out = layer.get_output(0)
    return (out, None, None) if aten_op(node.target) == aten.native_layer_norm.default else out




def _group_norm_ok(node: Node, spec: Any) -> str | None:
    if not _only_first_output_used(node):
        return "group-norm mean/rstd outputs are used"
    shape = node.args[0].meta["val"].shape  # type: ignore[union-attr]
    if len(shape) < 2 or not isinstance(shape[1], int):
        return "group norm needs a static channel dim"
    return v.FLOAT_ONLY(node, spec)


@converter(aten.native_group_norm.default, validator=_group_norm_ok)
def group_norm(ctx: ConversionContext, node: Node, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Normalize each group of channels (as a layer norm over [C/G, spatial...]), then scale and shift per channel."""
    x, weight, bias, groups, eps = args[0], args[1], args[2], int(args[6]), float(args[7])
    dtype = ctx.node_dtype(node)
    x = ctx.cast(x, dtype)
    rank = len(x.shape)
    dims = ctx.dims(x)
    grouped = ctx.reshape(x, [dims[0], groups, -1])
    ones = ctx.constant(torch.ones(1, 1, 1), dtype)
    layer = ctx.network.add_normalization(grouped, ones, ctx.constant(torch.zeros(1, 1, 1), dtype), 1 << 2)
    layer.epsilon = eps
    y = ctx.reshape(layer.get_output(0), dims)
    if weight is not None:
        y = elementwise(ctx, ew_ops().PROD, y, _per_channel(ctx, weight, rank, dtype))
    if bias is not None:
        y = elementwise(ctx, ew_ops().SUM, y, _per_channel(ctx, bias, rank, dtype))
    return (y, None, None)


_BATCH_STATS_OK = v.all_of(v.FLOAT_ONLY, v.rank_between(2, 5),
                           v.predicate(_only_first_output_used, "batch-norm statistics outputs are used"))


@converter(aten._native_batch_norm_legit.no_stats, validator=_BATCH_STATS_OK)
def batch_norm_batch_stats(ctx: ConversionContext, node: Node, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Batch norm on the statistics of this batch (every dim but the channels), as instance norm
    and weight standardization compute it."""
    x, weight, bias, eps = args[0], args[1], args[2], float(args[5])
    dtype = ctx.node_dtype(node)
    x = ctx.cast(x, dtype)
    rank = len(x.shape)
    mask = axes_mask([d for d in range(rank) if d != 1], rank)
    mean = ctx.network.add_reduce(x, trt().ReduceOperation.AVG, mask, True).get_output(0)
    centered = elementwise(ctx, ew_ops().SUB, x, mean)
    variance = ctx.network.add_reduce(elementwise(ctx, ew_ops().PROD, centered, centered), trt().ReduceOperation.AVG,
                                      mask, True).get_output(0)
    inv_std = unary(ctx, unary(ctx, elementwise(ctx, ew_ops().SUM, variance, ctx.tensor(eps, like=variance)),
                               unary_ops().SQRT), unary_ops().RECIP)
    y = elementwise(ctx, ew_ops().PROD, centered, inv_std)
    if weight is not None:
        y = elementwise(ctx, ew_ops().PROD, y, _per_channel(ctx, weight, rank, dtype))
    if bias is not None:
        y = elementwise(ctx, ew_ops().SUM, y, _per_channel(ctx, bias, rank, dtype))
    return (y, None, None)
