"""Evaluators of the layers that move, select, combine and reduce values: constants and casts,
elementwise and unary math, activations, shuffles, slices, gathers and scatters, fills, reductions,
products and the KV-cache update. Each follows TensorRT's documented meaning of its attributes."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

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
from pipeline.engine.trt_api import trt


def _given(args: Values, k: int) -> torch.Tensor | None:
    return args[k] if k < len(args) else None


def _decode(data: np.ndarray, dtype: Any, count: int) -> torch.Tensor:
    """Constant bytes as TensorRT lays its types out: int4 two to a byte, the first value in the low
    nibble; fp8 (e4m3), bfloat16 and float16 as their bits."""
    t = trt()
    raw = torch.from_numpy(np.frombuffer(data.tobytes(), dtype=np.uint8).copy())
    if dtype == t.int4:
        nibbles = torch.stack([raw & 0xF, raw >> 4], dim=-1).reshape(-1)[:count].to(torch.int8)
        return torch.where(nibbles > 7, nibbles - 16, nibbles)
    if dtype == t.fp8:
        return raw[:count].view(torch.float8_e4m3fn)
    return raw.view(torch_dtype(dtype))[:count]


@evaluates("CONSTANT", "IConstantLayer")
def constant(layer: Any, args: Values, raw: dict[str, np.ndarray]) -> list[torch.Tensor]:
    shape, out = dims(layer.shape), layer.get_output(0)
    if out.name in raw:
        return [_decode(raw[out.name], out.dtype, math.prod(shape)).reshape(shape)]
    weights = layer.weights
    if not isinstance(weights, np.ndarray):
        raise unknown(layer, "weights of type", getattr(weights, "dtype", type(weights)))
    return [torch.from_numpy(np.array(weights)).reshape(shape)]


@evaluates("CAST", "ICastLayer")
def cast(layer: Any, args: Values, raw: dict[str, np.ndarray]) -> list[torch.Tensor]:
    x = args[0]
    assert x is not None
    target = torch_dtype(layer.to_type)
    if x.is_floating_point() and not target.is_floating_point and target != torch.bool:
        x = x.float().trunc()  # float to integer: toward zero
    return [x.to(target)]


@evaluates("IDENTITY", "IIdentityLayer")
def identity(layer: Any, args: Values, raw: dict[str, np.ndarray]) -> list[torch.Tensor]:
    return [args[0]]  # type: ignore[list-item]  # the output's declared type is applied by the walker


_ELEMENTWISE: dict[str, Callable[..., torch.Tensor]] = {
    "SUM": torch.add, "PROD": torch.mul, "MAX": torch.maximum, "MIN": torch.minimum, "SUB": torch.sub,
    "POW": torch.pow, "FLOOR_DIV": lambda a, b: torch.div(a, b, rounding_mode="floor"),
    "AND": torch.logical_and, "OR": torch.logical_or, "XOR": torch.logical_xor,
    "EQUAL": torch.eq, "GREATER": torch.gt, "LESS": torch.lt,
}


@evaluates("ELEMENTWISE", "IElementWiseLayer")
def elementwise(layer: Any, args: Values, raw: dict[str, np.ndarray]) -> list[torch.Tensor]:
    a, b = (wide(x) for x in args[:2])  # type: ignore[arg-type]
    if a.dim() != b.dim():
        raise ReferenceError(f"ELEMENTWISE layer '{layer.name}' has inputs of ranks {a.dim()} and {b.dim()}; "
                             "TensorRT broadcasts only dims of size 1 of equal ranks")
    op = name(layer.op)
    if op == "DIV":
        return [torch.div(a, b, rounding_mode=None if a.is_floating_point() else "trunc")]
    if op not in _ELEMENTWISE:
        raise unknown(layer, "operation", op)
    return [_ELEMENTWISE[op](a, b)]


_UNARY: dict[str, Callable[..., torch.Tensor]] = {
    "EXP": torch.exp, "LOG": torch.log, "SQRT": torch.sqrt, "RECIP": torch.reciprocal, "ABS": torch.abs,
    "NEG": torch.neg, "SIN": torch.sin, "COS": torch.cos, "TAN": torch.tan, "SINH": torch.sinh, "COSH": torch.cosh,
    "ASIN": torch.asin, "ACOS": torch.acos, "ATAN": torch.atan, "ASINH": torch.asinh, "ACOSH": torch.acosh,
    "ATANH": torch.atanh, "CEIL": torch.ceil, "FLOOR": torch.floor, "ERF": torch.erf, "NOT": torch.logical_not,
    "SIGN": torch.sign, "ROUND": torch.round, "ISINF": torch.isinf, "ISNAN": torch.isnan,
}


@evaluates("UNARY", "IUnaryLayer")
def unary(layer: Any, args: Values, raw: dict[str, np.ndarray]) -> list[torch.Tensor]:
    op = name(layer.op)
    if op not in _UNARY:
        raise unknown(layer, "operation", op)
    return [_UNARY[op](wide(args[0]))]  # type: ignore[arg-type]  # ROUND: half to even, as TensorRT's


@evaluates("ACTIVATION", "IActivationLayer")
def activation(layer: Any, args: Values, raw: dict[str, np.ndarray]) -> list[torch.Tensor]:
    x, a, b = wide(args[0]), float(layer.alpha), float(layer.beta)  # type: ignore[arg-type]
    kind = name(layer.type)
    table = {
        "RELU": lambda: torch.relu(x), "SIGMOID": lambda: torch.sigmoid(x), "TANH": lambda: torch.tanh(x),
        "LEAKY_RELU": lambda: torch.where(x >= 0, x, a * x), "ELU": lambda: torch.where(x >= 0, x, a * torch.expm1(x)),
        "SELU": lambda: b * torch.where(x >= 0, x, a * torch.expm1(x)), "SOFTSIGN": lambda: x / (1 + x.abs()),
        "SOFTPLUS": lambda: a * torch.log1p(torch.exp(b * x)), "CLIP": lambda: x.clamp(a, b),
        "HARD_SIGMOID": lambda: (a * x + b).clamp(0, 1), "SCALED_TANH": lambda: a * torch.tanh(b * x),
        "THRESHOLDED_RELU": lambda: torch.where(x > a, x, torch.zeros_like(x)),
        "GELU_ERF": lambda: torch.nn.functional.gelu(x), "GELU_TANH": lambda: torch.nn.functional.gelu(x, approximate="tanh"),
    }
    if kind not in table:
        raise unknown(layer, "activation", kind)
    return [table[kind]()]


@evaluates("SHUFFLE", "IShuffleLayer")
def shuffle(layer: Any, args: Values, raw: dict[str, np.ndarray]) -> list[torch.Tensor]:
    """First transpose, then reshape (0 copies the dim where `zero_is_placeholder`, -1 is inferred),
    then second transpose."""
    x = args[0]
    assert x is not None
    x = x.permute(dims(layer.first_transpose)[:x.dim()])
    shape = _given(args, 1)
    target = [int(d) for d in shape.tolist()] if shape is not None else (
        None if layer.reshape_dims is None else dims(layer.reshape_dims))
    if target is not None:
        if layer.zero_is_placeholder:
            target = [x.shape[i] if d == 0 else d for i, d in enumerate(target)]
        x = x.reshape(target)
    return [x.permute(dims(layer.second_transpose)[:x.dim()])]


@evaluates("SLICE", "ISliceLayer")
def slice_(layer: Any, args: Values, raw: dict[str, np.ndarray]) -> list[torch.Tensor]:
    """Element i of an axis reads start + i * stride, sampled outside the input as the mode says."""
    x = args[0]
    assert x is not None
    def part(k: int, attribute: str) -> list[int]:
        given = _given(args, k)
        return [int(v) for v in given.tolist()] if given is not None else dims(getattr(layer, attribute))
    start, size, stride = part(1, "start"), part(2, "shape"), part(3, "stride")
    axes = _given(args, 5)
    rank = x.dim()
    if axes is not None:
        named = [int(a) % rank for a in axes.tolist()]
        full = ([0] * rank, list(x.shape), [1] * rank)
        for (i, a) in enumerate(named):
            full[0][a], full[1][a], full[2][a] = start[i], size[i], stride[i]
        start, size, stride = full
    mode = name(layer.mode)
    if mode not in ("STRICT_BOUNDS", "DEFAULT", "WRAP", "CLAMP", "FILL", "REFLECT"):
        raise unknown(layer, "mode", mode)
    fill = _given(args, 4)
    inside = torch.ones((), dtype=torch.bool)
    out = x
    for axis in range(rank):
        n = x.shape[axis]
        index = start[axis] + torch.arange(size[axis]) * stride[axis]
        if mode == "WRAP":
            index = index % n
        elif mode == "CLAMP":
            index = index.clamp(0, n - 1)
        elif mode == "REFLECT":
            period = max(2 * n - 2, 1)
            index = index % period
            index = torch.where(index < n, index, period - index)
        elif mode == "FILL":
            ok = (index >= 0) & (index < n)
            inside = inside & ok.reshape([-1 if a == axis else 1 for a in range(rank)])
            index = index.clamp(0, max(n - 1, 0))
        elif bool(((index < 0) | (index >= n)).any()):
            raise ReferenceError(f"SLICE layer '{layer.name}' reads outside its input (axis {axis}: {index.tolist()} "
                                 f"of {n}) in STRICT_BOUNDS mode")
        out = out.index_select(axis, index) if n else out.new_zeros([*out.shape[:axis], len(index), *out.shape[axis + 1:]])
    if mode == "FILL":
        value = fill.reshape(()) if fill is not None else torch.zeros((), dtype=out.dtype)
        out = torch.where(inside, out, value.to(out.dtype))
    return [out]


@evaluates("CONCATENATION", "IConcatenationLayer")
def concatenation(layer: Any, args: Values, raw: dict[str, np.ndarray]) -> list[torch.Tensor]:
    return [torch.cat([x for x in args if x is not None], dim=int(layer.axis))]


def _checked(layer: Any, index: torch.Tensor, n: int) -> torch.Tensor:
    if index.numel() and bool(((index < 0) | (index >= n)).any()):
        raise ReferenceError(f"{name(layer.type)} layer '{layer.name}' indexes outside 0..{n - 1} ({index.min()}..{index.max()}); "
                             "TensorRT reads undefined values there")
    return index.to(torch.int64)


@evaluates("GATHER", "IGatherLayer")
def gather(layer: Any, args: Values, raw: dict[str, np.ndarray]) -> list[torch.Tensor]:
    data, index = args[0], args[1]
    assert data is not None and index is not None
    mode, axis, batch = name(layer.mode), int(layer.axis), int(layer.num_elementwise_dims)
    if mode == "ELEMENT":
        return [torch.gather(data, axis, _checked(layer, index, data.shape[axis]))]
    if mode == "DEFAULT" and batch == 0:
        index = _checked(layer, index, data.shape[axis])
        picked = data.index_select(axis, index.reshape(-1))
        return [picked.reshape([*data.shape[:axis], *index.shape, *data.shape[axis + 1:]])]
    if mode == "ND":
        depth = index.shape[-1]
        rows = []
        for b in range(data.shape[0] if batch else 1):
            d, i = (data[b], index[b]) if batch else (data, index)
            cols = [_checked(layer, i[..., k], d.shape[k]) for k in range(depth)]
            rows.append(d[tuple(cols)])
        return [torch.stack(rows) if batch else rows[0]]
    raise unknown(layer, "mode and elementwise dims", (mode, batch))


@evaluates("SCATTER", "IScatterLayer")
def scatter(layer: Any, args: Values, raw: dict[str, np.ndarray]) -> list[torch.Tensor]:
    data, index, updates = args[0], args[1], args[2]
    assert data is not None and index is not None and updates is not None
    mode = name(layer.mode)
    if mode == "ELEMENT":
        axis = int(layer.axis)
        return [data.clone().scatter_(axis, _checked(layer, index, data.shape[axis]), updates.to(data.dtype))]
    if mode == "ND":
        out = data.clone()
        cols = tuple(_checked(layer, index[..., k], data.shape[k]) for k in range(index.shape[-1]))
        out[cols] = updates.to(data.dtype)
        return [out]
    raise unknown(layer, "mode", mode)


@evaluates("SELECT", "ISelectLayer")
def select(layer: Any, args: Values, raw: dict[str, np.ndarray]) -> list[torch.Tensor]:
    cond, a, b = args[0], args[1], args[2]
    assert cond is not None and a is not None and b is not None
    return [torch.where(cond.bool(), a, b.to(a.dtype))]


@evaluates("SHAPE", "IShapeLayer")
def shape(layer: Any, args: Values, raw: dict[str, np.ndarray]) -> list[torch.Tensor]:
    return [torch.tensor(list(args[0].shape), dtype=torch.int64)]  # type: ignore[union-attr]


@evaluates("FILL", "IFillLayer")
def fill(layer: Any, args: Values, raw: dict[str, np.ndarray]) -> list[torch.Tensor]:
    """LINSPACE: element (i0, i1, ...) is alpha + sum_k beta[k] * i_k."""
    op = name(layer.operation)
    if op != "LINSPACE":
        raise unknown(layer, "operation", op)  # random fills have no reference value
    given = _given(args, 0)
    size = [int(d) for d in given.tolist()] if given is not None else dims(layer.shape)
    alpha = _given(args, 1)
    beta = _given(args, 2)
    start = wide(alpha).reshape(()) if alpha is not None else torch.tensor(float(layer.alpha))
    deltas = wide(beta).reshape(-1) if beta is not None else torch.tensor([float(layer.beta)] * len(size))
    out = start.expand(size).clone()
    for k, n in enumerate(size):
        out = out + deltas[k] * torch.arange(n).reshape([-1 if a == k else 1 for a in range(len(size))])
    return [out]


_REDUCE: dict[str, Callable[..., torch.Tensor]] = {"SUM": torch.sum, "PROD": torch.prod, "MAX": torch.amax, "MIN": torch.amin, "AVG": torch.mean}


@evaluates("REDUCE", "IReduceLayer")
def reduce(layer: Any, args: Values, raw: dict[str, np.ndarray]) -> list[torch.Tensor]:
    x, op = wide(args[0]), name(layer.op)  # type: ignore[arg-type]
    axes = axes_of(int(layer.axes), x.dim())
    if op not in _REDUCE:
        raise unknown(layer, "operation", op)
    if op == "PROD":
        out = x
        for a in sorted(axes, reverse=True):
            out = out.prod(a, keepdim=bool(layer.keep_dims))
        return [out]
    if op == "AVG" and not x.is_floating_point():
        x = x.to(torch.float64)
    return [_REDUCE[op](x, dim=axes, keepdim=bool(layer.keep_dims))]


@evaluates("SOFTMAX", "ISoftMaxLayer")
def softmax(layer: Any, args: Values, raw: dict[str, np.ndarray]) -> list[torch.Tensor]:
    x = wide(args[0])  # type: ignore[arg-type]
    (axis,) = axes_of(int(layer.axes), x.dim())
    return [torch.softmax(x, dim=axis)]


@evaluates("TOPK", "ITopKLayer")
def topk(layer: Any, args: Values, raw: dict[str, np.ndarray]) -> list[torch.Tensor]:
    x = wide(args[0])  # type: ignore[arg-type]
    k_given = _given(args, 1)
    k = int(k_given.reshape(())) if k_given is not None else int(layer.k)
    (axis,) = axes_of(int(layer.axes), x.dim())
    values, indices = torch.topk(x, k, dim=axis, largest=name(layer.op) == "MAX", sorted=True)
    return [values, indices]


@evaluates("CUMULATIVE", "ICumulativeLayer")
def cumulative(layer: Any, args: Values, raw: dict[str, np.ndarray]) -> list[torch.Tensor]:
    x, axis_value = wide(args[0]), args[1]  # type: ignore[arg-type]
    assert axis_value is not None
    axis = int(axis_value.reshape(())) % x.dim()
    op = name(layer.op)
    if op not in ("SUM", "PROD"):
        raise unknown(layer, "operation", op)
    if layer.reverse:
        x = x.flip(axis)
    out = x.cumsum(axis) if op == "SUM" else x.cumprod(axis)
    if layer.exclusive:
        first = torch.zeros_like(out.narrow(axis, 0, 1)) if op == "SUM" else torch.ones_like(out.narrow(axis, 0, 1))
        out = torch.cat([first, out.narrow(axis, 0, out.shape[axis] - 1)], dim=axis)
    return [out.flip(axis) if layer.reverse else out]


@evaluates("MATRIX_MULTIPLY", "IMatrixMultiplyLayer")
def matrix_multiply(layer: Any, args: Values, raw: dict[str, np.ndarray]) -> list[torch.Tensor]:
    a, b = wide(args[0]), wide(args[1])  # type: ignore[arg-type]
    op0, op1 = name(layer.op0), name(layer.op1)
    if op0 == "TRANSPOSE":
        a = a.transpose(-1, -2)
    if op1 == "TRANSPOSE":
        b = b.transpose(-1, -2)
    if op0 == "VECTOR":
        a = a.unsqueeze(-2)
    if op1 == "VECTOR":
        b = b.unsqueeze(-1)
    out = torch.matmul(a, b)
    if op1 == "VECTOR":
        out = out.squeeze(-1)
    if op0 == "VECTOR":
        out = out.squeeze(-2 if op1 != "VECTOR" else -1)
    return [out]


@evaluates("KV_CACHE_UPDATE", "IKVCacheUpdateLayer")
def kv_cache_update(layer: Any, args: Values, raw: dict[str, np.ndarray]) -> list[torch.Tensor]:
    """LINEAR: cache[b, :, i_b : i_b + T] = update[b], with i_b the write index of batch b."""
    cache, update, where = args[0], args[1], args[2]
    assert cache is not None and update is not None and where is not None
    if name(layer.cache_mode) != "LINEAR":
        raise unknown(layer, "cache mode", name(layer.cache_mode))
    out, steps = cache.clone(), update.shape[2]
    for b, first in enumerate(where.reshape(-1).tolist()):
        if not 0 <= first <= cache.shape[2] - steps:
            raise ReferenceError(f"KV_CACHE_UPDATE layer '{layer.name}' writes positions {first}..{first + steps - 1} of "
                                 f"a cache of {cache.shape[2]}")
        out[b, :, first:first + steps] = update[b].to(out.dtype)
    return [out]
