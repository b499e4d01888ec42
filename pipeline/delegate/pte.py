"""Read `.pte` files (and their `.ptd`), checking them first: structure, program record (the file's
digest and its `.ptd`'s identity), and every TensorRT delegate with its blob checked against the
tensors the program passes to it and against the engine it names. Both files are memory-mapped: named
data (engines, external tensors) are views of the mapping, never copies."""

from __future__ import annotations

import functools
import importlib
import mmap
import os
import pkgutil
import stat
import struct
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline import dtypes
from pipeline import executorch_api as et
from pipeline.delegate import blob, record
from pipeline.delegate.plan import check_data, delegate_view
from pipeline.delegate.record import Record
from pipeline.errors import ArtifactError, BlobFormatError, PipelineError

_HEAD = 8 + 32  # flatbuffer root offset + file identifier, then ExecuTorch's extended header
_FT_HEAD = 8 + 40  # the same for a `.ptd`: root offset + b"FT01", then its b"FH01" header

Data = bytes | mmap.mmap
_FLATBUFFER_MAX = 2**31 - 1  # flatbuffers address at most 2 GiB
_PTD_INDEX_MAX = 64 << 20  # a `.ptd`'s flatbuffer lists its entries (about 100 bytes each); its data is segments
# While `parse` unpacks a flatbuffer: what is left of its budget of objects (tables, vector elements,
# string bytes). A tree of tables holds fewer than its bytes; one whose tables are shared many times
# (a DAG a forger can write in kilobytes) would unpack into far more, and is refused instead.
_UNPACK_BUDGET: ContextVar[list[int] | None] = ContextVar("_UNPACK_BUDGET", default=None)


@dataclass(frozen=True)
class DelegateInfo:
    """One delegate call in a method: its backend, blob, and the program values it reads and writes."""

    method: str
    backend: str
    payload: bytes
    args: tuple[int, ...]


@dataclass(frozen=True)
class ProgramFile:
    """A `.pte` read and checked: the parsed program, its named data (`.pte` segments and `.ptd`
    entries, as views of the mapped files; every engine a blob names is there and matches its
    digest), where each key lives, and its record."""

    program: Any
    named: Mapping[str, memoryview]
    sources: Mapping[str, str]  # key -> "pte" or "ptd"
    record: Record | None


def read(pte: str | Path, ptd: str | Path | None = None, verify: bool = True) -> ProgramFile:
    """Read a `.pte` (and its `.ptd`), checking each file before any parser sees it.

    Checks: the ExecuTorch identifier and extended header, segment bounds, the program record (the
    file's digest, the `.ptd`'s identity), then every TensorRT blob (header, bindings against the
    program's tensors, the engine it names present with its size and, where no record vouched for the
    file, its digest). With `verify=False` (files written by other tools) a file without a record is
    read with these checks alone.

    Raises:
        ArtifactError: one message naming the file and what is wrong with it.
    """
    data = map_file(pte)
    size = check_structure(data, str(pte))
    found = record.verify(data, str(pte), size)
    if found is None and verify:
        raise ArtifactError(f"{pte} has no pipeline program record (written by another tool or an older version); "
                            "rebuild it with pipeline.lowering.serialize.save or the serialize stage, or load it with verify=False")
    external: dict[str, memoryview] = {}
    if ptd is not None:
        ptd_data = map_file(ptd)
        if found is not None and found.ptd_sha256 is None:
            raise ArtifactError(f"{pte} was written without external data, but {ptd} was given; load it without a .ptd")
        if found is not None and record.sha256(ptd_data) != found.ptd_sha256:
            raise ArtifactError(f"{ptd} is not the .ptd that {Path(pte).name} was written with (another build, or a "
                                "damaged copy); use the .ptd from the same build")
        external = parse_ptd(ptd_data, str(ptd))
    elif found is not None and found.ptd_sha256 is not None:
        raise ArtifactError(f"{pte} keeps its tensor data in a .ptd file (weights, engines); pass the .ptd written with it")
    program, inside = parse(data, str(pte))
    both = set(inside) & set(external)
    if both:
        raise ArtifactError(f"{ptd} and {pte} both hold named data {sorted(both)[:3]}; use the .ptd from the same build")
    named = {**inside, **external}
    # Files that matched their record's digests hold the engines they were written with; others'
    # engines are hashed here, so a read program's engines are all known good.
    try:
        check_tensorrt_io(program, str(pte), named, hashed=found is not None)
    except (IndexError, KeyError, TypeError, AttributeError, ValueError) as exc:
        if isinstance(exc, ArtifactError):
            raise
        raise ArtifactError(f"{pte}: its delegate calls do not match its values or delegates ({type(exc).__name__}: "
                            f"{exc}); the file is corrupt or not an ExecuTorch program") from exc
    sources = {**dict.fromkeys(inside, "pte"), **dict.fromkeys(external, "ptd")}
    return ProgramFile(program, named, sources, found)


