"""Materialise a `.pte` execution plan's values (EValues) as Python objects: tensors with their
constant data (inline, or by name from a `.ptd`), ints, lists, strings."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from pipeline import dtypes
from pipeline.errors import RuntimeUnavailableError


def dtype_of(scalar_type: Any) -> torch.dtype:
    """The torch dtype of an ExecuTorch ScalarType (enum or number)."""
    row = dtypes.of_scalar_type(scalar_type)
    if row is None:
        raise RuntimeUnavailableError(f"ExecuTorch scalar type {scalar_type} has no PyTorch equivalent here")
    return row.torch


def materialise(plan: Any, program: Any, named: Mapping[str, Any], device: torch.device,
                state: Mapping[int, torch.Tensor] | None = None) -> list[Any]:
    """One Python object per value of `plan`; list values stay as index lists (resolved per call).

    Planned tensors are views into one arena per memory id at their planned offsets, exactly as
    ExecuTorch lays them out: memory-planned views (no instruction writes them) alias their source.
    `state` holds the program's own arenas (memory id -> bytes), shared by all its methods.
    """
    state = state or {}
    arenas = [state[i] if i in state else torch.zeros(int(size), dtype=torch.uint8, device=device)
              for i, size in enumerate(plan.non_const_buffer_sizes)]
    out: list[Any] = []
    for value in plan.values:
        val = value.val
        kind = type(val).__name__
        if kind == "Tensor":
            out.append(_tensor(val, program, named, device, arenas))
        elif kind == "Double":
            out.append(float(val.double_val))  # non-finite doubles come back as strings ("-inf")
        elif kind in ("Int", "Bool"):
            out.append(val.int_val if kind == "Int" else val.bool_val)
        elif kind == "String":
            out.append(val.string_val)
        elif kind in ("IntList", "TensorList", "OptionalTensorList"):
            out.append(_IndexList(kind, list(val.items)))
        elif kind == "DoubleList":
            out.append([float(x) for x in val.items])
        elif kind == "BoolList":
            out.append(list(val.items))
        elif kind == "Null":
            out.append(None)
        else:
            raise RuntimeUnavailableError(f"value kind {kind} is not supported by pipeline.runtime")
    return out


class _IndexList:
    """A list value whose items are other values (resolved when an instruction reads it)."""

    def __init__(self, kind: str, items: list[int]) -> None:
        self.kind = kind
        self.items = items

    def resolve(self, values: list[Any]) -> list[Any]:
        return [None if i < 0 else values[i] for i in self.items]


def _tensor(t: Any, program: Any, named: Mapping[str, Any], device: torch.device,
            arenas: list[torch.Tensor]) -> torch.Tensor:
    dtype = dtype_of(t.scalar_type)
    sizes = [int(s) for s in t.sizes]
    if list(t.dim_order) != sorted(t.dim_order):
        raise RuntimeUnavailableError(f"tensor with dim order {list(t.dim_order)} is not supported (contiguous only)")
    info = t.extra_tensor_info
    if info is not None and getattr(info, "fully_qualified_name", None) and int(getattr(info.location, "value", 0)) == 1:
        name = info.fully_qualified_name
        if name not in named:
            raise RuntimeUnavailableError(f"tensor {name!r} lives in a .ptd file; pass its path to pipeline.runtime.load")
        return _from_bytes(named[name], dtype, sizes, device)
    if t.data_buffer_idx > 0:
        return _from_bytes(program.constant_buffer[t.data_buffer_idx].storage, dtype, sizes, device)
    if t.allocation_info is not None:
        info = t.allocation_info
        offset = _offset(info)
        count = 1
        for s in sizes:
            count *= s
        nbytes = count * torch.empty((), dtype=dtype).element_size()
        return arenas[info.memory_id][offset : offset + nbytes].view(dtype).view(sizes)
    return torch.zeros(sizes, dtype=dtype, device=device)


def _offset(info: Any) -> int:
    """A planned tensor's byte offset in its arena (stored as two 32-bit halves)."""
    return int(info.memory_offset_low) + (int(info.memory_offset_high) << 32)


def _from_bytes(data: bytes, dtype: torch.dtype, sizes: list[int], device: torch.device) -> torch.Tensor:
    count = 1
    for s in sizes:
        count *= s
    flat = torch.frombuffer(bytearray(data), dtype=dtype, count=count) if count else torch.empty(0, dtype=dtype)
    return flat.reshape(sizes).to(device)


def state_values(plan: Any) -> dict[int, str]:
    """The values of `plan` that are program state (named mutable buffers in planned memory): index -> name."""
    out = {}
    for index, value in enumerate(plan.values):
        t = value.val
        info: Any = getattr(t, "extra_tensor_info", None)
        name = getattr(info, "fully_qualified_name", None)
        if name and int(getattr(info.location, "value", 0)) == 0 and t.allocation_info is not None:
            out[index] = str(name)
    return out


def state_arenas(plans: list[Any], device: torch.device) -> dict[int, torch.Tensor]:
    """The program's state: the memory ids that hold its named mutable buffers (a KV cache, which
    ExecuTorch plans at the same place in every method when it shares them), one zeroed arena each,
    for every method to use, so that what one method writes the next reads.

    Raises:
        RuntimeUnavailableError: a buffer is planned at different places in different methods
            (then the methods could not share it).
    """
    where: dict[str, tuple[int, int]] = {}
    sizes: dict[int, int] = {}
    for plan in plans:
        for index, name in state_values(plan).items():
            t = plan.values[index].val
            place = (int(t.allocation_info.memory_id), _offset(t.allocation_info))
            if where.setdefault(name, place) != place:
                raise RuntimeUnavailableError(
                    f"buffer {name!r} is planned at {where[name]} in one method and {place} in another; "
                    "serialize with shared mutable buffers so the methods share it")
            sizes[place[0]] = max(sizes.get(place[0], 0), int(plan.non_const_buffer_sizes[place[0]]))
    return {i: torch.zeros(size, dtype=torch.uint8, device=device) for i, size in sizes.items()}


def reads(call: Any, values: list[Any]) -> set[int]:
    """The value indices an instruction may read (list values: their items too)."""
    kind = type(call).__name__
    if kind == "MoveCall":
        return {call.move_from}
    if kind not in ("KernelCall", "DelegateCall"):
        return set()
    out = set(call.args)
    for i in call.args:
        out.update(getattr(values[i], "items", ()))
    return out
