"""Read `.pte` files, checking them first: structure, program record (the file's digest and its
`.ptd`'s identity), and every TensorRT delegate with its blob checked against the tensors the
program passes to it."""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from executorch.exir._serialize._program import deserialize_pte_binary

from pipeline import record
from pipeline.errors import ArtifactError, BlobFormatError
from pipeline.record import Record
from pipeline.tensorrt import blob

_HEAD = 8 + 32  # flatbuffer root offset + file identifier, then ExecuTorch's extended header

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


@dataclass(frozen=True)
class ProgramFile:
    """A `.pte` read and checked: the parsed program, its `.ptd` tensors by name, and its record."""

    program: Any
    external: dict[str, bytes]
    record: Record | None


def read(pte: str | Path, ptd: str | Path | None = None, verify: bool = True) -> ProgramFile:
    """Read a `.pte` (and its `.ptd`), checking each file before any parser sees it.

    Checks: the ExecuTorch identifier and extended header, segment bounds, the program record (the
    file's digest, the `.ptd`'s identity), then every TensorRT blob (header, engine checksum, bindings
    against the program's tensors). With `verify=False` (files written by other tools) only the
    structure and blobs are checked.

    Raises:
        ArtifactError: one message naming the file and what is wrong with it.
    """
    data = _read_bytes(pte)
    size = check_structure(data, str(pte))
    found = record.verify(data, str(pte), size)
    if found is None and verify:
        raise ArtifactError(f"{pte} has no pipeline program record (written by another tool or an older version); "
                            "rebuild it with pipeline.export.save or the serialize stage, or load it with verify=False")
    external: dict[str, bytes] = {}
    if ptd is not None:
        ptd_data = _read_bytes(ptd)
        if found is not None and found.ptd_sha256 is None:
            raise ArtifactError(f"{pte} was written without external data, but {ptd} was given; load it without a .ptd")
        if found is not None and record.sha256(ptd_data) != found.ptd_sha256:
            raise ArtifactError(f"{ptd} is not the .ptd that {Path(pte).name} was written with (another build, or a "
                                "damaged copy); use the .ptd from the same build")
        external = _parse_ptd(ptd_data, str(ptd))
    elif found is not None and found.ptd_sha256 is not None:
        raise ArtifactError(f"{pte} keeps its tensor data in a .ptd file; pass the .ptd written with it")
    program = load_program(data, str(pte))
    check_tensorrt_io(program, str(pte))
    return ProgramFile(program, external, found)


def check_structure(data: bytes, where: str) -> int:
    """Check a `.pte`'s identifier, extended header and segment bounds; return the flatbuffer's size."""
    if len(data) < _HEAD:
        raise ArtifactError(f"{where} is {len(data)} bytes, too short for an ExecuTorch program (truncated or empty)")
    if data[4:6] != b"ET" or not data[6:8].isdigit():
        raise ArtifactError(f"{where} is not an ExecuTorch program (file identifier {data[4:8]!r}, expected b'ET..')")
    if data[8:12] != b"eh00":
        return len(data)
    length, program_size, base, segments = struct.unpack_from("<IQQQ", data, 12)
    if length < 24 or program_size > len(data) or program_size < _HEAD:
        raise ArtifactError(f"{where}: its header says the program is {program_size} bytes, but the file has "
                            f"{len(data)} (truncated or corrupt)")
    if base and (base < program_size or base + (segments if length >= 32 else 0) > len(data)):
        raise ArtifactError(f"{where}: its segments [{base}, {base + segments}) run past the {len(data)}-byte file "
                            "(truncated or corrupt)")
    return int(program_size)


def load_program(source: str | Path | bytes, where: str = "program") -> Any:
    """Parse a `.pte` (path or bytes) into ExecuTorch's Python dataclasses (the `program` part)."""
    data = source if isinstance(source, bytes) else _read_bytes(source)
    try:
        return deserialize_pte_binary(data).program
    except Exception as exc:  # flatc and the segment reader fail in many ways on damaged files
        raise ArtifactError(f"{where} cannot be parsed as an ExecuTorch program ({type(exc).__name__}: "
                            f"{str(exc).splitlines()[0] if str(exc) else ''})") from exc


def _parse_ptd(data: bytes, where: str) -> dict[str, bytes]:
    from executorch.exir._serialize._cord import Cord
    from executorch.extension.flat_tensor.serialize.serialize import FlatTensorSerializer

    if len(data) < 8 or data[4:8] != b"FT01":
        raise ArtifactError(f"{where} is not an ExecuTorch data file (identifier {data[4:8]!r}, expected b'FT01')")
    try:
        payload = FlatTensorSerializer().deserialize(Cord(data))
        return {key: bytes(payload.buffers[entry.buffer_index]) for key, entry in payload.named_data.items()}
    except Exception as exc:
        raise ArtifactError(f"{where} cannot be parsed as ExecuTorch tensor data ({type(exc).__name__})") from exc


def _read_bytes(path: str | Path) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise ArtifactError(f"cannot read {path}: {exc.strerror or exc}") from exc


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


def check_tensorrt_io(program: Any, where: str = "program") -> int:
    """Check every TensorRT delegate's blob and bindings against the program's tensors; return how many.

    Raises:
        BlobFormatError: a blob is malformed, or a binding's count, dtype or shape disagrees with the program.
    """
    plans = {p.name: p for p in program.execution_plan}
    checked = 0
    for call in delegate_calls(program):
        if call.backend != blob.BACKEND_ID:
            continue
        try:
            meta, _ = blob.decode(call.payload)
        except BlobFormatError as exc:
            raise BlobFormatError(f"{where}: method {call.method!r}: {exc}") from exc
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
