"""Converters that add values into the positions an index names, repeated positions adding up:
scatter_add and scatter_reduce's sum, index_put with accumulate (`x[idx] += v`, `index_add`), and
embedding bags (sums, means or maxima of table rows per bag). TensorRT's scatter has no reduction, so
a sum is one matrix product with the index's one-hot matrix (positions x target size): exact for the
values it adds, and bounded in size by `ONE_HOT_LIMIT`."""

from __future__ import annotations

import math
import operator
from typing import Any

import torch

from pipeline.engine.context import ConversionContext
from pipeline.engine.converters import _validators as v
from pipeline.engine.converters._layers import elementwise, ew_ops, norm_dim, slice_layer, unsqueeze_to, wrapped_index
from pipeline.engine.converters.registry import aten_op, converter
from pipeline.engine.trt_api import trt

aten = torch.ops.aten
Node = torch.fx.Node
ONE_HOT_LIMIT = 1 << 26  # elements of the one-hot matrix (or an embedding bag's masked rows) a converter builds
_BAG_MODES = {0: "sum", 1: "mean", 2: "max"}


def one_hot(ctx: ConversionContext, index: Any, size: int, dtype: torch.dtype) -> Any:
    """`index` [..., n] (int64, in range) as [..., n, size] of ones where index == j, else zeros."""
    rank = len(index.shape)
    positions = ctx.constant(torch.arange(size).reshape((1,) * rank + (size,)), torch.int64)
    hit = elementwise(ctx, ew_ops().EQUAL, ctx.reshape(index, [*ctx.dims(index), 1]), positions)
    return ctx.cast(hit, dtype)


def summed_into(ctx: ConversionContext, index: Any, src: Any, size: int, dtype: torch.dtype) -> Any:
    """S [..., size] with S[..., j] the sum of src[..., p] over the p where index[..., p] == j
    (`index` and `src` of one shape [..., n], or a 1-D `index` [n] shared by every row of `src`)."""
    dims = ctx.dims(src)
    if len(index.shape) == 1:  # rows [..., n] times [n, size]
        rows = src if len(dims) > 1 else ctx.reshape(src, [1, *dims])
        hot = unsqueeze_to(ctx, one_hot(ctx, index, size, dtype), len(rows.shape))
        out = ctx.network.add_matrix_multiply(ctx.cast(rows, dtype), trt().MatrixOperation.NONE, hot,
                                              trt().MatrixOperation.NONE).get_output(0)
        return out if len(dims) > 1 else ctx.reshape(out, [size])
    row = ctx.reshape(ctx.cast(src, dtype), [*dims[:-1], 1, dims[-1]])  # each position's values as a [1, n] row
    out = ctx.network.add_matrix_multiply(row, trt().MatrixOperation.NONE, one_hot(ctx, index, size, dtype),
                                          trt().MatrixOperation.NONE).get_output(0)
    return ctx.reshape(out, [*dims[:-1], size])


def _moved_last(ctx: ConversionContext, x: Any, dim: int) -> Any:
    """`x` with dim `dim` moved last (no layer when it is last)."""
    rank = len(x.shape)
    if dim == rank - 1:
        return x
    layer = ctx.network.add_shuffle(x)
    layer.first_transpose = tuple(d for d in range(rank) if d != dim) + (dim,)
    return layer.get_output(0)


def _moved_back(ctx: ConversionContext, x: Any, dim: int) -> Any:
    """The inverse of `_moved_last`."""
    rank = len(x.shape)
    if dim == rank - 1:
        return x
    layer = ctx.network.add_shuffle(x)
    layer.first_transpose = tuple(range(dim)) + (rank - 1,) + tuple(range(dim, rank - 1))
    return layer.get_output(0)


def _one_hot_ok(positions: Any, size: Any) -> str | None:
    """Refuse a one-hot matrix whose size is unknown or past `ONE_HOT_LIMIT`."""
    if not isinstance(size, int):
        return "the target dim must be static (its one-hot matrix is built at build time)"
    if all(isinstance(d, int) for d in positions) and math.prod(positions) * size > ONE_HOT_LIMIT:
        return f"a one-hot matrix of {math.prod(positions) * size:,} elements (over {ONE_HOT_LIMIT:,})"
    return None


