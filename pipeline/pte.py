"""Read `.pte` files: the program's methods, and every TensorRT delegate with its blob metadata
checked against the tensors the program passes to it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from executorch.exir._serialize._program import deserialize_pte_binary

from pipeline.errors import BlobFormatError
from pipeline.tensorrt import blob

# ExecuTorch ScalarType names by torch dtype name (the names blob bindings use).
SCALAR_TYPES = {
    "float32": "FLOAT", "float16": "HALF", "bfloat16": "BFLOAT16", "int32": "INT", "int64": "LONG",
    "bool": "BOOL", "int8": "CHAR", "uint8": "BYTE", "float64": "DOUBLE", "int16": "SHORT",
}


@dataclass(frozen=True)
class DelegateInfo:
    """One delegate call in a method: its backend, blob, and the program values it reads and writes."""

    method: str
    backend: str
    payload: bytes
    args: tuple[int, ...]


def load_program(source: str | Path | bytes) -> Any:
    """Parse a `.pte` (path or bytes) into ExecuTorch's Python dataclasses (the `program` part)."""
    data = source if isinstance(source, bytes) else Path(source).read_bytes()
    return deserialize_pte_binary(data).program


def delegate_calls(program: Any) -> list[DelegateInfo]:
    """Every delegate call of every method, in instruction order."""
    out = []
    for plan in program.execution_plan:
        for chain in plan.chains:
            for instr in chain.instructions:
                call = instr.instr_args
                if type(call).__name__ != "DelegateCall":
                    continue
                delegate = plan.delegates[call.delegate_index]
                payload = bytes(program.backend_delegate_data[delegate.processed.index].data)
                out.append(DelegateInfo(plan.name, delegate.id, payload, tuple(call.args)))
    return out


def check_tensorrt_io(program: Any) -> int:
    """Check every TensorRT delegate's bindings against the program's tensors; return how many.

    Raises:
        BlobFormatError: a binding's count, dtype or shape disagrees with the program.
    """
    plans = {p.name: p for p in program.execution_plan}
    checked = 0
    for call in delegate_calls(program):
        if call.backend != blob.BACKEND_ID:
            continue
        meta, _ = blob.decode(call.payload)
        if len(meta.io_bindings) != len(call.args):
            raise BlobFormatError(
                f"{call.method}: delegate takes {len(call.args)} values but its blob binds {len(meta.io_bindings)}"
            )
        for binding, index in zip(meta.io_bindings, call.args):
            _check_binding(call.method, binding, plans[call.method].values[index].val)
        checked += 1
    return checked


def _check_binding(method: str, binding: blob.IOBinding, tensor: Any) -> None:
    where = f"{method}: binding {binding.name!r}"
    if type(tensor).__name__ != "Tensor":
        raise BlobFormatError(f"{where} is bound to a {type(tensor).__name__}, not a tensor")
    expected = SCALAR_TYPES.get(binding.dtype)
    if tensor.scalar_type.name != expected:
        raise BlobFormatError(f"{where} has dtype {binding.dtype} but the program's tensor is {tensor.scalar_type.name}")
    sizes = list(tensor.sizes)
    if len(sizes) != len(binding.shape) or any(b not in (-1, s) for b, s in zip(binding.shape, sizes)):
        raise BlobFormatError(f"{where} has shape {list(binding.shape)} but the program's tensor is {sizes}")
