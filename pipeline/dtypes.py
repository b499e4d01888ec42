"""The one dtype table: each dtype's name (torch's, without "torch."), its torch dtype, its
ExecuTorch `ScalarType` number and name, and whether TensorRT takes it (its `DataType` of the same
name). Engine bindings, program records, configs, converters and the runtime all name dtypes through
it, and `compile.precision` names a float dtype of it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class DType:
    name: str
    torch: torch.dtype
    scalar_type: int  # ExecuTorch ScalarType number
    scalar_name: str  # ExecuTorch ScalarType name
    engine: bool  # TensorRT has it (`tensorrt.DataType.<name>`): engines take and compute it


_ROWS = (
    DType("uint8", torch.uint8, 0, "BYTE", True),
    DType("int8", torch.int8, 1, "CHAR", True),
    DType("int16", torch.int16, 2, "SHORT", False),
    DType("int32", torch.int32, 3, "INT", True),
    DType("int64", torch.int64, 4, "LONG", True),
    DType("float16", torch.float16, 5, "HALF", True),
    DType("float32", torch.float32, 6, "FLOAT", True),
    DType("float64", torch.float64, 7, "DOUBLE", False),
    DType("bool", torch.bool, 11, "BOOL", True),
    DType("bfloat16", torch.bfloat16, 15, "BFLOAT16", True),
)
BY_NAME = {row.name: row for row in _ROWS}
ENGINE_DTYPES = frozenset(row.torch for row in _ROWS if row.engine)
FLOAT_DTYPES = frozenset(d for d in ENGINE_DTYPES if d.is_floating_point)  # those an engine computes in
# compile.precision -> the dtype an engine computes floats in
PRECISIONS = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
_BY_TORCH = {row.torch: row for row in _ROWS}
_BY_SCALAR_TYPE = {row.scalar_type: row for row in _ROWS}


def by_name(name: str) -> DType | None:
    return BY_NAME.get(name)


def name_of(dtype: torch.dtype) -> str:
    """The table's name of a torch dtype (torch's own name for dtypes outside the table)."""
    row = _BY_TORCH.get(dtype)
    return row.name if row is not None else str(dtype).removeprefix("torch.")


def of_scalar_type(scalar_type: Any) -> DType | None:
    """The row of an ExecuTorch ScalarType (enum or number); None when the table has none."""
    return _BY_SCALAR_TYPE.get(int(getattr(scalar_type, "value", scalar_type)))


def engine_type(dtype: torch.dtype, trt: Any) -> Any:
    """TensorRT's `DataType` (from the module `trt`) of a torch dtype.

    Raises:
        TypeError: TensorRT has no such type.
    """
    row = _BY_TORCH.get(dtype)
    if row is None or not row.engine:
        raise TypeError(f"dtype {dtype} has no TensorRT equivalent; supported: {sorted(name_of(d) for d in ENGINE_DTYPES)}")
    return getattr(trt, row.name)
