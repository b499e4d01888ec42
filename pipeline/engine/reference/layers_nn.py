"""Evaluators of the layers of neural-network building blocks: convolutions, pooling, resizing and
grid sampling, normalization, quantize and dequantize (per tensor, per channel, in blocks), and
attention."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from pipeline.engine.reference.registry import (
    ReferenceError,
    Values,
    axes_of,
    dims,
    evaluates,
    name,
    torch_dtype,
    unknown,
    wide,
)

_CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}
_DECONV = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}
_MAX_POOL = {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}
_AVG_POOL = {1: F.avg_pool1d, 2: F.avg_pool2d, 3: F.avg_pool3d}


def _pads(layer: Any, spatial: int) -> tuple[list[int], list[int]]:
    return dims(layer.pre_padding)[:spatial], dims(layer.post_padding)[:spatial]


def _torch_pad(pre: list[int], post: list[int]) -> list[int]:
    """F.pad's order (last dim first) of per-dim pre and post paddings."""
    return [p for a in reversed(range(len(pre))) for p in (pre[a], post[a])]


def _operands(layer: Any, args: Values) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, int]:
    """A (de)convolution's input, kernel and bias (given as inputs 1 and 2) and its spatial rank."""
    x, kernel, bias = args[0], args[1], args[2] if len(args) > 2 else None
    if kernel is None:
        raise unknown(layer, "a kernel given as weights, not as input", 1)
    assert x is not None
    return wide(x), wide(kernel), None if bias is None else wide(bias), x.dim() - 2


@evaluates("CONVOLUTION", "IConvolutionLayer")
def convolution(layer: Any, args: Values, raw: dict[str, np.ndarray]) -> list[torch.Tensor]:
    x, kernel, bias, spatial = _operands(layer, args)
    if name(layer.padding_mode) not in ("EXPLICIT_ROUND_DOWN",):
        raise unknown(layer, "padding mode", name(layer.padding_mode))
    pre, post = _pads(layer, spatial)
    out = _CONV[spatial](F.pad(x, _torch_pad(pre, post)), kernel, bias, dims(layer.stride_nd)[:spatial], 0,
                         dims(layer.dilation_nd)[:spatial], int(layer.num_groups))
    return [out]


@evaluates("DECONVOLUTION", "IDeconvolutionLayer")
def deconvolution(layer: Any, args: Values, raw: dict[str, np.ndarray]) -> list[torch.Tensor]:
    """The transposed convolution of the whole input, then `pre_padding` / `post_padding` cropped."""
    x, kernel, bias, spatial = _operands(layer, args)
    pre, post = _pads(layer, spatial)
    out = _DECONV[spatial](x, kernel, bias, dims(layer.stride_nd)[:spatial], 0, 0, int(layer.num_groups),
                           dims(layer.dilation_nd)[:spatial])
    for a in range(spatial):
        out = out.narrow(2 + a, pre[a], out.shape[2 + a] - pre[a] - post[a])
    return [out]