def map_file(path: str | Path) -> Data:
    """A read-only memory mapping of a regular file (an empty file reads as b"").

    Raises:
        ArtifactError: the path cannot be read or is not a regular file (a FIFO, a device, a folder).
    """
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            raise ArtifactError(f"{path} is not a regular file (a pipe, device or folder); give the path of a program file")
        with open(path, "rb") as f:
            if f.seek(0, 2) == 0:
                return b""
            return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except OSError as exc:
        raise ArtifactError(f"cannot read {path}: {exc.strerror or exc}") from exc


def check_structure(data: Data, where: str) -> int:
    """Check a `.pte`'s identifier, extended header and segment bounds; return the flatbuffer's size."""
    if len(data) < _HEAD:
        raise ArtifactError(f"{where} is {len(data)} bytes, too short for an ExecuTorch program (truncated or empty)")
    if data[4:6] != b"ET" or not data[6:8].isdigit():
        raise ArtifactError(f"{where} is not an ExecuTorch program (file identifier {data[4:8]!r}, expected b'ET..')")
    if data[8:12] != b"eh00":
        return _flatbuffer_size(len(data), where)
    length, program_size, base, segments = struct.unpack_from("<IQQQ", data, 12)
    if length < 24 or program_size > len(data) or program_size < _HEAD:
        raise ArtifactError(f"{where}: its header says the program is {program_size} bytes, but the file has "
                            f"{len(data)} (truncated or corrupt)")
    if base and (base < program_size or base + (segments if length >= 32 else 0) > len(data)):
        raise ArtifactError(f"{where}: its segments [{base}, {base + segments}) run past the {len(data)}-byte file "
                            "(truncated or corrupt)")
    return _flatbuffer_size(int(program_size), where)


def _flatbuffer_size(size: int, where: str) -> int:
    if size > _FLATBUFFER_MAX:
        raise ArtifactError(f"{where}: its program is {size} bytes, more than a flatbuffer can hold (2 GiB); "
                            "the file is not an ExecuTorch program or is corrupt")
    return size


def parse(data: Data, where: str = "program") -> tuple[Any, dict[str, memoryview]]:
    """Parse a `.pte` into ExecuTorch's Python dataclasses (delegate and constant segments restored
    as views of `data`) and its named data by key (views of `data`).

    Raises:
        ArtifactError: the file cannot be parsed, or a segment lies outside it.
    """
    size = check_structure(data, where)
    base = struct.unpack_from("<Q", data, 24)[0] if data[8:12] == b"eh00" else 0  # segment_base_offset
    view = memoryview(data)
    _count_unpacking()
    budget = _UNPACK_BUDGET.set([2 * size + 4096])
    try:
        program = et.flatbuffer_to_program(view[:size])  # read in place: no copy of the file
        entries = list(program.named_data or [])
        segments = [view[base + s.offset : base + s.offset + s.size] for s in program.segments]
        if base and any(base + s.offset + s.size > len(data) for s in program.segments):
            raise ValueError("a segment runs past the end of the file")
        program.named_data = []
        if base:
            program = et.restore_segments(program, view[base:]).program
        named = {entry.key: segments[entry.segment_index] for entry in entries}
    except _Expanding as exc:
        raise ArtifactError(f"{where} cannot be an ExecuTorch program: its {size}-byte flatbuffer unpacks into more "
                            "objects than it could hold as a tree (tables shared many times: forged or corrupt)") from exc
    except Exception as exc:  # flatc and the segment reader fail in many ways on damaged files
        raise ArtifactError(f"{where} cannot be parsed as an ExecuTorch program ({type(exc).__name__}: "
                            f"{str(exc).splitlines()[0] if str(exc) else ''})") from exc
    finally:
        _UNPACK_BUDGET.reset(budget)
    return program, named


class _Expanding(Exception):
    """A flatbuffer unpacked past its budget (`_UNPACK_BUDGET`)."""


@functools.cache
def _count_unpacking() -> None:
    """Make every table class of ExecuTorch's generated flatbuffer reader charge what it unpacks to
    `_UNPACK_BUDGET` while one is set (once per process; outside `parse` nothing changes). A wrapper
    of ExecuTorch's reader rather than a reader of our own: the budget then follows its schema."""
    generated = et.flatbuffer_tables()

    for info in pkgutil.iter_modules(generated.__path__):
        cls = getattr(importlib.import_module(f"{generated.__name__}.{info.name}"), f"{info.name}T", None)
        if cls is not None and not getattr(cls._UnPack, "_counted", False):
            cls._UnPack = _counted(cls._UnPack)


def _counted(unpack: Callable[[Any, Any], None]) -> Callable[[Any, Any], None]:
    def counted(self: Any, table: Any) -> None:
        unpack(self, table)
        budget = _UNPACK_BUDGET.get()
        if budget is not None:
            budget[0] -= 1 + sum(len(v) for v in vars(self).values() if isinstance(v, (list, str, bytes)) or hasattr(v, "__array__"))
            if budget[0] < 0:
                raise _Expanding()
    counted._counted = True  # type: ignore[attr-defined]
    return counted


