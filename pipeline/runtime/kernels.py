"""Portable operator calls of a `.pte` run as PyTorch kernels: resolve the operator, map the
program's argument list onto its schema, and run ExecuTorch's primitive (symbolic-int) ops."""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable
from typing import Any

import torch

from pipeline.errors import RuntimeUnavailableError
from pipeline.kernels import calls  # noqa: F401  (registers the kernels' ops, pipeline::decode_*, which programs may call)
from pipeline.runtime.values import dtype_of

# executorch_prim ops write their result into their last argument.
_PRIM: dict[str, Callable[..., Any]] = {
    "add.Scalar": operator.add, "sub.Scalar": operator.sub, "mul.Scalar": operator.mul,
    "floordiv.Scalar": operator.floordiv, "truediv.Scalar": operator.truediv, "mod.Scalar": operator.mod,
    "eq.Scalar": operator.eq, "gt.Scalar": operator.gt, "lt.Scalar": operator.lt, "ge.Scalar": operator.ge,
    "le.Scalar": operator.le, "neg.Scalar": operator.neg,
}


def resolve(name: str, overload: str) -> Callable[[list[Any], list[int]], None]:
    """A callable `(values, arg_indices)` that runs one operator of the program."""
    namespace, _, op = name.partition("::")
    if namespace == "executorch_prim":
        return _prim(op, overload)
    if (namespace, op, overload) == ("aten", "sym_size", "int"):
        return _sym_size
    if (namespace, op, overload) == ("aten", "sym_numel", "default"):
        return lambda values, args: values.__setitem__(args[-1], values[args[0]].numel())
    return _aten(namespace, op, overload)


def _prim(op: str, overload: str) -> Callable[[list[Any], list[int]], None]:
    key = f"{op}.{overload}"
    if key == "et_view.default":
        return lambda values, args: values.__setitem__(args[-1], values[args[0]].view(_ints(values, args[1])))
    if key == "et_copy_index.tensor":
        return _copy_index
    if key not in _PRIM:
        raise RuntimeUnavailableError(f"primitive op executorch_prim::{key} is not supported by pipeline.runtime")
    fn = _PRIM[key]
    return lambda values, args: values.__setitem__(args[-1], fn(*[values[i] for i in args[:-1]]))


def _sym_size(values: list[Any], args: list[int]) -> None:
    values[args[-1]] = values[args[0]].shape[values[args[1]]]


def _copy_index(values: list[Any], args: list[int]) -> None:
    values[args[0]][values[args[2]]] = values[args[1]]


def _ints(values: list[Any], index: int) -> list[int]:
    value = values[index]
    return [int(v) for v in (value.resolve(values) if hasattr(value, "resolve") else value)]


@functools.cache
def _schema_op(namespace: str, op: str, overload: str) -> Any:
    try:
        return getattr(getattr(getattr(torch.ops, namespace), op), overload)
    except AttributeError as exc:
        raise RuntimeUnavailableError(
            f"operator {namespace}::{op}.{overload} has no PyTorch kernel here (import its library first)"
        ) from exc


def schema_arguments(name: str, overload: str) -> list[Any]:
    """The schema arguments of operator `name` ("aten::add") overload `overload` ("out")."""
    namespace, _, op = name.partition("::")
    return list(_schema_op(namespace, op, overload)._schema.arguments)


def _aten(namespace: str, op: str, overload: str) -> Callable[[list[Any], list[int]], None]:
    fn = _schema_op(namespace, op, overload)
    arguments = fn._schema.arguments

    def call(values: list[Any], args: list[int]) -> None:
        positional, keywords = [], {}
        for spec, index in zip(arguments, args):
            value = _convert(values[index], values, str(spec.type))
            if spec.kwarg_only:
                keywords[spec.name] = value
            else:
                positional.append(value)
        fn(*positional, **keywords)

    return call


def _convert(value: Any, values: list[Any], type_name: str) -> Any:
    if hasattr(value, "resolve"):
        return value.resolve(values)
    if "ScalarType" in type_name and isinstance(value, int):
        return dtype_of(value)
    if "MemoryFormat" in type_name and isinstance(value, int):
        return torch.contiguous_format if value in (0, 1) else torch.preserve_format
    if "Layout" in type_name and isinstance(value, int):
        return torch.strided
    if "Device" in type_name:
        return None
    return value
