"""Converters for `aten.convolution` (1-D as 2-D with a unit height, 2-D and 3-D; groups, depthwise, stride, padding, dilation,
bias, and transposed convolution; a zero pad just before it taken into its own padding) and `aten.col2im` (`F.fold`, as a
transposed convolution)."""

from __future__ import annotations

from typing import Any

import torch

from pipeline.engine.context import ConversionContext
from pipeline.engine.converters import _validators as v
from pipeline.engine.converters._layers import slice_layer
from pipeline.engine.converters.normalization import batch_norm_folded_into
from pipeline.engine.converters.registry import aten_op, converter
from pipeline.engine.trt_api import trt

aten = torch.ops.aten
Node = torch.fx.Node


def _conv_ok(node: Node, spec: Any) -> str | None:
    reason = v.FLOAT_ONLY(node, spec)
    if reason:
        return reason
    weight = node.args[1]
    if not isinstance(weight, Node) or weight.op not in ("placeholder", "get_attr"):
        return "convolution weight must be a constant of the program (a parameter), not a computed tensor"
    rank = weight.meta["val"].dim()
    if rank not in (3, 4, 5):
        return f"only 1-D, 2-D and 3-D convolutions are supported, got a weight of rank {rank}"
    transposed, out_pad = node.args[6], node.args[7]
    if transposed and any(p != 0 for p in out_pad):
        return f"transposed convolution with output_padding={list(out_pad)} is not supported"
    channels = node.args[0].meta["val"].shape[1]  # type: ignore[union-attr]
    if not isinstance(channels, int):
        return "the channel dimension of a convolution input must be static"
    return None


def padding_taken_by(pad: Node) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """The (before, after) margins per spatial dim of `pad`, a zero `constant_pad_nd` whose only reader is
    a convolution that takes them into its own padding (asymmetric "same" padding, as TensorFlow-style
    models write it); None when it does not apply. The pad's converter then passes its input through."""
    users = list(pad.users)
    if aten_op(pad.target) != aten.constant_pad_nd.default or len(users) != 1:
        return None
    conv = users[0]
    if aten_op(conv.target) != aten.convolution.default or conv.args[0] is not pad or conv.args[6]:
        return None
    margins, value = list(pad.args[1]), v.arg(pad, 2, "value", 0.0)
    spatial = conv.args[1].meta["val"].dim() - 2  # type: ignore[union-attr]
    if value != 0 or any(m < 0 for m in margins) or any(margins[2 * spatial:]):
        return None
    margins += [0] * (2 * spatial - len(margins))
    before = tuple(margins[2 * (spatial - 1 - i)] for i in range(spatial))
    after = tuple(margins[2 * (spatial - 1 - i) + 1] for i in range(spatial))
    return before, after