def load_program(source: str | Path | bytes, where: str = "program") -> Any:
    """Parse a `.pte` (path or bytes) into ExecuTorch's Python dataclasses (the `program` part)."""
    data = source if isinstance(source, bytes) else map_file(source)
    return parse(data, where)[0]


def parse_ptd(data: Data, where: str) -> dict[str, memoryview]:
    """The named data of a `.ptd` (ExecuTorch's FlatTensor file) by key, as views of `data`.

    Raises:
        ArtifactError: not a FlatTensor file, or an entry lies outside it.
    """
    from executorch.extension.flat_tensor.serialize.serialize import FlatTensorHeader

    if len(data) < _FT_HEAD or data[4:8] != b"FT01":
        raise ArtifactError(f"{where} is not an ExecuTorch data file (identifier {data[4:8]!r}, expected b'FT01')")
    view = memoryview(data)
    try:
        header = FlatTensorHeader.from_bytes(bytes(view[8:_FT_HEAD]))
        end = header.flatbuffer_offset + header.flatbuffer_size
        if not header.is_valid() or end > len(data) or header.segment_base_offset + header.segment_data_size > len(data):
            raise ValueError(f"header {header} does not fit the {len(data)}-byte file")
        if header.flatbuffer_size > _PTD_INDEX_MAX:  # the index of the data, not the data: never this large
            raise ValueError(f"its index is {header.flatbuffer_size} bytes (at most {_PTD_INDEX_MAX} are read)")
        flat = et.flat_tensor(bytes(view[:end]))
        base = header.segment_base_offset
        out = {}
        for entry in flat.named_data:
            segment = flat.segments[entry.segment_index]
            if segment.offset + segment.size > header.segment_data_size:
                raise ValueError(f"entry {entry.key!r} runs past the data")
            out[entry.key] = view[base + segment.offset : base + segment.offset + segment.size]
        return out
    except Exception as exc:
        raise ArtifactError(f"{where} cannot be parsed as ExecuTorch tensor data ({type(exc).__name__}: "
                            f"{str(exc).splitlines()[0] if str(exc) else ''}); use the .ptd from the same build") from exc


def engine(file: ProgramFile, payload: bytes) -> tuple[blob.BlobMetadata, bytes | memoryview]:
    """A TensorRT delegate's metadata and engine: a view of the mapped file for named engines.

    Raises:
        BlobFormatError: the blob is malformed, or its engine is missing or not the one it names.
    """
    meta, ref = blob.decode(payload)
    return meta, blob.engine_bytes(ref, file.named, checked=True)  # `read` checked it


def named_entries(file: ProgramFile) -> list[dict[str, Any]]:
    """Every named entry of a read program: key, file ("pte"/"ptd"), bytes and SHA-256, by key."""
    return [{"key": key, "file": file.sources[key], "bytes": len(file.named[key]), "sha256": record.sha256(file.named[key])}
            for key in sorted(file.named)]


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


def check_tensorrt_io(program: Any, where: str = "program", named: Mapping[str, Any] | None = None,
                      hashed: bool = False) -> int:
    """Check every TensorRT delegate's blob and bindings against the program's tensors, and (given the
    program's `named` data) that the engine each blob names is there with its size and, unless the
    bytes were `hashed` already, its digest; return how many.

    Raises:
        BlobFormatError: a blob is malformed or of a layout this version does not implement, a
            binding's count, dtype or shape disagrees with the program, or a named engine is missing.
    """
    plans = {p.name: p for p in program.execution_plan}
    checked = 0
    for call in delegate_calls(program):
        if call.backend != blob.BACKEND_ID:
            continue
        try:
            meta, refs = delegate_view(call.payload)
            if named is not None:
                check_data([r for r in refs if r.key is not None], named, checked=hashed)
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
    row = dtypes.by_name(binding.dtype)
    if row is None or tensor.scalar_type.name != row.scalar_name:
        raise BlobFormatError(f"{where} has dtype {binding.dtype} but the program's tensor is {tensor.scalar_type.name}")
    sizes = list(tensor.sizes)
    if len(sizes) != len(binding.shape) or any(b not in (-1, s) for b, s in zip(binding.shape, sizes)):
        raise BlobFormatError(f"{where} has shape {list(binding.shape)} but the program's tensor is {sizes}")


@contextmanager
def unvouched(file: ProgramFile, where: str) -> Iterator[None]:
    """For a program read without a record (`verify=False`: nothing vouches for its structure), turn
    any failure that is not one of ours into one `ArtifactError` naming the file; a program whose
    record matched is our own writer's output, and its errors stay what they are."""
    if file.record is not None:
        yield
        return
    try:
        yield
    except PipelineError:
        raise
    except (IndexError, KeyError, TypeError, AttributeError, ValueError, RuntimeError, OverflowError) as exc:
        reason = (str(exc).strip().splitlines() or [""])[0]
        raise ArtifactError(f"{where} was read without a program record (verify=False) and is not a program this "
                            f"runtime can run ({type(exc).__name__}: {reason}); rebuild it, or load a file written "
                            "by pipeline.lowering.serialize.save") from exc