@evaluates("POOLING", "IPoolingLayer")
def pooling(layer: Any, args: Values, raw: dict[str, np.ndarray]) -> list[torch.Tensor]:
    """Windows over the input padded before and after; rounding up adds windows past the padding
    (counted by nothing). An average divides by the window's elements inside the input, or inside the
    padded input unless `average_count_excludes_padding`."""
    x = wide(args[0])  # type: ignore[arg-type]
    kind, mode = name(layer.type), name(layer.padding_mode)
    if kind not in ("MAX", "AVERAGE") or mode not in ("EXPLICIT_ROUND_DOWN", "EXPLICIT_ROUND_UP"):
        raise unknown(layer, "type and padding mode", (kind, mode))
    window = dims(layer.window_size_nd)
    spatial = len(window)
    stride = dims(layer.stride_nd)[:spatial]
    pre, post = _pads(layer, spatial)
    extra = []  # past the padding: what the windows a round-up adds reach
    for a in range(spatial):
        span = x.shape[2 + a] + pre[a] + post[a] - window[a]
        windows = -(-span // stride[a]) if mode == "EXPLICIT_ROUND_UP" else span // stride[a]
        extra.append(max(windows * stride[a] - span, 0))
    reach = _torch_pad(pre, [p + e for p, e in zip(post, extra)])
    if kind == "MAX":
        return [_MAX_POOL[spatial](F.pad(x, reach, value=-math.inf), window, stride)]
    inside = torch.ones_like(x[:1, :1])
    counted = F.pad(F.pad(inside, _torch_pad(pre, post), value=0.0 if layer.average_count_excludes_padding else 1.0),
                    _torch_pad([0] * spatial, extra))
    avg = _AVG_POOL[spatial]
    return [avg(F.pad(x, reach), window, stride) / avg(counted, window, stride)]


def _source(layer: Any, i: torch.Tensor, n: int, m: int, scale: float) -> torch.Tensor:
    kind = name(layer.coordinate_transformation)
    if kind == "ALIGN_CORNERS":
        return i * ((n - 1) / (m - 1)) if m > 1 else torch.zeros_like(i)
    if kind == "ASYMMETRIC":
        return i / scale
    if kind == "HALF_PIXEL":
        return (i + 0.5) / scale - 0.5
    raise unknown(layer, "coordinate transformation", kind)


@evaluates("RESIZE", "IResizeLayer")
def resize(layer: Any, args: Values, raw: dict[str, np.ndarray]) -> list[torch.Tensor]:
    """Separable: each axis whose size changes mapped by its coordinate transformation, then read at
    the nearest index (rounded as `nearest_rounding` says) or linearly between the two around it."""
    x = wide(args[0])  # type: ignore[arg-type]
    given = args[1] if len(args) > 1 else None
    scales = list(layer.scales) if layer.scales else []
    if given is not None:
        size = [int(d) for d in given.tolist()]
    elif scales:
        size = [int(math.floor(n * s)) for n, s in zip(x.shape, scales)]
    else:
        size = dims(layer.shape)
    mode = name(layer.resize_mode)
    if mode not in ("NEAREST", "LINEAR"):
        raise unknown(layer, "mode", mode)
    for a, (n, m) in enumerate(zip(x.shape, size)):
        scale = float(scales[a]) if scales else m / n
        if n == m and scale == 1.0:
            continue
        src = _source(layer, torch.arange(m, dtype=torch.float64), n, m, scale)
        if mode == "NEAREST":
            rounding = name(layer.nearest_rounding)
            index = {"FLOOR": torch.floor, "CEIL": torch.ceil, "HALF_UP": lambda s: torch.floor(s + 0.5),
                     "HALF_DOWN": lambda s: torch.ceil(s - 0.5)}[rounding](src)
            x = x.index_select(a, index.clamp(0, n - 1).to(torch.int64))
            continue
        src = src.clamp(0, n - 1)
        low = src.floor().to(torch.int64)
        high = (low + 1).clamp(max=n - 1)
        w = (src - low).to(x.dtype).reshape([-1 if d == a else 1 for d in range(x.dim())])
        x = x.index_select(a, low) * (1 - w) + x.index_select(a, high) * w
    return [x]


@evaluates("GRID_SAMPLE", "IGridSampleLayer")
def grid_sample(layer: Any, args: Values, raw: dict[str, np.ndarray]) -> list[torch.Tensor]:
    x, grid = wide(args[0]), wide(args[1])  # type: ignore[arg-type]
    modes = {"LINEAR": "bilinear", "NEAREST": "nearest", "CUBIC": "bicubic"}
    pads = {"FILL": "zeros", "CLAMP": "border", "REFLECT": "reflection"}
    mode, pad = name(layer.interpolation_mode), name(layer.sample_mode)
    if mode not in modes or pad not in pads:
        raise unknown(layer, "interpolation and sample mode", (mode, pad))
    return [F.grid_sample(x, grid, mode=modes[mode], padding_mode=pads[pad], align_corners=bool(layer.align_corners))]


@evaluates("NORMALIZATION", "INormalizationLayer")
def normalization(layer: Any, args: Values, raw: dict[str, np.ndarray]) -> list[torch.Tensor]:
    """(x - mean) / sqrt(var + epsilon) * scale + bias, mean and (biased) variance over `axes`."""
    x, scale, bias = (wide(a) for a in args[:3])  # type: ignore[arg-type]
    if int(layer.num_groups) != 1:
        raise unknown(layer, "num_groups", int(layer.num_groups))
    axes = axes_of(int(layer.axes), x.dim())
    mean = x.mean(axes, keepdim=True)
    var = x.var(axes, unbiased=False, keepdim=True)
    return [(x - mean) / torch.sqrt(var + float(layer.epsilon)) * scale + bias]


def _spread(scale: torch.Tensor, x: torch.Tensor, layer: Any) -> torch.Tensor:
    """The scale of each element of `x`: one for all, one per index of `axis`, or one per block (a
    scale of x's rank whose dims divide x's)."""
    if scale.numel() == 1:
        return scale.reshape(())
    if scale.dim() == 1 and scale.dim() != x.dim():
        return scale.reshape([-1 if a == int(layer.axis) % x.dim() else 1 for a in range(x.dim())])
    if scale.dim() != x.dim():
        raise unknown(layer, "a scale of rank", scale.dim())
    for a in range(x.dim()):
        if scale.shape[a] != x.shape[a]:
            if x.shape[a] % scale.shape[a]:
                raise ReferenceError(f"{name(layer.type)} layer '{layer.name}': blocks of dim {a} do not divide it")
            scale = scale.repeat_interleave(x.shape[a] // scale.shape[a], dim=a)
    return scale


_LEVELS = {torch.int8: 127.0}


@evaluates("QUANTIZE", "IQuantizeLayer")
def quantize(layer: Any, args: Values, raw: dict[str, np.ndarray]) -> list[torch.Tensor]:
    """x / scale, rounded half to even and saturated to the stored type (fp8: e4m3, at most 448)."""
    x, scale = wide(args[0]), wide(args[1])  # type: ignore[arg-type]
    if len(args) > 2 and args[2] is not None:
        raise unknown(layer, "a zero point", "input")
    q = x / _spread(scale, x, layer)
    out = layer.get_output(0)
    target = torch_dtype(out.dtype)
    if target == torch.float8_e4m3fn:
        return [q.clamp(-448.0, 448.0)]
    low, high = (-8.0, 7.0) if name(out.dtype) == "INT4" else (-128.0, 127.0)
    return [torch.round(q).clamp(low, high)]


@evaluates("DEQUANTIZE", "IDequantizeLayer")
def dequantize(layer: Any, args: Values, raw: dict[str, np.ndarray]) -> list[torch.Tensor]:
    x, scale = args[0], wide(args[1])  # type: ignore[arg-type]
    assert x is not None
    if len(args) > 2 and args[2] is not None:
        raise unknown(layer, "a zero point", "input")
    values = x.to(torch.float32)
    return [values * _spread(scale, values, layer)]


@evaluates("ATTENTION_INPUT", "IAttentionInputLayer")
def attention(layer: Any, args: Values, raw: dict[str, np.ndarray]) -> list[torch.Tensor]:
    """softmax(q k^T, masked: a boolean mask keeps where true, a float one is added) v, unscaled (the
    converter scales q first)."""
    q, k, v = (wide(a) for a in args[:3])  # type: ignore[arg-type]
    mask = args[3] if len(args) > 3 else None
    spec = layer.attention
    if name(spec.norm_op) != "SOFTMAX" or name(spec.causal_kind) != "NONE" or spec.causal:
        raise unknown(layer, "normalization and causal mask", (name(spec.norm_op), name(spec.causal_kind)))
    scores = q @ k.transpose(-1, -2)
    if mask is not None:
        scores = scores.masked_fill(~mask.bool(), -math.inf) if mask.dtype == torch.bool else scores + wide(mask)
    return [torch.softmax(scores, dim=-1) @ v]


@evaluates("ATTENTION_OUTPUT", "IAttentionOutputLayer")
def attention_output(layer: Any, args: Values, raw: dict[str, np.ndarray]) -> list[torch.Tensor]:
    return [args[0]]  # type: ignore[list-item]  # the attention's value, computed by its input layer
