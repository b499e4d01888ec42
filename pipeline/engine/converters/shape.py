"""Converters that move data without arithmetic: view/reshape, permute, transpose, expand,
squeeze/unsqueeze, flatten, cat, slice, select, flip, pixel_shuffle, and symbolic sizes."""

from __future__ import annotations

import operator
from typing import Any

import torch

from pipeline.engine.context import ConversionContext
from pipeline.engine.converters import _validators as v
from pipeline.engine.converters._layers import (
    broadcast,
    elementwise,
    ew_ops,
    norm_dim,
    out_val,
    slice_layer,
    unsqueeze_to,
)
from pipeline.engine.converters.registry import converter

aten = torch.ops.aten
Node = torch.fx.Node
_INT64_MAX = 2**63 - 1


def _static_shape(node: Node) -> tuple[int, ...] | None:
    shape = out_val(node).shape
    return tuple(shape) if all(isinstance(d, int) for d in shape) else None


def _reshape_to_node(ctx: ConversionContext, node: Node, x: Any, fallback: list[Any]) -> Any:
    """Reshape to the node's output shape when static, else to `fallback` (ints and ITensors)."""
    static = _static_shape(node)
    target = list(static) if static is not None else fallback
    layer = ctx.network.add_shuffle(x)
    if static is not None or not any(hasattr(d, "shape") for d in target):
        layer.reshape_dims = tuple(int(d) for d in target)
    else:
        layer.set_input(1, ctx.shape_tensor(target))
    layer.zero_is_placeholder = False
    return layer.get_output(0)


