"""Converters for created tensors: from constants (`full`, `scalar_tensor`, `arange` with static
sizes) constant layers; `arange` of integers up to a dynamic size (positions of a variable-length
input) a fill layer."""

from __future__ import annotations

from typing import Any

import torch
from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

from pipeline.engine.context import ConversionContext, known_size, torch_to_trt
from pipeline.engine.converters import _validators as v
from pipeline.engine.converters._layers import broadcast, elementwise, ew_ops
from pipeline.engine.converters.registry import aten_op, converter
from pipeline.engine.trt_api import trt

aten = torch.ops.aten
Node = torch.fx.Node


def _static_value(node: Node, spec: Any) -> str | None:
    if any(isinstance(a, Node) for a in torch.fx.node.map_aggregate(node.args, lambda x: x) if not isinstance(a, list)):
        return "sizes and values must be constants"
    shape = node.meta["val"].shape
    if not all(isinstance(d, int) for d in shape):
        return "the created tensor must have a static shape"
    return None


_CONSTANT = v.all_of(_static_value, v.static_arg(0, "size"))
_ARANGE = (aten.arange.start_step, aten.arange.default)


def _arange_bounds(node: Node) -> tuple[Any, Any, Any]:
    """(start, end, step) of an arange node."""
    if aten_op(node.target) is aten.arange.default:
        return 0, node.args[0], 1
    return node.args[0], node.args[1], node.args[2] if len(node.args) > 2 else v.arg(node, 2, "step", 1)


def _created_ok(node: Node, spec: Any) -> str | None:
    reason = _CONSTANT(node, spec)
    if reason is None or aten_op(node.target) not in _ARANGE or all(not isinstance(b, Node) for b in _arange_bounds(node)):
        return reason
    start, _, step = _arange_bounds(node)
    if isinstance(step, Node) or step != 1 or isinstance(start, float):
        return "an arange up to a dynamic size needs step 1 and an integer start"
    if node.meta["val"].dtype not in (torch.int32, torch.int64):
        return "an arange up to a dynamic size must be of integers"
    size = node.meta["val"].shape[0]
    if isinstance(size, torch.SymInt) and free_unbacked_symbols(known_size(size)):
        return "an arange whose length depends on a number read out of a tensor"
    return None


@converter(aten.scalar_tensor.default, *_ARANGE, validator=_created_ok, decomposes=True)
def constant_tensor(ctx: ConversionContext, node: Node, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    if aten_op(node.target) in _ARANGE and any(isinstance(b, Node) for b in _arange_bounds(node)):
        return _dynamic_arange(ctx, node, args)
    # Evaluate the op itself on concrete arguments: one definition of its semantics, torch's.
    value = node.target(*node.args, **{k: val for k, val in node.kwargs.items() if k != "device"})  # type: ignore[operator]
    return ctx.constant(value, ctx.node_dtype(node))


def _dynamic_arange(ctx: ConversionContext, node: Node, args: tuple[Any, ...]) -> Any:
    """start, start + 1, ..., end - 1 for a dynamic end (or start): a linspace fill of end - start
    elements (never fewer than none)."""
    start, end = (args[0], args[1]) if aten_op(node.target) is aten.arange.start_step else (0, args[0])
    first = ctx.reshape(ctx.tensor(start, dtype=torch.int64), ())
    # The count from the input dims it is a size of, where it is one (positions start .. start + T - 1
    # from a start read out of a tensor: T); end - start would make that tensor a shape input.
    count = ctx.size(node.meta["val"].shape[0])
    if count is None:
        last = ctx.reshape(ctx.tensor(end, dtype=torch.int64), ())
        count = elementwise(ctx, ew_ops().MAX, elementwise(ctx, ew_ops().SUB, last, first), ctx.tensor(0, like=first, dtype=torch.int64))
    layer = ctx.network.add_fill((0,), trt().FillOperation.LINSPACE, torch_to_trt(torch.int64))
    layer.set_input(0, ctx.shape_tensor([count]))
    layer.set_input(1, first)
    layer.set_input(2, ctx.constant(torch.ones(1, dtype=torch.int64), torch.int64))
    return ctx.cast(layer.get_output(0), ctx.node_dtype(node))


def _constant_fill(node: Node, spec: Any) -> str | None:
    return None if not isinstance(v.arg(node, 1, "fill_value"), Node) else "fill_value must be a constant"


@converter(aten.full.default, validator=_constant_fill, decomposes=True)
def full(ctx: ConversionContext, node: Node, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The fill value over the sizes (a size from the graph arrives as an ITensor)."""
    return _filled(ctx, node, list(args[0]), args[1])


@converter(aten.empty.memory_format, decomposes=True)
def empty(ctx: ConversionContext, node: Node, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Memory the program writes before it reads (a buffer scattered into): zeros are as good as any."""
    return _filled(ctx, node, list(args[0]), 0)


def _filled(ctx: ConversionContext, node: Node, sizes: list[Any], value: Any) -> Any:
    """`value` as a constant of the node's shape; where a size is dynamic (a mask over the tokens),
    one element broadcast to `sizes`."""
    val = node.meta["val"]
    if all(isinstance(d, int) for d in val.shape):
        return ctx.constant(torch.full(tuple(val.shape), value, dtype=val.dtype), ctx.node_dtype(node))
    one = ctx.constant(torch.full((1,) * val.dim(), value, dtype=val.dtype), ctx.node_dtype(node))
    return broadcast(ctx, one, sizes)


@converter(aten.full_like.default, validator=_constant_fill, decomposes=True)
def full_like(ctx: ConversionContext, node: Node, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The fill value over the input's sizes (the unit magnitudes of rotary angles over the tokens)."""
    return _filled(ctx, node, ctx.dims(args[0]), args[1])
