"""Converter for `aten.convolution` (1-D as 2-D with a unit height, 2-D and 3-D; groups, depthwise, stride, padding, dilation,
bias, and transposed convolution)."""

from __future__ import annotations

from typing import Any

import torch

from pipeline.tensorrt.context import ConversionContext
from pipeline.tensorrt.converters import _validators as v
from pipeline.tensorrt.converters.normalization import batch_norm_folded_into
from pipeline.tensorrt.converters.registry import converter
from pipeline.tensorrt.trt_api import trt

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


@converter(aten.convolution.default, validator=_conv_ok)
def convolution(ctx: ConversionContext, node: Node, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    x, weight, bias, stride, padding, dilation, transposed, _, groups = args[:9]
    wshape = tuple(node.args[1].meta["val"].shape)  # type: ignore[union-attr]
    dtype = ctx.node_dtype(node)
    x = ctx.cast(x, dtype)
    folded = batch_norm_folded_into(ctx, node)
    if folded is not None:  # conv + inference batch norm -> one convolution
        weight, bias = ctx.constant(folded[0]), ctx.constant(folded[1])
    if len(wshape) == 3:  # 1-D: [N, C, L] as [N, C, 1, L]
        dims = ctx.dims(x)
        x = ctx.reshape(x, dims[:2] + [1, dims[2]])
        weight = ctx.reshape(weight, (wshape[0], wshape[1], 1, wshape[2]))
        wshape = (wshape[0], wshape[1], 1, wshape[2])
        stride, padding, dilation = (1, *_expand(stride, 1)), (0, *_expand(padding, 1)), (1, *_expand(dilation, 1))
        out = _convolve(ctx, x, weight, bias, wshape, (stride, padding, dilation), transposed, groups, dtype)
        out_dims = ctx.dims(out)
        return ctx.reshape(out, out_dims[:2] + [out_dims[3]])
    return _convolve(ctx, x, weight, bias, wshape, (stride, padding, dilation), transposed, groups, dtype)


def _convolve(ctx: ConversionContext, x: Any, weight: Any, bias: Any, wshape: tuple[int, ...],
              geometry: tuple[Any, Any, Any], transposed: bool, groups: int, dtype: torch.dtype) -> Any:
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
    layer.dilation_nd = _expand(dilation, spatial)
    layer.num_groups = int(groups)
    return layer.get_output(0)


def _expand(values: Any, n: int) -> tuple[int, ...]:
    values = list(values)
    return tuple(int(x) for x in (values * n if len(values) == 1 else values))