@converter(aten.view.default, aten.view_copy.default, aten.reshape.default, aten._unsafe_view.default, decomposes=True)
def view(ctx: ConversionContext, node: Node, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return _reshape_to_node(ctx, node, args[0], list(args[1]))


@converter(aten.permute.default, aten.permute_copy.default, decomposes=True)
def permute(ctx: ConversionContext, node: Node, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    rank = len(args[0].shape)
    layer = ctx.network.add_shuffle(args[0])
    layer.first_transpose = tuple(norm_dim(int(d), rank) for d in args[1])
    return layer.get_output(0)


@converter(aten.transpose.int, aten.transpose_copy.int, decomposes=True)
def transpose(ctx: ConversionContext, node: Node, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    rank = len(args[0].shape)
    perm = list(range(rank))
    a, b = norm_dim(args[1], rank), norm_dim(args[2], rank)
    perm[a], perm[b] = perm[b], perm[a]
    layer = ctx.network.add_shuffle(args[0])
    layer.first_transpose = tuple(perm)
    return layer.get_output(0)


@converter(aten.t.default, aten.t_copy.default, validator=v.rank_between(0, 2), decomposes=True)
def t(ctx: ConversionContext, node: Node, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    if len(args[0].shape) < 2:
        return args[0]
    layer = ctx.network.add_shuffle(args[0])
    layer.first_transpose = (1, 0)
    return layer.get_output(0)


@converter(aten.expand.default, aten.expand_copy.default, decomposes=True)
def expand(ctx: ConversionContext, node: Node, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    sizes = list(args[1])
    x = unsqueeze_to(ctx, args[0], len(sizes))
    in_dims = ctx.dims(x)
    target = [in_dims[i] if (isinstance(s, int) and s == -1) else s for i, s in enumerate(sizes)]
    return broadcast(ctx, x, _static_shape(node) or target)


def _squeezed(node: Node) -> list[int]:
    shape = node.args[0].meta["val"].shape  # type: ignore[union-attr]
    rank = len(shape)
    dim_arg = v.arg(node, 1, "dim")
    if dim_arg is None:
        chosen = range(rank)
    else:
        chosen = [norm_dim(int(d), rank) for d in (dim_arg if isinstance(dim_arg, (list, tuple)) else [dim_arg])]
    return [d for d in chosen if isinstance(shape[d], int) and shape[d] == 1]


@converter(aten.squeeze.dim, aten.squeeze.dims, aten.squeeze.default, aten.squeeze_copy.dim, aten.squeeze_copy.dims,
           aten.squeeze_copy.default, decomposes=True)
def squeeze(ctx: ConversionContext, node: Node, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    drop = set(_squeezed(node))
    keep = [d for i, d in enumerate(ctx.dims(args[0])) if i not in drop]
    return _reshape_to_node(ctx, node, args[0], keep)


@converter(aten.unsqueeze.default, aten.unsqueeze_copy.default, decomposes=True)
def unsqueeze(ctx: ConversionContext, node: Node, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    sizes = ctx.dims(args[0])
    sizes.insert(norm_dim(int(args[1]), len(sizes) + 1), 1)
    return _reshape_to_node(ctx, node, args[0], sizes)


@converter(aten.flatten.using_ints, decomposes=True)
def flatten(ctx: ConversionContext, node: Node, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    x = args[0]
    rank = len(x.shape)
    if rank == 0:
        return ctx.reshape(x, (1,))
    start = norm_dim(int(v.arg(node, 1, "start_dim", 0)), rank)
    end = norm_dim(int(v.arg(node, 2, "end_dim", -1)), rank)
    sizes = ctx.dims(x)
    return _reshape_to_node(ctx, node, x, sizes[:start] + [-1] + sizes[end + 1 :])


@converter(aten.cat.default, validator=v.NUMERIC, decomposes=True)
def cat(ctx: ConversionContext, node: Node, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    dtype = ctx.node_dtype(node)
    parts = [ctx.cast(t, dtype) for t, n in zip(args[0], node.args[0]) if 0 not in tuple(n.meta["val"].shape)]  # type: ignore[union-attr]
    rank = max(len(p.shape) for p in parts)
    layer = ctx.network.add_concatenation(parts)
    layer.axis = norm_dim(int(v.arg(node, 1, "dim", 0)), rank)
    return layer.get_output(0)


def _slice_ok(node: Node, spec: Any) -> str | None:
    step = v.arg(node, 4, "step", 1)
    if not isinstance(step, int) or step < 1:
        return f"slice step {step!r} must be a positive constant"
    return v.NUMERIC(node, spec)


_PY_INT_OPS = {"SUM": operator.add, "SUB": operator.sub, "PROD": operator.mul, "MIN": min, "MAX": max,
               "FLOOR_DIV": operator.floordiv}


def _int_expr(ctx: ConversionContext, a: Any, b: Any, op: str) -> Any:
    if isinstance(a, int) and isinstance(b, int):
        return _PY_INT_OPS[op](a, b)
    x = ctx.tensor(a, dtype=torch.int64) if not isinstance(a, int) else ctx.constant(torch.tensor(a), torch.int64)
    y = ctx.tensor(b, dtype=torch.int64) if not isinstance(b, int) else ctx.constant(torch.tensor(b), torch.int64)
    return elementwise(ctx, getattr(ew_ops(), op), x, y)


@converter(aten.slice.Tensor, aten.slice_copy.Tensor, validator=_slice_ok, decomposes=True)
def slice_(ctx: ConversionContext, node: Node, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    x = args[0]
    rank = len(x.shape)
    axis = norm_dim(int(v.arg(node, 1, "dim", 0)), rank)
    # bounds from the converted args: a SymInt bound arrives as the ITensor of its size expression
    start, end, step = (args[i] if len(args) > i else kwargs.get(name, d) for i, name, d in (
        (2, "start", None), (3, "end", None), (4, "step", 1)))
    step = int(step)
    sizes = ctx.dims(x)
    size = sizes[axis]
    start = _clip(ctx, 0 if start is None else start, size)
    end = _clip(ctx, size if end is None or (isinstance(end, int) and end >= _INT64_MAX) else end, size)
    count = _int_expr(ctx, _int_expr(ctx, _int_expr(ctx, end, start, "SUB"), step - 1, "SUM"), step, "FLOOR_DIV")
    count = _int_expr(ctx, count, 0, "MAX")
    starts = [0] * rank
    starts[axis] = start
    sizes[axis] = count
    strides = [1] * rank
    strides[axis] = step
    return slice_layer(ctx, x, starts, sizes, strides)


def _clip(ctx: ConversionContext, index: Any, size: Any) -> Any:
    """torch's slice index semantics: negative counts from the end, then clamp to [0, size]."""
    if isinstance(index, int) and index < 0:
        index = _int_expr(ctx, size, index, "SUM")
    return _int_expr(ctx, _int_expr(ctx, index, size, "MIN"), 0, "MAX")


@converter(aten.select.int, aten.select_copy.int, decomposes=True)
def select(ctx: ConversionContext, node: Node, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    x = args[0]
    axis = norm_dim(int(args[1]), len(x.shape))
    index = args[2]
    if isinstance(index, int) and index < 0:
        index = _int_expr(ctx, ctx.dims(x)[axis], index, "SUM")
    idx = ctx.constant(torch.tensor(index, dtype=torch.int64), torch.int64) if isinstance(index, int) else ctx.tensor(index, dtype=torch.int64)
    return ctx.network.add_gather(x, idx, axis).get_output(0)


def _pixel_shuffle_ok(node: Node, spec: Any) -> str | None:
    shape = node.args[0].meta["val"].shape  # type: ignore[union-attr]
    if len(shape) != 4 or not all(isinstance(d, int) for d in shape[1:]):
        return "pixel_shuffle needs a 4-D input with static C, H, W"
    return None


@converter(aten.pixel_shuffle.default, validator=_pixel_shuffle_ok, decomposes=True)
def pixel_shuffle(ctx: ConversionContext, node: Node, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    x, r = args[0], int(args[1])
    _, c, h, w = x.shape
    batch = ctx.dims(x)[0]
    split = ctx.reshape(x, [batch, c // (r * r), r, r, h, w])
    layer = ctx.network.add_shuffle(split)
    layer.first_transpose = (0, 1, 4, 2, 5, 3)
    return ctx.reshape(layer.get_output(0), [batch, c // (r * r), h * r, w * r])


# ---- symbolic sizes (dynamic shapes) -----------------------------------------------------------
@converter(aten.sym_size.int, decomposes=True)
def sym_size(ctx: ConversionContext, node: Node, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return ctx.dim_of(args[0], norm_dim(int(args[1]), len(args[0].shape)))


def _number_ok(node: Node, spec: Any) -> str | None:
    val = node.args[0].meta.get("val")  # type: ignore[union-attr]
    if not isinstance(val, torch.Tensor) or val.dtype.is_floating_point or val.dtype.is_complex:
        return "only an integer read out of a tensor stays in the engine"
    return None


@converter(aten._local_scalar_dense.default, aten.item.default, validator=_number_ok, decomposes=True)
def local_scalar_dense(ctx: ConversionContext, node: Node, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """A number read out of a one-element integer tensor (`item`: TrOCR's positions from the cache's
    length) stays in the engine, as the 0-d int64 tensor a size is there; outside, it would be a
    number the engine takes as an input, which engines cannot."""
    return ctx.reshape(ctx.tensor(args[0], dtype=torch.int64), [])


_SYM_OPS = {operator.add: "SUM", operator.sub: "SUB", operator.mul: "PROD", operator.floordiv: "FLOOR_DIV"}


@converter(*_SYM_OPS, decomposes=True)
def sym_arith(ctx: ConversionContext, node: Node, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return _int_expr(ctx, args[0], args[1], _SYM_OPS[node.target])  # type: ignore[index]


def _split_ok(node: Node, spec: Any) -> str | None:
    shape = node.args[0].meta["val"].shape  # type: ignore[union-attr]
    axis = norm_dim(int(v.arg(node, 2, "dim", 0)), len(shape))
    if not isinstance(shape[axis], int):
        return "split along a dynamic dim is not supported"
    return None


@converter(aten.split_with_sizes.default, aten.split_with_sizes_copy.default, aten.split.Tensor,
           aten.split_copy.Tensor, validator=_split_ok, decomposes=True)
def split(ctx: ConversionContext, node: Node, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    x = args[0]
    rank = len(x.shape)
    axis = norm_dim(int(v.arg(node, 2, "dim", 0)), rank)
    total = x.shape[axis]
    sizes = args[1] if isinstance(args[1], (list, tuple)) else [min(args[1], total - i) for i in range(0, total, args[1])]
    outs, start = [], 0
    for size in sizes:
        starts = [0] * rank
        starts[axis] = start
        extent = ctx.dims(x)
        extent[axis] = int(size)
        outs.append(slice_layer(ctx, x, starts, extent, [1] * rank))
        start += int(size)
    return tuple(outs)


@converter(aten.flip.default, decomposes=True)
def flip(ctx: ConversionContext, node: Node, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """A slice that starts at the last element of each flipped dim and steps back."""
    x = args[0]
    rank = len(x.shape)
    axes = {norm_dim(int(d), rank) for d in args[1]}
    sizes = ctx.dims(x)
    starts = [_int_expr(ctx, sizes[i], 1, "SUB") if i in axes else 0 for i in range(rank)]
    strides = [-1 if i in axes else 1 for i in range(rank)]
    return slice_layer(ctx, x, starts, sizes, strides)


def _unfold_ok(node: Node, spec: Any) -> str | None:
    shape = node.args[0].meta["val"].shape  # type: ignore[union-attr]
    if not shape:
        return "unfold of a 0-d tensor is not supported"
    dim, size, step = norm_dim(int(node.args[1]), len(shape)), node.args[2], node.args[3]  # type: ignore[arg-type]
    if not isinstance(shape[dim], int):
        return f"unfold along dim {dim} needs a static size there (its windows are a constant index)"
    if not isinstance(size, int) or not isinstance(step, int):
        return "unfold needs a static window size and step"
    return None


@converter(aten.unfold.default, aten.unfold_copy.default, validator=_unfold_ok, decomposes=True)
def unfold(ctx: ConversionContext, node: Node, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Sliding windows along a dim (`Tensor.unfold`): one gather of a constant [windows, size] index,
    then the window's axis moved last."""
    x = args[0]
    rank = len(x.shape)
    dim, size, step = norm_dim(int(args[1]), rank), int(args[2]), int(args[3])
    windows = (int(node.args[0].meta["val"].shape[dim]) - size) // step + 1  # type: ignore[union-attr]
    index = torch.arange(windows)[:, None] * step + torch.arange(size)
    gathered = ctx.network.add_gather(x, ctx.constant(index, torch.int32), dim).get_output(0)
    order = [d for d in range(rank + 1) if d != dim + 1] + [dim + 1]
    layer = ctx.network.add_shuffle(gathered)
    layer.first_transpose = tuple(order)
    return layer.get_output(0)