def _scatter_add_ok(node: Node, spec: Any) -> str | None:
    x, index = node.args[0].meta["val"], node.args[2].meta["val"]  # type: ignore[union-attr]
    if x.dtype not in v.FLOAT_DTYPES:
        return f"a sum into {str(x.dtype).removeprefix('torch.')} (the one-hot product runs in floating point)"
    if index.dtype not in v.INDEX_DTYPES:
        return f"index dtype {str(index.dtype).removeprefix('torch.')} is not int32/int64"
    if aten_op(node.target) == aten.scatter_reduce.two and v.arg(node, 4, "reduce") != "sum":
        return f"scatter_reduce with reduce={v.arg(node, 4, 'reduce')!r} (only 'sum')"
    dim = norm_dim(int(node.args[1]), x.dim())  # type: ignore[arg-type]
    if any(index.shape[d] is not x.shape[d] and index.shape[d] != x.shape[d] for d in range(x.dim()) if d != dim):
        return "an index smaller than the input outside its dim"
    return _one_hot_ok(list(index.shape), x.shape[dim])


@converter(aten.scatter_add.default, aten.scatter_reduce.two, validator=_scatter_add_ok)
def scatter_add(ctx: ConversionContext, node: Node, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """`x` plus, at each position `index` names along `dim`, the `src` values sent there (for
    scatter_reduce without `include_self`, only those values where any arrive)."""
    x, dim, index, src = args[0], norm_dim(int(args[1]), len(args[0].shape)), args[2], args[3]
    dtype = ctx.node_dtype(node)
    index_shape = list(node.args[2].meta["val"].shape)  # type: ignore[union-attr]
    if list(src.shape) != [d if isinstance(d, int) else -1 for d in index_shape]:  # only index's part is read
        src = slice_layer(ctx, src, [0] * len(index_shape), ctx.dims(index), [1] * len(index_shape))
    size = int(x.shape[dim])
    index = _moved_last(ctx, wrapped_index(ctx, index, size), dim)
    added = _moved_back(ctx, summed_into(ctx, index, _moved_last(ctx, src, dim), size, dtype), dim)
    x = ctx.cast(x, dtype)
    if aten_op(node.target) == aten.scatter_reduce.two and not v.arg(node, 5, "include_self", True):
        ones = ctx.cast(elementwise(ctx, ew_ops().EQUAL, index, index), dtype)
        arrived = _moved_back(ctx, summed_into(ctx, index, ones, size, dtype), dim)
        hit = elementwise(ctx, ew_ops().GREATER, arrived, ctx.tensor(0, like=arrived, dtype=dtype))
        return ctx.network.add_select(hit, added, x).get_output(0)
    return elementwise(ctx, ew_ops().SUM, x, added)


def index_put_added(ctx: ConversionContext, x: Any, index: Any, values: Any, d: int, dtype: torch.dtype) -> Any:
    """`x[..., index, ...] += values` along dim `d` (`index` 1-D, non-negative; values already broadcast to
    x's shape with `d` of the index's length), repeated indices adding up as torch's `accumulate=True` does."""
    size = int(x.shape[d])
    added = _moved_back(ctx, summed_into(ctx, index, _moved_last(ctx, values, d), size, dtype), d)
    return elementwise(ctx, ew_ops().SUM, ctx.cast(x, dtype), added)


def index_put_added_ok(node: Node) -> str | None:
    """Why `index_put_added` cannot take `node` (an index_put with accumulate=True), or None."""
    x = node.args[0].meta["val"]  # type: ignore[union-attr]
    if x.dtype not in v.FLOAT_DTYPES:
        return f"x[idx] += v into {str(x.dtype).removeprefix('torch.')} (the one-hot product runs in floating point)"
    d = next(i for i, t in enumerate(node.args[1]) if t is not None)  # type: ignore[arg-type]
    n = node.args[1][d].meta["val"].shape[0]  # type: ignore[index]
    return _one_hot_ok([*(s for i, s in enumerate(x.shape) if i != d), n], x.shape[d])


def _bag_ok(node: Node, spec: Any) -> str | None:
    weight, indices, offsets = (a.meta["val"] for a in node.args[:3])  # type: ignore[union-attr]
    mode = v.arg(node, 4, "mode", 0)
    if weight.dtype not in v.FLOAT_DTYPES or indices.dim() != 1 or offsets.dim() != 1:
        return "an embedding bag needs a floating-point table and 1-D indices and offsets"
    if mode not in _BAG_MODES:
        return f"embedding bag mode {mode}"
    if any(u.target is not operator.getitem or u.args[1] != 0 for u in node.users):
        return "an embedding bag whose offset2bag, bag sizes or max indices are read"
    bags = offsets.shape[0] - bool(v.arg(node, 7, "include_last_offset", False))
    width = weight.shape[1] if mode == 2 else 1  # max compares every index's row with every bag's
    return _one_hot_ok([indices.shape[0], width], bags)


@converter(aten._embedding_bag.default, aten._embedding_bag_forward_only.default, validator=_bag_ok)
def embedding_bag(ctx: ConversionContext, node: Node, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Per bag (the indices from one offset to the next), the sum, mean or maximum of the table rows its
    indices name (times `per_sample_weights` where given); an empty bag gives zeros, and indices equal to
    `padding_idx` count for nothing, as in torch."""
    weight, indices, offsets = args[0], ctx.cast(args[1], torch.int64), ctx.cast(args[2], torch.int64)
    mode, per_sample, include_last, padding = (args[i] if len(args) > i else kwargs.get(name, d) for i, name, d in (
        (4, "mode", 0), (6, "per_sample_weights", None), (7, "include_last_offset", False), (8, "padding_idx", -1)))
    dtype, mop = ctx.node_dtype(node), trt().MatrixOperation
    bags = int(offsets.shape[0]) - bool(include_last)
    rows = ctx.network.add_gather(ctx.cast(weight, dtype), indices, 0).get_output(0)  # [n, D]
    n = ctx.dims(indices)[0]
    member = _bag_members(ctx, offsets, bags, bool(include_last), n)  # [n, bags]: index p is in bag b
    if padding is not None and padding >= 0:
        padded = elementwise(ctx, ew_ops().EQUAL, indices, ctx.tensor(int(padding), like=indices, dtype=torch.int64))
        counted = ctx.network.add_unary(padded, trt().UnaryOperation.NOT).get_output(0)
        member = elementwise(ctx, ew_ops().AND, member, ctx.reshape(counted, [n, 1]))
    if per_sample is not None:
        rows = elementwise(ctx, ew_ops().PROD, rows, ctx.reshape(ctx.cast(per_sample, dtype), [n, 1]))
    if _BAG_MODES[mode] == "max":
        return _bag_max(ctx, rows, member, n, bags, dtype), None, None, None
    weights = ctx.cast(member, dtype)
    out = ctx.network.add_matrix_multiply(weights, mop.TRANSPOSE, rows, mop.NONE).get_output(0)  # [bags, D]
    if _BAG_MODES[mode] == "mean":
        sizes = ctx.reshape(ctx.network.add_reduce(weights, trt().ReduceOperation.SUM, 1, False).get_output(0), [bags, 1])
        out = elementwise(ctx, ew_ops().DIV, out, elementwise(ctx, ew_ops().MAX, sizes, ctx.tensor(1, like=sizes, dtype=dtype)))
    return out, None, None, None


def _bag_members(ctx: ConversionContext, offsets: Any, bags: int, include_last: bool, n: Any) -> Any:
    """[n, bags] bool: position p lies in bag b (from offsets[b] up to the next bag's offset, or to the end)."""
    starts = slice_layer(ctx, offsets, [0], [bags], [1])
    if include_last:
        ends = slice_layer(ctx, offsets, [1], [bags], [1])
    elif bags > 1:
        ends = ctx.network.add_concatenation([slice_layer(ctx, offsets, [1], [bags - 1], [1]), ctx.shape_tensor([n])]).get_output(0)
    else:
        ends = ctx.shape_tensor([n])
    fill = ctx.network.add_fill((0,), trt().FillOperation.LINSPACE, trt().int64)
    fill.set_input(0, ctx.shape_tensor([n]))
    fill.set_input(1, ctx.constant(torch.tensor(0), torch.int64))
    fill.set_input(2, ctx.constant(torch.ones(1, dtype=torch.int64), torch.int64))
    position = ctx.reshape(fill.get_output(0), [n, 1])
    begun = elementwise(ctx, ew_ops().LESS, position, ctx.reshape(starts, [1, bags]))
    begun = ctx.network.add_unary(begun, trt().UnaryOperation.NOT).get_output(0)
    return elementwise(ctx, ew_ops().AND, begun, elementwise(ctx, ew_ops().LESS, position, ctx.reshape(ends, [1, bags])))


def _bag_max(ctx: ConversionContext, rows: Any, member: Any, n: Any, bags: int, dtype: torch.dtype) -> Any:
    """Per bag the largest of its rows in each column; zeros for an empty bag."""
    width = ctx.dims(rows)[1]
    spread = ctx.reshape(rows, [n, 1, width])
    floor = ctx.constant(torch.tensor(float("-inf")).reshape(1, 1, 1), dtype)
    masked = ctx.network.add_select(ctx.reshape(member, [n, bags, 1]), spread, floor).get_output(0)
    largest = ctx.network.add_reduce(masked, trt().ReduceOperation.MAX, 1, False).get_output(0)  # [bags, D]
    filled = ctx.network.add_reduce(ctx.cast(member, dtype), trt().ReduceOperation.MAX, 1, False).get_output(0)
    nonempty = elementwise(ctx, ew_ops().GREATER, ctx.reshape(filled, [bags, 1]), ctx.tensor(0, like=largest, dtype=dtype))
    return ctx.network.add_select(nonempty, largest, ctx.tensor(0, like=largest, dtype=dtype)).get_output(0)
