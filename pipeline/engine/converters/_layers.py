"""Layer-building helpers shared by several converter families (broadcasting, promotion,
elementwise and unary layers, axis masks)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from pipeline.engine.context import ConversionContext
from pipeline.engine.trt_api import trt


def out_val(node: torch.fx.Node) -> Any:
    """The fake value of a node's (first) output."""
    val = node.meta["val"]
    return val[0] if isinstance(val, (tuple, list)) else val


def norm_dim(dim: int, rank: int) -> int:
    """A non-negative axis index."""
    return dim + rank if dim < 0 else dim


def axes_mask(dims: Sequence[int], rank: int) -> int:
    """TensorRT's bit mask for a set of axes."""
    mask = 0
    for d in dims:
        mask |= 1 << norm_dim(int(d), rank)
    return mask


def unsqueeze_to(ctx: ConversionContext, x: Any, rank: int) -> Any:
    """Prepend unit dims so `x` has `rank` dims (TensorRT broadcasts only equal ranks)."""
    missing = rank - len(x.shape)
    if missing <= 0:
        return x
    return ctx.reshape(x, [1] * missing + ctx.dims(x))


def broadcast(ctx: ConversionContext, x: Any, target: Sequence[Any]) -> Any:
    """`x` (already of the target's rank) repeated along its unit dims to `target` (ints and
    ITensors): a slice with stride 0 there. A dynamic dim of `x` is never broadcast (torch requires
    it to equal the target's or be 1)."""
    strides = [0 if d == 1 else 1 for d in x.shape]
    return slice_layer(ctx, x, [0] * len(target), list(target), strides)


def slice_layer(ctx: ConversionContext, x: Any, starts: Sequence[Any], sizes: Sequence[Any], strides: Sequence[int],
                mode: Any = None, fill: Any = None) -> Any:
    """A slice of `x` (starts and sizes ints or ITensors); `mode` samples outside the input
    (`SampleMode.FILL` with the `fill` tensor, `WRAP` to tile)."""
    static = all(isinstance(s, int) for s in [*starts, *sizes])
    rank = len(starts)
    layer = ctx.network.add_slice(x, tuple(starts) if static else (0,) * rank, tuple(sizes) if static else (1,) * rank,
                                  tuple(strides))
    if not static:
        layer.set_input(1, ctx.shape_tensor(list(starts)))
        layer.set_input(2, ctx.shape_tensor(list(sizes)))
    if mode is not None:
        layer.mode = mode
    if fill is not None:
        layer.set_input(4, fill)
    return layer.get_output(0)


def promoted(ctx: ConversionContext, node: torch.fx.Node, a: Any, b: Any, dtype: torch.dtype | None = None) -> tuple[Any, Any]:
    """Both operands as ITensors of one dtype and rank, following torch's promotion for `node`."""
    if dtype is None:
        args = [x.meta["val"] if isinstance(x, torch.fx.Node) else x for x in node.args[:2]]
        dtype = ctx.compute(torch.result_type(*args))
    ref = a if hasattr(a, "shape") and not isinstance(a, (int, float, bool)) else b
    a = ctx.tensor(a, like=ref, dtype=dtype)
    b = ctx.tensor(b, like=ref, dtype=dtype)
    rank = max(len(a.shape), len(b.shape))
    return unsqueeze_to(ctx, a, rank), unsqueeze_to(ctx, b, rank)


def elementwise(ctx: ConversionContext, op: Any, a: Any, b: Any) -> Any:
    """One elementwise layer (operands already promoted)."""
    return ctx.network.add_elementwise(a, b, op).get_output(0)


def unary(ctx: ConversionContext, x: Any, op: Any) -> Any:
    return ctx.network.add_unary(x, op).get_output(0)


def activation(ctx: ConversionContext, x: Any, kind: Any, alpha: float | None = None, beta: float | None = None) -> Any:
    layer = ctx.network.add_activation(x, kind)
    if alpha is not None:
        layer.alpha = alpha
    if beta is not None:
        layer.beta = beta
    return layer.get_output(0)


def ew_ops() -> Any:
    return trt().ElementWiseOperation


def unary_ops() -> Any:
    return trt().UnaryOperation


def separable_linear(ctx: ConversionContext, x: Any, matrices: Sequence[torch.Tensor]) -> Any:
    """`x` mapped along its last `len(matrices)` dims, each by its own matrix [out, in] (a constant):
    what a resize or an average pooling over boxes computes, as one matrix product per dim."""
    mop = trt().MatrixOperation
    x = ctx.cast(x, ctx.compute(torch.float32))
    rank, n = len(x.shape), len(matrices)
    lead = ctx.dims(x)[:rank - n]
    outs = [int(m.shape[0]) for m in matrices]
    sizes = [int(m.shape[1]) for m in matrices]
    for i in reversed(range(n)):  # the last dim first: x @ M^T; every other: M @ x over it and the dims after it
        matrix = ctx.constant(matrices[i].to(torch.float32))
        if i == n - 1:
            x = ctx.network.add_matrix_multiply(x, mop.NONE, unsqueeze_to(ctx, matrix, len(x.shape)), mop.TRANSPOSE)
        else:
            rows = int(torch.tensor(outs[i + 1:]).prod())
            x = ctx.reshape(x, [*lead, *sizes[:i], sizes[i], rows]) if i < n - 2 else x
            x = ctx.network.add_matrix_multiply(unsqueeze_to(ctx, matrix, len(x.shape)), mop.NONE, x, mop.NONE)
        x = x.get_output(0)
    return ctx.reshape(x, [*lead, *outs]) if n > 2 else x


def wrapped_index(ctx: ConversionContext, index: Any, size: Any) -> Any:
    """torch's negative indices (count from the end) as non-negative int64 ones."""
    index = ctx.cast(index, torch.int64)
    size = ctx.constant(torch.tensor(size), torch.int64) if isinstance(size, int) else size
    size = ctx.reshape(size, (1,) * len(index.shape)) if len(index.shape) else size
    negative = elementwise(ctx, ew_ops().LESS, index, ctx.tensor(0, like=index, dtype=torch.int64))
    shifted = elementwise(ctx, ew_ops().SUM, index, size)
    return ctx.network.add_select(negative, shifted, index).get_output(0)
