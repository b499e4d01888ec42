"""What one program or engine input may be: its dtype and each dim's [min, max]. Programs carry one
per method input (in their record), engine blobs one per engine input; the runtime checks every
input against it here, and nowhere else."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from pipeline import dtypes
from pipeline.errors import InputError


@dataclass(frozen=True)
class TensorSpec:
    """A tensor input: dtype (a `pipeline.dtypes` name, e.g. "float32") and per-dim inclusive bounds."""

    dtype: str
    min: tuple[int, ...]
    max: tuple[int, ...]

    @property
    def torch_dtype(self) -> torch.dtype:
        row = dtypes.by_name(self.dtype)
        assert row is not None, self.dtype  # from_json and `of` only make specs of table dtypes
        return row.torch

    def describe(self) -> str:
        dims = ", ".join(str(lo) if lo == hi else f"{lo}..{hi}" for lo, hi in zip(self.min, self.max))
        return f"{self.dtype}[{dims}]"

    def to_json(self) -> dict[str, Any]:
        return {"dtype": self.dtype, "min": list(self.min), "max": list(self.max)}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> TensorSpec:
        """Inverse of `to_json`; raises ValueError/KeyError/TypeError on a malformed entry."""
        spec = cls(str(doc["dtype"]), tuple(int(d) for d in doc["min"]), tuple(int(d) for d in doc["max"]))
        if dtypes.by_name(spec.dtype) is None or len(spec.min) != len(spec.max) or any(
                lo < 0 or lo > hi for lo, hi in zip(spec.min, spec.max)):
            raise ValueError(f"malformed tensor spec {dict(doc)}")
        return spec

    @classmethod
    def of(cls, value: Any, ranges: Mapping[Any, Any]) -> TensorSpec:
        """The spec of an exported program's (fake) tensor, dynamic dims bounded by `ranges`
        (the program's `range_constraints`)."""
        lows, highs = [], []
        for size in value.shape:
            if isinstance(size, int):
                lows.append(size)
                highs.append(size)
                continue
            bound = ranges[size.node.expr]
            lows.append(int(bound.lower))
            highs.append(int(bound.upper))
        return cls(dtypes.name_of(value.dtype), tuple(lows), tuple(highs))

    def check(self, where: str, value: Any) -> None:
        """Raise `InputError` unless `value` is a tensor of this dtype with every dim in bounds."""
        if not isinstance(value, torch.Tensor):
            raise InputError(f"{where} must be a tensor {self.describe()}, got a {type(value).__name__}")
        if value.dtype != self.torch_dtype:
            raise InputError(f"{where} has dtype {dtypes.name_of(value.dtype)}, but the program takes "
                             f"{self.describe()}; convert it first (x.to(torch.{self.dtype}))")
        if value.dim() != len(self.min):
            raise InputError(f"{where} has {value.dim()} dims {list(value.shape)}, but the program takes {self.describe()}")
        for dim, (size, lo, hi) in enumerate(zip(value.shape, self.min, self.max)):
            if not lo <= size <= hi:
                allowed = f"exactly {lo}" if lo == hi else f"{lo}..{hi}"
                raise InputError(f"{where} dim {dim} is {size}, but the program was built for {allowed} "
                                 f"({self.describe()}); rebuild with a wider range to take it")
