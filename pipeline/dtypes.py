"""The one dtype table: each dtype's name (torch's, without "torch."), its torch dtype, and its
ExecuTorch `ScalarType` number and name. Engine bindings, program records, configs and the runtime
all name dtypes through it."""

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


_ROWS = (
    DType("uint8", torch.uint8, 0, "BYTE"),
    DType("int8", torch.int8, 1, "CHAR"),
    DType("int16", torch.int16, 2, "SHORT"),
    DType("int32", torch.int32, 3, "INT"),
    DType("int64", torch.int64, 4, "LONG"),
    DType("float16", torch.float16, 5, "HALF"),
    DType("float32", torch.float32, 6, "FLOAT"),
    DType("float64", torch.float64, 7, "DOUBLE"),
    DType("bool", torch.bool, 11, "BOOL"),
    DType("bfloat16", torch.bfloat16, 15, "BFLOAT16"),
)
BY_NAME = {row.name: row for row in _ROWS}
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
