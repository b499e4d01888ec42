"""Converters for activations, clamps and (log-)softmax."""

from __future__ import annotations

from typing import Any

import torch

from pipeline.engine.context import ConversionContext
from pipeline.engine.converters import _validators as v
from pipeline.engine.converters._layers import (
    activation,
    axes_mask,
    elementwise,
    ew_ops,
    norm_dim,
    promoted,
    unary,
    unary_ops,
)
from pipeline.engine.converters.registry import converter
from pipeline.engine.trt_api import trt

aten = torch.ops.aten
Node = torch.fx.Node
_FLOAT = v.FLOAT_ONLY


def _act() -> Any:
    return trt().ActivationType


@converter(aten.relu.default, validator=_FLOAT)
def relu(ctx: ConversionContext, node: Node, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return activation(ctx, args[0], _act().RELU)


@converter(aten.sigmoid.default, validator=_FLOAT)
def sigmoid(ctx: ConversionContext, node: Node, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return activation(ctx, args[0], _act().SIGMOID)


@converter(aten.tanh.default, validator=_FLOAT)
def tanh(ctx: ConversionContext, node: Node, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return activation(ctx, args[0], _act().TANH)


@converter(aten.gelu.default, validator=v.all_of(_FLOAT, v.arg_in(1, "approximate", ("none", "tanh"), "none")))
def gelu(ctx: ConversionContext, node: Node, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    approximate = args[1] if len(args) > 1 else kwargs.get("approximate", "none")
    return activation(ctx, args[0], _act().GELU_TANH if approximate == "tanh" else _act().GELU_ERF)


@converter(aten.silu.default, validator=_FLOAT)
def silu(ctx: ConversionContext, node: Node, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return elementwise(ctx, ew_ops().PROD, args[0], activation(ctx, args[0], _act().SIGMOID))


@converter(aten.hardsigmoid.default, validator=_FLOAT)
def hardsigmoid(ctx: ConversionContext, node: Node, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return activation(ctx, args[0], _act().HARD_SIGMOID, alpha=1 / 6, beta=0.5)


@converter(aten.hardswish.default, validator=_FLOAT)
def hardswish(ctx: ConversionContext, node: Node, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    gate = activation(ctx, args[0], _act().HARD_SIGMOID, alpha=1 / 6, beta=0.5)
    return elementwise(ctx, ew_ops().PROD, args[0], gate)


@converter(aten.leaky_relu.default, validator=_FLOAT)
def leaky_relu(ctx: ConversionContext, node: Node, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    slope = args[1] if len(args) > 1 else kwargs.get("negative_slope", 0.01)
    return activation(ctx, args[0], _act().LEAKY_RELU, alpha=float(slope))


@converter(aten.hardtanh.default, validator=_FLOAT)
def hardtanh(ctx: ConversionContext, node: Node, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    lo = args[1] if len(args) > 1 else kwargs.get("min_val", -1.0)
    hi = args[2] if len(args) > 2 else kwargs.get("max_val", 1.0)
    return activation(ctx, args[0], _act().CLIP, alpha=float(lo), beta=float(hi))


def _bound(ctx: ConversionContext, node: Node, x: Any, bound: Any, op: str) -> Any:
    if bound is None:
        return x
    x, b = promoted(ctx, node, x, bound, ctx.node_dtype(node))
    return elementwise(ctx, getattr(ew_ops(), op), x, b)


@converter(aten.clamp.default, aten.clamp.Tensor, validator=v.tensor_dtypes(v.NUMERIC_DTYPES))
def clamp(ctx: ConversionContext, node: Node, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    lo = args[1] if len(args) > 1 else kwargs.get("min")
    hi = args[2] if len(args) > 2 else kwargs.get("max")
    return _bound(ctx, node, _bound(ctx, node, args[0], lo, "MAX"), hi, "MIN")


def _dim_arg(node: Node) -> int:
    val = node.args[0].meta["val"]  # type: ignore[union-attr]
    return norm_dim(int(v.arg(node, 1, "dim")), val.dim())


def _softmax_ok(node: Node, spec: Any) -> str | None:
    if v.FLOAT_ONLY(node, spec):
        return v.FLOAT_ONLY(node, spec)
    if node.args[0].meta["val"].dim() == 0:  # type: ignore[union-attr]
        return "softmax over a 0-d tensor"
    return None


@converter(aten._softmax.default, aten.softmax.int, aten._safe_softmax.default, validator=_softmax_ok)
def softmax(ctx: ConversionContext, node: Node, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    layer = ctx.network.add_softmax(ctx.tensor(args[0], dtype=ctx.node_dtype(node)))
    layer.axes = 1 << _dim_arg(node)
    return layer.get_output(0)


@converter(aten._log_softmax.default, aten.log_softmax.int, validator=_softmax_ok)
def log_softmax(ctx: ConversionContext, node: Node, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    # (x - max) - log(sum(exp(x - max))): stable in fp16, unlike log(softmax(x)).
    x = ctx.tensor(args[0], dtype=ctx.node_dtype(node))
    axes = axes_mask([_dim_arg(node)], len(x.shape))
    peak = ctx.network.add_reduce(x, trt().ReduceOperation.MAX, axes, True).get_output(0)
    shifted = elementwise(ctx, ew_ops().SUB, x, peak)
    total = ctx.network.add_reduce(unary(ctx, shifted, unary_ops().EXP), trt().ReduceOperation.SUM, axes, True)
    return elementwise(ctx, ew_ops().SUB, shifted, unary(ctx, total.get_output(0), unary_ops().LOG))




@converter(aten.elu.default, validator=_FLOAT)
def elu(ctx: ConversionContext, node: Node, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """scale * (x > 0 ? x : alpha * (exp(input_scale * x) - 1)); ELU, SELU and CELU all come here."""
    alpha, scale, input_scale = (float(v.arg(node, i, n, d)) for i, n, d in ((1, "alpha", 1.0), (2, "scale", 1.0),
                                                                           (3, "input_scale", 1.0)))
    x = args[0]
    if input_scale != 1.0:  # elu(k x) / k on the negative side: alpha (exp(k x) - 1) = elu_alpha(k x) there
        x = elementwise(ctx, ew_ops().PROD, x, ctx.tensor(input_scale, like=x))
    y = activation(ctx, x, _act().ELU, alpha=alpha)
    if input_scale != 1.0:  # the positive side must stay x, not k x
        y = ctx.network.add_select(
            elementwise(ctx, ew_ops().GREATER, args[0], ctx.tensor(0.0, like=args[0])), args[0], y).get_output(0)
    if scale != 1.0:
        y = elementwise(ctx, ew_ops().PROD, y, ctx.tensor(scale, like=y))
    return y
