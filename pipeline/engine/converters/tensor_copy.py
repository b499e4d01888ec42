"""Converters for copies, aliases and dtype casts (`clone`, `alias`, `_to_copy`,
`_to_dim_order_copy`, functional `copy`): identities, cast or broadcast layers inside the engine."""

from __future__ import annotations

import sys
from typing import Any

import torch

from pipeline.engine.context import ConversionContext
from pipeline.engine.converters import _validators as v
from pipeline.engine.converters._layers import broadcast, unsqueeze_to
from pipeline.engine.converters.registry import converter, registered

aten = torch.ops.aten
Node = torch.fx.Node


@converter(aten.clone.default, aten.alias.default, aten.alias_copy.default, aten.detach.default,
           aten.detach_copy.default, aten.lift_fresh_copy.default, validator=v.NUMERIC, decomposes=True)
def identity(ctx: ConversionContext, node: Node, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return args[0]


def _contiguous_cast(node: Node, spec: Any) -> str | None:
    reason = v.NUMERIC(node, spec)
    if reason:
        return reason
    order = node.kwargs.get("dim_order")
    if order is not None and list(order) != sorted(order):
        return f"dim_order={list(order)} is not contiguous"
    memory = node.kwargs.get("memory_format")
    if memory not in (None, torch.preserve_format, torch.contiguous_format):
        return f"memory_format={memory} is not supported"
    device = node.kwargs.get("device")
    if device is not None and torch.device(device).type not in ("cpu", "cuda"):
        return f"copy to device {device} is not supported"
    return None


def clone_dim_order(ctx: ConversionContext, node: Node, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return args[0]


@converter(aten._to_copy.default, validator=_contiguous_cast, decomposes=True)
def to_copy(ctx: ConversionContext, node: Node, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return ctx.cast(args[0], ctx.node_dtype(node))


@converter(aten.copy.default, validator=v.NUMERIC, decomposes=True)
def copy(ctx: ConversionContext, node: Node, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """`copy(x, src)`: src broadcast to x's shape, in x's dtype (x itself is not modified)."""
    x, src = args[0], args[1]
    src = unsqueeze_to(ctx, ctx.tensor(src, like=x, dtype=ctx.node_dtype(node)), len(x.shape))
    return broadcast(ctx, src, ctx.dims(x))


def register_dim_order_ops() -> None:
    """Give ExecuTorch's dim-order copies (what Edge programs hold where ATen has `_to_copy` and `clone`)
    their converters. Their ops exist only once ExecuTorch is loaded, so the Edge side (`lowering.backend`)
    calls this; the compile step, whose graphs are ATen, never loads ExecuTorch. Idempotent."""
    ops = getattr(torch.ops, "dim_order_ops", None)
    for name, fn in (("_clone_dim_order", clone_dim_order), ("_to_dim_order_copy", to_copy)):
        op = getattr(ops, name).default if ops is not None and hasattr(ops, name) else None
        if op is not None and not registered(op):
            converter(op, validator=_contiguous_cast, decomposes=True)(fn)


if "executorch.exir" in sys.modules:  # loaded already: register now, as a plain import of this module would
    register_dim_order_ops()
