"""Converters that pick or place elements by index: index_select, gather, scatter and
slice_scatter, advanced indexing (`x[idx]`), index_put (`x[..., idx] = v`), padding with a
constant, and repeat (tiling)."""

from __future__ import annotations

from typing import Any

import torch

from pipeline.engine.context import ConversionContext
from pipeline.engine.converters import _validators as v
from pipeline.engine.converters._layers import (
    broadcast,
    elementwise,
    ew_ops,
    norm_dim,
    slice_layer,
    unsqueeze_to,
    wrapped_index,
)
from pipeline.engine.converters.accumulate import index_put_added, index_put_added_ok
from pipeline.engine.converters.conv import padding_taken_by
from pipeline.engine.converters.registry import converter
from pipeline.engine.trt_api import trt

aten = torch.ops.aten
Node = torch.fx.Node


def _index_dtype(position: int) -> Any:
    def check(node: Node, spec: Any) -> str | None:
        val = node.args[position].meta.get("val") if isinstance(node.args[position], Node) else None
        if val is not None and val.dtype not in v.INDEX_DTYPES:
            return f"index dtype {str(val.dtype).removeprefix('torch.')} is not int32/int64"
        return None

    return check


@converter(aten.index_select.default, validator=_index_dtype(2))
def index_select(ctx: ConversionContext, node: Node, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    x, dim, index = args[0], norm_dim(int(args[1]), len(args[0].shape)), args[2]
    index = wrapped_index(ctx, index, ctx.dims(x)[dim])
    return ctx.network.add_gather(x, index, dim).get_output(0)


@converter(aten.gather.default, validator=v.all_of(_index_dtype(2), v.predicate(
    lambda n: not v.arg(n, 3, "sparse_grad", False), "sparse_grad gather is not supported")))
def gather(ctx: ConversionContext, node: Node, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    x, dim, index = args[0], norm_dim(int(args[1]), len(args[0].shape)), args[2]
    layer = ctx.network.add_gather_v2(x, wrapped_index(ctx, index, ctx.dims(x)[dim]), trt().GatherMode.ELEMENT)
    layer.axis = dim
    return layer.get_output(0)


def _scatter_ok(node: Node, spec: Any) -> str | None:
    index = node.args[2].meta["val"]  # type: ignore[union-attr]
    if index.dtype not in v.INDEX_DTYPES:
        return f"index dtype {str(index.dtype).removeprefix('torch.')} is not int32/int64"
    src = node.args[3].meta.get("val") if isinstance(node.args[3], Node) else None
    if src is not None and tuple(src.shape) != tuple(index.shape) and not all(isinstance(d, int) for d in src.shape):
        return "scatter from a source larger than its index needs static shapes"
    return None


@converter(aten.scatter.src, aten.scatter.value, validator=_scatter_ok)
def scatter(ctx: ConversionContext, node: Node, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """`x` with the elements of `src` (or a value) written where `index` says along `dim`."""
    x, dim, index, src = args[0], norm_dim(int(args[1]), len(args[0].shape)), args[2], args[3]
    index_shape = list(node.args[2].meta["val"].shape)  # type: ignore[union-attr]
    if isinstance(node.args[3], Node):
        src = ctx.cast(src, ctx.node_dtype(node))
        if list(src.shape) != [d if isinstance(d, int) else -1 for d in index_shape]:  # only index's part is read
            src = slice_layer(ctx, src, [0] * len(index_shape), index_shape, [1] * len(index_shape))
    else:
        src = broadcast(ctx, ctx.tensor(src, like=x, dtype=ctx.node_dtype(node)), ctx.dims(index))
    layer = ctx.network.add_scatter(ctx.cast(x, ctx.node_dtype(node)), ctx.cast(index, torch.int64), src,
                                    trt().ScatterMode.ELEMENT)
    layer.axis = dim
    return layer.get_output(0)


def _slice_scatter_ok(node: Node, spec: Any) -> str | None:
    shape = node.args[0].meta["val"].shape  # type: ignore[union-attr]
    dim = norm_dim(int(v.arg(node, 2, "dim", 0)), len(shape))
    bounds = [v.arg(node, 3, "start"), v.arg(node, 4, "end"), v.arg(node, 5, "step", 1)]
    if not isinstance(shape[dim], int) or not all(b is None or isinstance(b, int) for b in bounds):
        return "slice_scatter needs a static size and constant bounds along its dim"
    return v.NUMERIC(node, spec)


@converter(aten.slice_scatter.default, validator=_slice_scatter_ok)
def slice_scatter(ctx: ConversionContext, node: Node, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """`x` with `src` written into the slice start:end:step along `dim` (`x[:, 1:] = src`): a scatter
    whose index is that slice's positions."""
    x, src = args[0], args[1]
    dim = norm_dim(int(v.arg(node, 2, "dim", 0)), len(x.shape))
    size = int(node.args[0].meta["val"].shape[dim])  # type: ignore[union-attr]
    start, end, step = slice(v.arg(node, 3, "start"), v.arg(node, 4, "end"), int(v.arg(node, 5, "step", 1))).indices(size)
    positions = torch.arange(start, end, step, dtype=torch.int64)
    shape = [1] * len(x.shape)
    shape[dim] = len(positions)
    index = broadcast(ctx, ctx.constant(positions.reshape(shape), torch.int64), ctx.dims(src))
    dtype = ctx.node_dtype(node)
    layer = ctx.network.add_scatter(ctx.cast(x, dtype), index, ctx.cast(src, dtype), trt().ScatterMode.ELEMENT)
    layer.axis = dim
    return layer.get_output(0)


def _index_ok(node: Node, spec: Any) -> str | None:
    indices = list(node.args[1])
    used = [i for i, t in enumerate(indices) if t is not None]
    vals = [indices[i].meta.get("val") for i in used]
    if any(val.dtype in (torch.bool, torch.uint8) for val in vals):
        return "boolean-mask indexing has a data-dependent output shape"
    if any(val.dtype not in v.INDEX_DTYPES for val in vals):
        return "index tensors must be int32/int64"
    if used != list(range(used[0], used[-1] + 1)):
        return "index tensors separated by ':' move their dims to the front (not supported)"
    shape = node.args[0].meta["val"].shape
    if len(used) > 1 and not all(isinstance(shape[i], int) for i in used[1:]):
        return "indexing several dims needs static sizes for all but the first"
    return None


@converter(aten.index.Tensor, validator=_index_ok)
def index(ctx: ConversionContext, node: Node, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """`x[..., i0, i1, ...]` with index tensors on consecutive dims: the indexed dims are merged and
    the broadcast indices become one flat index for a single gather."""
    x, indices = args[0], list(args[1])
    used = [i for i, t in enumerate(indices) if t is not None]
    first, last = used[0], used[-1]
    sizes = ctx.dims(x)
    if len(used) == 1:
        return ctx.network.add_gather(x, wrapped_index(ctx, indices[first], sizes[first]), first).get_output(0)
    rank = max(len(indices[i].shape) for i in used)
    flat = None
    for i in used:
        idx = wrapped_index(ctx, indices[i], sizes[i])
        if len(idx.shape) < rank:
            idx = ctx.reshape(idx, [1] * (rank - len(idx.shape)) + ctx.dims(idx))
        stride = 1
        for size in sizes[i + 1:last + 1]:
            stride *= int(size)
        term = elementwise(ctx, ew_ops().PROD, idx, ctx.tensor(stride, like=idx, dtype=torch.int64)) if stride != 1 else idx
        flat = term if flat is None else elementwise(ctx, ew_ops().SUM, flat, term)
    merged = 1
    for size in sizes[first + 1:last + 1]:
        merged *= int(size)
    merged_x = ctx.reshape(x, sizes[:first] + [-1] + sizes[last + 1:]) if merged != 1 or last > first else x
    return ctx.network.add_gather(merged_x, flat, first).get_output(0)


def _index_put_ok(node: Node, spec: Any) -> str | None:
    used = [t for t in node.args[1] if t is not None]
    vals = [t.meta.get("val") for t in used]
    if any(val.dtype in (torch.bool, torch.uint8) for val in vals):
        return "boolean-mask index_put is not supported"
    if len(used) != 1 or vals[0].dtype not in v.INDEX_DTYPES or vals[0].dim() != 1:
        return "index_put needs one 1-D int32/int64 index tensor (x[..., idx, ...] = v)"
    return index_put_added_ok(node) if v.arg(node, 3, "accumulate", False) else None


@converter(aten.index_put.default, validator=_index_put_ok)
def index_put(ctx: ConversionContext, node: Node, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """`x[..., idx, ...] = values` with one 1-D index tensor at dim d. A KV cache written at a run of
    positions, where the cache is an engine input nothing else reads and the result an engine output,
    is updated in place (`_cache_update`). With `accumulate` (`x[idx] += v`, index_add) the values add
    up (`accumulate.index_put_added`). Otherwise: an element-wise scatter along d into a new
    tensor; repeated indices leave which value lands unspecified, as in torch."""
    x, indices, values = args[0], list(args[1]), args[2]
    d = next(i for i, t in enumerate(indices) if t is not None)
    rank, sizes = len(x.shape), ctx.dims(x)
    idx = wrapped_index(ctx, indices[d], sizes[d])
    target = sizes[:d] + [ctx.dims(idx)[0]] + sizes[d + 1:]  # the shape of x[..., idx, ...]
    values = broadcast(ctx, unsqueeze_to(ctx, ctx.tensor(values, like=x, dtype=ctx.node_dtype(node)), rank), target)
    if v.arg(node, 3, "accumulate", False):
        return index_put_added(ctx, x, idx, values, d, ctx.node_dtype(node))
    start = _run_start(ctx, node, d)
    if start is not None and _updates_in_place(ctx, node, x, values, d):
        return _cache_update(ctx, node, x, values, start)
    idx = broadcast(ctx, ctx.reshape(idx, [1] * d + [-1] + [1] * (rank - d - 1)), target)
    layer = ctx.network.add_scatter(x, idx, values, trt().ScatterMode.ELEMENT)
    layer.axis = d
    return layer.get_output(0)


def _run_start(ctx: ConversionContext, node: Node, d: int) -> Any:
    """Where the index of `index_put` starts (a node or an int) when its positions run consecutively:
    a one-element index, `arange(start, end)` (or its folded constant), or `arange(0, n) + start`
    (transformers' static cache: its cumulative length plus the token count). None otherwise."""
    index = node.args[1][d]  # type: ignore[index]
    val = index.meta.get("val")
    if val is not None and tuple(val.shape) == (1,):
        return index
    first = _arange_start(ctx, index)
    if first is not None:
        return first
    if index.target == aten.add.Tensor and "alpha" not in index.kwargs:
        a, b = index.args
        for run, offset in ((a, b), (b, a)):
            if isinstance(run, Node) and _arange_start(ctx, run) == 0 and _one_element(offset):
                return offset
    return None


def _arange_start(ctx: ConversionContext, node: Node) -> int | None:
    """The first value of an `arange` with step 1 with a constant start, whether still a node or
    already folded into a constant; None for anything else."""
    if node.target in (aten.arange.start_step, aten.arange.start) and isinstance(node.args[0], int):
        step = node.args[2] if len(node.args) > 2 else node.kwargs.get("step", 1)
        return node.args[0] if step == 1 else None
    value = ctx.constants.get(node)
    if value is None or value.dim() != 1 or not value.numel() or value.dtype not in v.INDEX_DTYPES:
        return None
    first = int(value[0])
    return first if torch.equal(value, torch.arange(first, first + value.numel(), dtype=value.dtype)) else None


def _one_element(x: Any) -> bool:
    val = x.meta.get("val") if isinstance(x, Node) else None
    return isinstance(val, torch.Tensor) and val.numel() == 1 and val.dtype in v.INDEX_DTYPES


def _updates_in_place(ctx: ConversionContext, node: Node, x: Any, values: Any, d: int) -> bool:
    """TensorRT's KVCacheUpdate layer applies: a [B, H, S, D] cache written along S, which is an
    engine input (with a static S) no other layer reads, updated with values of its own dtype into an
    engine output."""
    cache = node.args[0]
    return (hasattr(ctx.network, "add_kv_cache_update") and len(x.shape) == 4 and d == 2 and x.shape[2] >= 0
            and x.is_network_input and x.dtype == values.dtype and x.dtype in (trt().float32, trt().float16, trt().bfloat16)
            and isinstance(cache, Node) and cache.op == "placeholder" and len(cache.users) == 1
            and any(u.op == "output" for u in node.users))


def _cache_update(ctx: ConversionContext, node: Node, cache: Any, update: Any, start: Node | int) -> Any:
    """`cache[:, :, start:start+T] = update` in the cache's own memory: the engine's output is the
    cache input (bound to one tensor at run time; the binding says so). The start is clamped to the
    cache ([0, S - T]) after torch's wrapping of a negative one, so a position past its end never
    writes outside it (`generate` refuses such a prompt before anything runs)."""
    size = cache.shape[2]
    if isinstance(start, int):
        first = ctx.constant(torch.tensor([start % size if start < 0 else start]), torch.int64)
    else:
        first = ctx.reshape(wrapped_index(ctx, ctx.values[start], size), (1,))
    count = ctx.dims(update)[2]
    count = ctx.constant(torch.tensor([count]), torch.int64) if isinstance(count, int) else ctx.reshape(count, (1,))
    room = elementwise(ctx, ew_ops().SUB, ctx.constant(torch.tensor([size]), torch.int64), count)
    first = elementwise(ctx, ew_ops().MAX, elementwise(ctx, ew_ops().MIN, first, room),
                        ctx.constant(torch.tensor([0]), torch.int64))
    batch = ctx.dims(cache)[0]
    write = first if batch == 1 else broadcast(ctx, first, [batch])
    layer = ctx.network.add_kv_cache_update(cache, update, ctx.cast(write, torch.int32), trt().KVCacheMode.LINEAR)
    ctx.in_place[node] = cache.name
    return layer.get_output(0)


@converter(aten.constant_pad_nd.default, validator=v.NUMERIC)
def constant_pad_nd(ctx: ConversionContext, node: Node, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Pad (or, with negative pads, crop) the last dims: a slice that fills outside the input; a zero
    pad that the convolution after it takes into its own padding passes its input through."""
    if padding_taken_by(node) is not None:
        return args[0]
    x, pad, value = args[0], list(args[1]), float(v.arg(node, 2, "value", 0.0))
    rank = len(x.shape)
    sizes = ctx.dims(x)
    starts: list[Any] = [0] * rank
    extents: list[Any] = list(sizes)
    for k in range(len(pad) // 2):
        axis = rank - 1 - k
        before, after = pad[2 * k], pad[2 * k + 1]
        starts[axis] = -before
        extent = sizes[axis]
        extents[axis] = extent + before + after if isinstance(extent, int) else elementwise(
            ctx, ew_ops().SUM, extent, ctx.constant(torch.tensor(before + after), torch.int64))
    return slice_layer(ctx, x, starts, extents, [1] * rank, trt().SampleMode.FILL,
                       ctx.constant(torch.tensor(value), ctx.node_dtype(node)))


@converter(aten.repeat.default, validator=v.NUMERIC)
def repeat(ctx: ConversionContext, node: Node, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Tile: a slice that wraps around the input, `repeats` times as large."""
    repeats = [int(r) for r in args[1]]
    x = args[0]
    if len(x.shape) < len(repeats):
        x = ctx.reshape(x, [1] * (len(repeats) - len(x.shape)) + ctx.dims(x))
    rank = len(repeats)
    sizes = ctx.dims(x)
    extents = [s * r if isinstance(s, int) else elementwise(ctx, ew_ops().PROD, s, ctx.constant(torch.tensor(r), torch.int64))
               for s, r in zip(sizes, repeats)]
    return slice_layer(ctx, x, [0] * rank, extents, [1] * rank, trt().SampleMode.WRAP)