@converter(aten.convolution.default, validator=_conv_ok)
def convolution(ctx: ConversionContext, node: Node, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    x, weight, bias, stride, padding, dilation, transposed, _, groups = args[:9]
    wshape = tuple(node.args[1].meta["val"].shape)  # type: ignore[union-attr]
    dtype = ctx.node_dtype(node)
    x = ctx.cast(x, dtype)
    source = node.args[0]
    margins = padding_taken_by(source) if isinstance(source, Node) else None
    folded = batch_norm_folded_into(ctx, node)
    if folded is not None:  # conv + inference batch norm -> one convolution
        weight, bias = ctx.constant(folded[0]), ctx.constant(folded[1])
    if len(wshape) == 3:  # 1-D: [N, C, L] as [N, C, 1, L]
        dims = ctx.dims(x)
        x = ctx.reshape(x, dims[:2] + [1, dims[2]])
        weight = ctx.reshape(weight, (wshape[0], wshape[1], 1, wshape[2]))
        wshape = (wshape[0], wshape[1], 1, wshape[2])
        stride, padding, dilation = (1, *_expand(stride, 1)), (0, *_expand(padding, 1)), (1, *_expand(dilation, 1))
        margins = None if margins is None else ((0, *margins[0]), (0, *margins[1]))
        out = _convolve(ctx, x, weight, bias, wshape, (stride, padding, dilation), transposed, groups, dtype, margins)
        out_dims = ctx.dims(out)
        return ctx.reshape(out, out_dims[:2] + [out_dims[3]])
    return _convolve(ctx, x, weight, bias, wshape, (stride, padding, dilation), transposed, groups, dtype, margins)


def _convolve(ctx: ConversionContext, x: Any, weight: Any, bias: Any, wshape: tuple[int, ...],
              geometry: tuple[Any, Any, Any], transposed: bool, groups: int, dtype: torch.dtype,
              margins: tuple[tuple[int, ...], tuple[int, ...]] | None = None) -> Any:
    """One convolution layer; `margins`, the (before, after) zeros of a pad taken in, widen its padding."""
    stride, padding, dilation = geometry
    spatial = len(wshape) - 2
    empty = trt().Weights()  # the kernel comes in through set_input(1), so strongly typed nets keep one dtype
    if transposed:
        layer = ctx.network.add_deconvolution_nd(x, wshape[1] * groups, wshape[2:], empty)
    else:
        layer = ctx.network.add_convolution_nd(x, wshape[0], wshape[2:], empty)
    layer.set_input(1, ctx.cast(weight, dtype))
    if bias is not None:
        layer.set_input(2, ctx.cast(bias, dtype))
    layer.stride_nd = _expand(stride, spatial)
    layer.padding_nd = _expand(padding, spatial)
    if margins is not None:
        layer.pre_padding = tuple(p + m for p, m in zip(_expand(padding, spatial), margins[0]))
        layer.post_padding = tuple(p + m for p, m in zip(_expand(padding, spatial), margins[1]))
    layer.dilation_nd = _expand(dilation, spatial)
    layer.num_groups = int(groups)
    return layer.get_output(0)


def _col2im_ok(node: Node, spec: Any) -> str | None:
    reason = v.FLOAT_ONLY(node, spec)
    if reason:
        return reason
    shape = node.args[0].meta["val"].shape  # type: ignore[union-attr]
    if not all(isinstance(d, int) for d in (*shape[-2:], *node.args[1])):  # type: ignore[misc]
        return "col2im (F.fold) needs static channels, block count and output size"
    return None


@converter(aten.col2im.default, validator=_col2im_ok)
def col2im(ctx: ConversionContext, node: Node, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """`F.fold`, the sum of overlapping blocks: a transposed convolution, one group per channel, whose
    kernel puts each of the channel's kh x kw block entries at its (dilated) offset; then the padding
    cropped, and rows or columns no block reaches filled with zeros. The dilation is in the kernel:
    TensorRT-RTX builds no transposed convolution that is strided and dilated."""
    x, (out_h, out_w) = args[0], args[1]
    (kh, kw), (dh, dw), padding, stride = (_expand(a, 2) for a in args[2:6])
    blocks = [(size + 2 * p - d * (k - 1) - 1) // st + 1
              for size, k, d, p, st in zip((out_h, out_w), (kh, kw), (dh, dw), padding, stride)]
    columns = int(node.args[0].meta["val"].shape[-2])  # type: ignore[union-attr]
    dtype = ctx.node_dtype(node)
    kernel = torch.zeros(columns, 1, dh * (kh - 1) + 1, dw * (kw - 1) + 1)
    for i in range(kh):
        for j in range(kw):
            kernel[i * kw + j::kh * kw, 0, i * dh, j * dw] = 1.0
    dims = ctx.dims(x) if len(x.shape) == 3 else [1]  # unbatched: one batch, dropped again below
    grid = ctx.reshape(ctx.cast(x, dtype), [dims[0], columns, *blocks])
    summed = _convolve(ctx, grid, ctx.constant(kernel, dtype), None, tuple(kernel.shape),
                       (stride, (0, 0), (1, 1)), True, columns // (kh * kw), dtype)
    extents = [dims[0], columns // (kh * kw), out_h, out_w]
    out = slice_layer(ctx, summed, [0, 0, *padding], extents, [1] * 4, trt().SampleMode.FILL,
                      ctx.constant(torch.tensor(0.0), dtype))
    return out if len(x.shape) == 3 else ctx.reshape(out, extents[1:])


def _expand(values: Any, n: int) -> tuple[int, ...]:
    values = list(values)
    return tuple(int(x) for x in (values * n if len(values) == 1 else values))
