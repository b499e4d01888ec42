"""What one program or engine input may be: its dtype, each dim's [min, max] and, for an integer
input that indexes (token ids, positions), the values it may hold. Programs carry one per method
input (in their record), engine blobs one per engine input; the runtime checks every input against
it here, and nowhere else (`check` for one input, `check_inputs` for a call's inputs together)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from pipeline import dtypes
from pipeline.errors import InputError


@dataclass(frozen=True)
class TensorSpec:
    """A tensor input: dtype (a `pipeline.dtypes` name, e.g. "float32") and per-dim inclusive bounds;
    for integer inputs that index, `values`: inclusive bounds of every element, and `end`: (input,
    dim, limit), every element plus the size of that dim of that input of the call at most `limit`
    (the first of as many positions as that dim has: a decoder's start position and its tokens)."""

    dtype: str
    min: tuple[int, ...]
    max: tuple[int, ...]
    values: tuple[int, int] | None = None
    end: tuple[int, int, int] | None = None

    @property
    def torch_dtype(self) -> torch.dtype:
        row = dtypes.by_name(self.dtype)
        assert row is not None, self.dtype  # from_json and `of` only make specs of table dtypes
        return row.torch

    def describe(self) -> str:
        dims = ", ".join(str(lo) if lo == hi else f"{lo}..{hi}" for lo, hi in zip(self.min, self.max))
        return f"{self.dtype}[{dims}]"

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"dtype": self.dtype, "min": list(self.min), "max": list(self.max)}
        if self.values is not None:
            doc["values"] = list(self.values)
        if self.end is not None:
            doc["end"] = list(self.end)
        return doc

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> TensorSpec:
        """Inverse of `to_json`; raises ValueError/KeyError/TypeError on a malformed entry."""
        values = doc.get("values")
        end = doc.get("end")
        spec = cls(str(doc["dtype"]), tuple(int(d) for d in doc["min"]), tuple(int(d) for d in doc["max"]),
                   None if values is None else (int(values[0]), int(values[1])),
                   None if end is None else (int(end[0]), int(end[1]), int(end[2])))
        if dtypes.by_name(spec.dtype) is None or len(spec.min) != len(spec.max) or any(
                lo < 0 or lo > hi for lo, hi in zip(spec.min, spec.max)) or (values is not None and len(values) != 2) or (
                end is not None and len(end) != 3) or (spec.values is not None and spec.values[0] > spec.values[1]):
            raise ValueError(f"malformed tensor spec {dict(doc)}")
        return spec

    def with_values(self, values: tuple[int, int] | None, end: tuple[int, int, int] | None = None) -> TensorSpec:
        return TensorSpec(self.dtype, self.min, self.max, values, end)

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


def check_call(where: str, specs: Sequence[TensorSpec | None], inputs: Sequence[Any], seen: list[Any] | None = None) -> None:
    """Raise `InputError` unless a call's inputs are what the program was built for: their count, each
    one's dtype and dims (`TensorSpec.check`; skipped for an input whose dtype and shape are those
    `seen` holds for it from a call that passed, and recorded there), then their values (`check_inputs`)."""
    if len(inputs) != len(specs):
        raise InputError(f"{where} takes {len(specs)} inputs, got {len(inputs)}")
    for i, (spec, value) in enumerate(zip(specs, inputs)):
        if spec is None:
            continue
        shape = (value.dtype, value.shape) if isinstance(value, torch.Tensor) else None
        if seen is None or shape is None or seen[i] != shape:
            spec.check(f"{where} input {i}", value)
            if seen is not None:
                seen[i] = shape
    check_inputs(where, specs, inputs)


def check_inputs(where: str, specs: Sequence[TensorSpec | None], inputs: Sequence[Any]) -> None:
    """Raise `InputError` unless every value of every integer input with `values` or `end` lies in its
    bounds (shapes were checked with `TensorSpec.check`). Nothing runs before it, so a refused call
    changes nothing (a KV cache included); on a GPU it costs one read back of the bounded inputs."""
    bounded = [(i, spec) for i, spec in enumerate(specs)
               if spec is not None and (spec.values is not None or spec.end is not None) and inputs[i].numel()]
    if not bounded:
        return
    for (i, spec), (low, high) in zip(bounded, _lows_and_highs([inputs[i] for i, _ in bounded])):
        lo, hi = spec.values if spec.values is not None else (low, high)
        span_text = ""
        if spec.end is not None:
            other, dim, limit = spec.end
            span = int(inputs[other].shape[dim]) if other < len(inputs) and dim < inputs[other].dim() else 1
            hi = min(hi, limit - span)
            span_text = f" with {span} positions from it (input {other} dim {dim})"
        if not lo <= low <= high <= hi:
            bad = low if low < lo else high
            raise InputError(f"{where} input {i} holds {bad}, but the program takes values {lo}..{hi}{span_text} "
                             f"({spec.describe()}); an index outside them would read or write past its table")


_SMALL = 4096  # elements read to the host whole (ids, positions); larger inputs are reduced where they are


def _lows_and_highs(values: list[torch.Tensor]) -> list[tuple[int, int]]:
    """Each tensor's smallest and largest element, in one read from the device where they share one."""
    if any(v.numel() > _SMALL for v in values) or len({v.device for v in values}) > 1:
        pairs = [torch.stack(torch.aminmax(v.reshape(-1))).to(torch.int64) for v in values]
        return [(int(lo), int(hi)) for lo, hi in (p.tolist() for p in pairs)]
    if len(values) == 1 or values[0].device.type == "cpu":
        lists = [v.reshape(-1).tolist() for v in values]
    else:
        host = torch.cat([v.reshape(-1).to(torch.int64) for v in values]).tolist()
        cuts = [0]
        for v in values:
            cuts.append(cuts[-1] + v.numel())
        lists = [host[a:b] for a, b in zip(cuts, cuts[1:])]
    return [(min(items), max(items)) for items in lists]
