"""Converters for tensors created from constants (`full`, `scalar_tensor`, `arange` with static
sizes): they become constant layers."""

from __future__ import annotations

from typing import Any

import torch

from pipeline.tensorrt.context import ConversionContext
from pipeline.tensorrt.converters import _validators as v
from pipeline.tensorrt.converters.registry import converter

aten = torch.ops.aten
Node = torch.fx.Node


def _static_value(node: Node, spec: Any) -> str | None:
    if any(isinstance(a, Node) for a in torch.fx.node.map_aggregate(node.args, lambda x: x) if not isinstance(a, list)):
        return "sizes and values must be constants"
    shape = node.meta["val"].shape
    if not all(isinstance(d, int) for d in shape):
        return "the created tensor must have a static shape"
    return None


@converter(aten.full.default, aten.scalar_tensor.default, aten.arange.start_step, aten.arange.default,
           validator=v.all_of(_static_value, v.static_arg(0, "size")))
def constant_tensor(ctx: ConversionContext, node: Node, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    # Evaluate the op itself on concrete arguments: one definition of its semantics, torch's.
    value = node.target(*node.args, **{k: val for k, val in node.kwargs.items() if k != "device"})  # type: ignore[operator]
    return ctx.constant(value, ctx.node_dtype(node))


def _static_like(node: Node, spec: Any) -> str | None:
    if not all(isinstance(d, int) for d in node.meta["val"].shape):
        return "full_like needs a static shape"
    return None if not isinstance(v.arg(node, 1, "fill_value"), Node) else "fill_value must be a constant"


@converter(aten.full_like.default, validator=_static_like)
def full_like(ctx: ConversionContext, node: Node, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    val = node.meta["val"]
    return ctx.constant(torch.full(tuple(val.shape), args[1], dtype=val.dtype), ctx.node_dtype(node))
