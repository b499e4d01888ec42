"""The converter registry: one frozen record per ATen operator overload (or symbolic-int builtin).

Operator support, the partitioner, the lowering report and `ops_to_not_decompose` all ask this
registry; there is no other list of supported operators.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch._ops import OpOverload

if TYPE_CHECKING:
    from pipeline.engine.compile_spec import TensorRTCompileSpec
    from pipeline.engine.context import ConversionContext

# A converter turns one node into TensorRT tensors: (ctx, node, args, kwargs) -> ITensor | tuple.
ConverterFn = Callable[["ConversionContext", torch.fx.Node, tuple[Any, ...], dict[str, Any]], Any]
# A validator says why a node cannot be converted (a reason string), or None when it can.
Validator = Callable[[torch.fx.Node, "TensorRTCompileSpec"], str | None]

# Python builtins that appear in graphs for symbolic-int arithmetic (dynamic shapes).
SYMINT_BUILTINS = (operator.add, operator.sub, operator.mul, operator.floordiv)
Key = OpOverload | Callable[..., Any]


@dataclass(frozen=True)
class ConverterRecord:
    """What the registry knows about one operator."""

    op: Key
    impl: ConverterFn
    validator: Validator | None
    decomposes: bool  # lowering lets decomposition break the op up (its parts convert too), see `converter`


_REGISTRY: dict[Key, ConverterRecord] = {}


def converter(*ops: Key, validator: Validator | None = None, decomposes: bool = False) -> Callable[[ConverterFn], ConverterFn]:
    """Register the decorated function as the converter of each of `ops`.

    Args:
        ops: ATen `OpOverload`s (not packets, not strings) or symbolic-int builtins.
        validator: capability check run before conversion; returns a refusal reason or None.
        decomposes: whether lowering may let decomposition break the op up rather than keep it whole for
            this converter (data movement, creation, and attention, whose parts the fusion pass finds).
    Raises:
        TypeError: an op is not an `OpOverload` or allowed builtin.
        ValueError: an op already has a converter.
    """

    def register(fn: ConverterFn) -> ConverterFn:
        for op in ops:
            if not isinstance(op, OpOverload) and op not in SYMINT_BUILTINS:
                raise TypeError(f"converter keys must be torch OpOverloads, got {op!r} ({type(op).__name__})")
            if op in _REGISTRY:
                raise ValueError(f"{op} already has a converter: {_REGISTRY[op].impl.__qualname__}")
            _REGISTRY[op] = ConverterRecord(op, fn, validator, decomposes)
        return fn

    return register


def registered(op: Key) -> bool:
    """Whether `op` has a converter yet (families load on first `lookup`; this loads none)."""
    return op in _REGISTRY


def aten_op(target: Any) -> Any:
    """The ATen overload behind a graph target (Edge ops wrap one), or the target itself."""
    if isinstance(target, OpOverload):
        return target
    inner = getattr(target, "_op", None)
    return inner if isinstance(inner, OpOverload) else target


def lookup(target: Any) -> ConverterRecord | None:
    """The record for a node target (ATen or Edge overload), or None."""
    _load_converters()
    try:
        return _REGISTRY.get(aten_op(target))
    except TypeError:  # unhashable target
        return None


def records() -> Iterator[ConverterRecord]:
    """Every registered converter record."""
    _load_converters()
    return iter(list(_REGISTRY.values()))


def supported_ops() -> list[OpOverload]:
    """Every ATen overload with a converter."""
    return [r.op for r in records() if isinstance(r.op, OpOverload)]


_loaded = False


def _load_converters() -> None:
    # Explicit import of every family, once, so registration never depends on import order elsewhere.
    global _loaded
    if _loaded:
        return
    _loaded = True
    from pipeline.engine.converters import (  # noqa: F401
        accumulate,
        activation,
        attention,
        conv,
        creation,
        elementwise,
        embedding,
        indexing,
        linear,
        normalization,
        pooling,
        reduction,
        resize,
        shape,
        tensor_copy,
    )
