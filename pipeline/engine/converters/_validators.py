"""Small factories of capability predicates shared by converters. Each returns a validator
`(node, spec) -> reason | None`; validators never mutate the node."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch

from pipeline.dtypes import FLOAT_DTYPES
from pipeline.engine.converters.registry import Validator

INDEX_DTYPES = frozenset({torch.int32, torch.int64})
NUMERIC_DTYPES = FLOAT_DTYPES | INDEX_DTYPES


def _val(x: Any) -> Any:
    return x.meta.get("val") if isinstance(x, torch.fx.Node) else None


def arg(node: torch.fx.Node, index: int, name: str, default: Any = None) -> Any:
    """A node argument by position or keyword."""
    if len(node.args) > index:
        return node.args[index]
    return node.kwargs.get(name, default)


def tensor_dtypes(allowed: Iterable[torch.dtype], what: str = "input") -> Validator:
    """Every tensor input must have one of `allowed` dtypes."""
    allowed = frozenset(allowed)

    def check(node: torch.fx.Node, spec: Any) -> str | None:
        for a in node.all_input_nodes:
            val = _val(a)
            if isinstance(val, torch.Tensor) and val.dtype not in allowed:
                names = sorted(str(d).removeprefix("torch.") for d in allowed)
                return f"{what} dtype {str(val.dtype).removeprefix('torch.')} not in {names}"
        return None

    return check


def rank_between(lo: int, hi: int, index: int = 0) -> Validator:
    """The tensor at argument `index` must have rank in [lo, hi]."""

    def check(node: torch.fx.Node, spec: Any) -> str | None:
        val = _val(node.args[index]) if len(node.args) > index else None
        if isinstance(val, torch.Tensor) and not lo <= val.dim() <= hi:
            return f"input rank {val.dim()} outside [{lo}, {hi}]"
        return None

    return check


def arg_in(index: int, name: str, allowed: Iterable[Any], default: Any = None) -> Validator:
    """Argument `name` must take one of `allowed` values."""
    allowed = tuple(allowed)

    def check(node: torch.fx.Node, spec: Any) -> str | None:
        value = arg(node, index, name, default)
        if value not in allowed:
            return f"{name}={value!r} not supported (supported: {list(allowed)})"
        return None

    return check


def static_arg(index: int, name: str) -> Validator:
    """Argument `name` must be a compile-time constant, not a graph value."""

    def check(node: torch.fx.Node, spec: Any) -> str | None:
        value = arg(node, index, name)
        values = value if isinstance(value, (list, tuple)) else [value]
        if any(isinstance(v, torch.fx.Node) for v in values):
            return f"{name} must be a constant, got a graph value"
        return None

    return check


def all_of(*checks: Validator) -> Validator:
    """The first refusal of several validators."""

    def check(node: torch.fx.Node, spec: Any) -> str | None:
        for c in checks:
            reason = c(node, spec)
            if reason:
                return reason
        return None

    return check


def predicate(test: Callable[[torch.fx.Node], bool], reason: str) -> Validator:
    """A validator from a boolean test and the refusal reason when it is False."""

    def check(node: torch.fx.Node, spec: Any) -> str | None:
        return None if test(node) else reason

    return check


FLOAT_ONLY = tensor_dtypes(FLOAT_DTYPES)
NUMERIC = tensor_dtypes(NUMERIC_DTYPES | {torch.bool})
