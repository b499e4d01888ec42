"""The TensorRT delegate contract, written and read here only: the delegate blob and where its engine
lives, the engine op's metadata string, the dtype names in both, and the compile-spec bytes.

Blob layout (after Torch-TensorRT's ExecuTorch integration), all little-endian:

    offset 0   header, struct "<4sIIIQ8s" (32 bytes):
               magic        4s   b"TR03": the engine is named data of the program (this writer)
                                 b"TR01"/b"TR02": the engine follows the metadata inline (older
                                 writers; TR02 when `aliased_io` is non-empty); still read
               meta_offset  u32  start of the JSON metadata (32)
               meta_size    u32  its length in bytes
               eng_offset   u32  TR03: 0; TR01/TR02: start of the inline engine, 16-byte aligned
               eng_size     u64  engine length in bytes
               reserved     8s   first byte 1, the rest 0
    then       compact UTF-8 JSON metadata, keys in this order: io_bindings [{name, dtype, shape,
               is_input[, min, max]}] (inputs in delegate-argument order, then outputs), aliased_io
               [{output, input, kind}], hardware_compatible, device_id, serialized_metadata,
               target_platform, tf32_override (TensorRT-RTX engines; see below), engine_sha256, and for
               TR03 engine_key
    then       TR01/TR02 only: zero padding to eng_offset, then the serialized engine.

A TR03 engine is stored in ExecuTorch's named data (`NamedDataStore` at export, `NamedDataMap` at
run time) under `engine_key` = "tensorrt.engine.<engine_sha256>": in a `.pte` segment, or in the
`.ptd` when the program's data is external. Equal engines share one key, so a program stores each
engine once however many delegates (of any method) call it. `engine_sha256` (hex SHA-256 of the
engine) is required; an engine that does not match it is refused.

Every binding carries its dtype (a name of `pipeline.dtypes`, e.g. "float32") and shape (dynamic dims
-1); an input with dynamic dims also carries `min` and `max`, the bounds of the engine's first
optimization profile (the whole range; further profiles narrow it, and the engine states them
itself), which the runtime checks. An output that the engine writes in place into an input's memory (a KV cache
updated by TensorRT's KVCacheUpdate layer) names that input in `aliases`: the runtime binds both to
one tensor. The engine op (`engine_op.py`) carries the same bindings in its metadata string
(`encode_op_metadata`). Compile specs are one ExecuTorch `CompileSpec` per field, its value the
field's JSON. Backend id: "TensorRTBackend".

`tf32_override` is `NVIDIA_TF32_OVERRIDE`'s value where a TensorRT-RTX engine was built ("" when
unset), which the engine keeps and needs again where it runs (`build_env.py`); the engine op's
metadata and the engine cache carry it too. Absent (older blobs, standard TensorRT): not checked.
"""

from __future__ import annotations

import functools
import hashlib
import json
import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from pipeline import dtypes
from pipeline.delegate.tensor_spec import TensorSpec
from pipeline.errors import BlobFormatError, CompileSpecError

if TYPE_CHECKING:  # ExecuTorch loads only where specs are made (stages start faster)
    from executorch.exir.backend.compile_spec_schema import CompileSpec

BACKEND_ID = "TensorRTBackend"
MAGIC = b"TR03"
INLINE_MAGICS = (b"TR01", b"TR02")  # earlier layouts, engine inline; read, never written
MAGICS = (MAGIC, *INLINE_MAGICS)
HEADER = struct.Struct("<4sIIIQ8s")
ALIGN = 16
KEY_PREFIX = "tensorrt.engine."
_RESERVED = b"\x01" + b"\x00" * 7


# An input or output binding whose memory holds its 4-D tensor channels last (N, H, W, C: TensorRT's
# HWC format) where its shape says N, C, H, W: only engines read and write it (one engine's output
# that only other engines read), so it never meets a kernel or the caller.
CHANNELS_LAST = "channels_last"


@dataclass(frozen=True)
class IOBinding:
    """One engine input or output: TensorRT tensor name, dtype name, shape (-1: dynamic)."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    is_input: bool
    min_shape: tuple[int, ...] = ()  # dynamic inputs: the profile's bounds; () for static bindings
    max_shape: tuple[int, ...] = ()
    aliases: str = ""  # outputs written in place: the input binding whose memory they share
    layout: str = ""  # CHANNELS_LAST, or "" for the order its shape says

    @classmethod
    def of(cls, name: str, dtype: torch.dtype, shape: tuple[int, ...], is_input: bool,
           min_shape: tuple[int, ...] = (), max_shape: tuple[int, ...] = (), aliases: str = "",
           layout: str = "") -> IOBinding:
        return cls(name, dtypes.name_of(dtype), shape, is_input, min_shape, max_shape, aliases, layout)

    @property
    def torch_dtype(self) -> torch.dtype:
        return dtype_from_name(self.dtype)

    @property
    def spec(self) -> TensorSpec:
        """What the engine accepts at this binding (dynamic dims without bounds: any size)."""
        low = self.min_shape or tuple(0 if d < 0 else d for d in self.shape)
        high = self.max_shape or tuple(2**31 - 1 if d < 0 else d for d in self.shape)
        return TensorSpec(self.dtype, low, high)

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"name": self.name, "dtype": self.dtype, "shape": list(self.shape), "is_input": self.is_input}
        if self.min_shape:
            doc.update(min=list(self.min_shape), max=list(self.max_shape))
        if self.aliases:
            doc["aliases"] = self.aliases
        if self.layout:
            doc["layout"] = self.layout
        return doc

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> IOBinding:
        return cls(str(doc["name"]), str(doc["dtype"]), tuple(int(d) for d in doc["shape"]), bool(doc["is_input"]),
                   tuple(int(d) for d in doc.get("min", ())), tuple(int(d) for d in doc.get("max", ())),
                   str(doc.get("aliases", "")), str(doc.get("layout", "")))


@dataclass(frozen=True)
class BlobMetadata:
    """The JSON part of a blob."""

    io_bindings: tuple[IOBinding, ...]
    aliased_io: tuple[dict[str, Any], ...] = ()
    hardware_compatible: bool = False
    device_id: int = 0
    serialized_metadata: str = ""
    target_platform: str = "linux_x86_64"
    tf32_override: str | None = None  # NVIDIA_TF32_OVERRIDE at build (TensorRT-RTX); None: not recorded
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def inputs(self) -> tuple[IOBinding, ...]:
        return tuple(b for b in self.io_bindings if b.is_input)

    @property
    def outputs(self) -> tuple[IOBinding, ...]:
        return tuple(b for b in self.io_bindings if not b.is_input)


@dataclass(frozen=True)
class EngineRef:
    """Where a blob's engine is: a named-data key (TR03), or inline bytes (TR01/TR02)."""

    sha256: str
    size: int
    key: str | None = None
    inline: bytes | None = field(default=None, repr=False)

    @classmethod
    def of(cls, engine: bytes | memoryview) -> EngineRef:
        """The reference a new blob writes for `engine` (its named-data key derives from its content)."""
        digest = hashlib.sha256(engine).hexdigest()
        return cls(digest, len(engine), KEY_PREFIX + digest)


# ---- the blob ---------------------------------------------------------------------------------
def encode(engine: EngineRef, meta: BlobMetadata) -> bytes:
    """The delegate blob of an engine stored as named data under `engine.key` (layout TR03)."""
    js = json.dumps(engine_doc(engine, meta), separators=(",", ":")).encode()
    return HEADER.pack(MAGIC, HEADER.size, len(js), 0, engine.size, _RESERVED) + js


def engine_doc(engine: EngineRef, meta: BlobMetadata) -> dict[str, Any]:
    """The JSON metadata of a TR03 blob (a plan's engine steps hold it too: `plan.py`)."""
    return {
        "io_bindings": [b.to_json() for b in meta.io_bindings],
        "aliased_io": [dict(a) for a in meta.aliased_io],
        "hardware_compatible": meta.hardware_compatible,
        "device_id": meta.device_id,
        "serialized_metadata": meta.serialized_metadata,
        "target_platform": meta.target_platform,
        **tf32_override_doc(meta),
        "engine_sha256": engine.sha256,
        "engine_key": engine.key,
    }


def decode(blob: bytes | memoryview) -> tuple[BlobMetadata, EngineRef]:
    """Unpack a delegate blob (any layout in `MAGICS`).

    Returns:
        (metadata, where its engine is). An inline engine (TR01/TR02) is checked against its digest here.
    Raises:
        BlobFormatError: one message per violated bound (size, magic, offsets, alignment, JSON, digest).
    """
    magic, meta_offset, meta_size, eng_offset, eng_size = read_header(blob)
    try:
        doc = json.loads(bytes(blob[meta_offset : meta_offset + meta_size]).decode())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BlobFormatError(f"TensorRT blob metadata is not the expected JSON ({type(exc).__name__}: {exc})") from exc
    if magic == MAGIC:
        return engine_from_doc(doc, eng_size)
    meta, ref = engine_from_doc({**doc, "engine_key": None}, eng_size)
    engine = bytes(blob[eng_offset : eng_offset + eng_size])
    ref = EngineRef(ref.sha256, eng_size, None, engine)
    check_engine(ref, engine)
    return meta, ref


def engine_from_doc(doc: Any, size: int) -> tuple[BlobMetadata, EngineRef]:
    """Inverse of `engine_doc` (an engine of `size` bytes; `engine_key` None: inline).

    Raises:
        BlobFormatError: a key missing or of the wrong type, metadata `check_coherent` refuses, or a key
            that is not its digest's.
    """
    try:
        meta = BlobMetadata(
            io_bindings=tuple(IOBinding.from_json(b) for b in doc["io_bindings"]),
            aliased_io=tuple(doc.get("aliased_io", ())),
            hardware_compatible=bool(doc.get("hardware_compatible", False)),
            device_id=int(doc.get("device_id", 0)),
            serialized_metadata=str(doc.get("serialized_metadata", "")),
            target_platform=str(doc.get("target_platform", "")),
            tf32_override=read_tf32_override(doc),
        )
        digest = str(doc["engine_sha256"])
        key = None if doc["engine_key"] is None else str(doc["engine_key"])
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise BlobFormatError(f"TensorRT blob metadata is not the expected JSON ({type(exc).__name__}: {exc})") from exc
    check_coherent(meta)
    if key is not None and key != KEY_PREFIX + digest:
        raise BlobFormatError(f"TensorRT blob names engine {key!r}, which is not the key of its digest {digest}")
    return meta, EngineRef(digest, size, key)


_DIM_MAX = 2**31 - 1  # TensorRT dims are int32


def check_coherent(meta: BlobMetadata) -> None:
    """Refuse metadata that no writer of this contract produces, whoever sealed the file around it:
    binding names unique, dtypes known, static dims with bounds equal to them, dynamic dims (-1) with
    0 <= min <= max < 2**31, bounds of the shape's rank, at least one output, aliases that name an
    input binding of the same dtype and rank, and a layout only where a 4-D float binding that aliases
    nothing is held channels last.

    Raises:
        BlobFormatError: naming the binding and the broken rule.
    """
    names = [b.name for b in meta.io_bindings]
    if len(set(names)) != len(names) or not all(names):
        raise BlobFormatError(f"TensorRT blob binds the names {names}: every binding needs its own non-empty name")
    if not meta.outputs:
        raise BlobFormatError("TensorRT blob binds no output")
    inputs = {b.name: b for b in meta.inputs}
    for b in meta.io_bindings:
        where = f"TensorRT blob binding {b.name!r}"
        if dtypes.by_name(b.dtype) is None:
            raise BlobFormatError(f"{where} has dtype {b.dtype!r}, not one of {sorted(dtypes.BY_NAME)}")
        bounds = (b.min_shape, b.max_shape) if b.min_shape or b.max_shape else (b.shape, b.shape)
        if any(len(bound) != len(b.shape) for bound in bounds) or len(b.shape) > 8:
            raise BlobFormatError(f"{where} has shape {list(b.shape)} with bounds of another rank {[list(x) for x in bounds]}")
        for size, lo, hi in zip(b.shape, *bounds):
            if size == -1 and b.is_input and not 0 <= lo <= hi <= _DIM_MAX:
                raise BlobFormatError(f"{where} has a dynamic dim bounded {lo}..{hi}; needs 0 <= min <= max < 2**31")
            if size != -1 and not (0 <= size <= _DIM_MAX and lo == hi == size):
                raise BlobFormatError(f"{where} has a dim of size {size} bounded {lo}..{hi}; a static dim is its own bounds")
        if b.aliases and (b.is_input or b.aliases not in inputs or inputs[b.aliases].dtype != b.dtype
                          or len(inputs[b.aliases].shape) != len(b.shape)):
            raise BlobFormatError(f"{where} aliases {b.aliases!r}, which is not an input binding of its dtype and rank")
        if b.layout and (b.layout != CHANNELS_LAST or len(b.shape) != 4 or b.aliases
                         or b.torch_dtype not in dtypes.FLOAT_DTYPES):
            raise BlobFormatError(f"{where} has layout {b.layout!r}: only a 4-D float binding that aliases nothing "
                                  f"may be held {CHANNELS_LAST!r}")


def tf32_override_doc(meta: BlobMetadata) -> dict[str, str]:
    """The `tf32_override` key of a metadata document: present only where the build recorded it."""
    return {} if meta.tf32_override is None else {"tf32_override": meta.tf32_override}


def read_tf32_override(doc: Mapping[str, Any]) -> str | None:
    value = doc.get("tf32_override")
    return None if value is None else str(value)


def read_header(blob: bytes | memoryview) -> tuple[bytes, int, int, int, int]:
    """Check the header against the blob's size; return (magic, meta_offset, meta_size, eng_offset, eng_size)."""
    if len(blob) < HEADER.size:
        raise BlobFormatError(f"TensorRT blob is {len(blob)} bytes, shorter than its {HEADER.size}-byte header")
    magic, meta_offset, meta_size, eng_offset, eng_size, _ = HEADER.unpack_from(blob)
    if magic not in MAGICS:
        raise BlobFormatError(
            f"TensorRT blob magic is {magic!r}: a layout this version does not implement (it reads "
            f"{', '.join(repr(m) for m in MAGICS)}); run the program with the pipeline version that wrote it, or rebuild it"
        )
    if meta_offset < HEADER.size or meta_offset + meta_size > len(blob):
        raise BlobFormatError(
            f"TensorRT blob metadata [{meta_offset}, {meta_offset + meta_size}) lies outside the {len(blob)}-byte blob"
        )
    if eng_size == 0:
        raise BlobFormatError("TensorRT blob holds an empty engine")
    if magic == MAGIC:
        if eng_offset != 0 or meta_offset + meta_size != len(blob):
            raise BlobFormatError(f"TensorRT blob (layout {MAGIC!r}) has bytes after its metadata or an inline engine offset")
        return magic, meta_offset, meta_size, eng_offset, eng_size
    if eng_offset % ALIGN:
        raise BlobFormatError(f"TensorRT blob engine offset {eng_offset} is not {ALIGN}-byte aligned")
    if eng_offset < meta_offset + meta_size:
        raise BlobFormatError(f"TensorRT blob engine offset {eng_offset} overlaps the metadata")
    if eng_offset + eng_size > len(blob):
        raise BlobFormatError(
            f"TensorRT blob engine [{eng_offset}, {eng_offset + eng_size}) runs past the {len(blob)}-byte blob (truncated?)"
        )
    return magic, meta_offset, meta_size, eng_offset, eng_size


def engine_bytes(ref: EngineRef, named: Mapping[str, Any], checked: bool = False) -> bytes | memoryview:
    """The engine `ref` names: inline, or a view of the program's named data (no copy).

    Args:
        named: the program's named data by key (`.pte` segments and `.ptd` entries).
        checked: the bytes were already verified (the file holding them matched its recorded digest),
            so they are not hashed again.
    Raises:
        BlobFormatError: the key is missing, or the data's size or digest is not the engine's.
    """
    if ref.inline is not None:
        return ref.inline
    assert ref.key is not None
    data = named.get(ref.key)
    if data is None:
        raise BlobFormatError(f"TensorRT engine {ref.key!r} is not in the program's named data: the program keeps its "
                              "engines in its .ptd file (pass the .ptd written with it), or the file is damaged")
    if len(data) != ref.size:
        raise BlobFormatError(f"TensorRT engine {ref.key!r} is {len(data)} bytes in the program's data, its blob says "
                              f"{ref.size} (damaged file, or data of another build); rebuild the program")
    if not checked:
        check_engine(ref, data)
    return data


def check_engine(ref: EngineRef, data: bytes | memoryview) -> None:
    if hashlib.sha256(data).hexdigest() != ref.sha256:
        raise BlobFormatError("TensorRT engine does not match its checksum (corrupt or altered); rebuild the program")


def is_engine_key(key: str) -> bool:
    """Whether a named-data key is one of our engines."""
    return key.startswith(KEY_PREFIX)


# ---- the engine op's metadata -------------------------------------------------------------------
def encode_op_metadata(meta: BlobMetadata, out_shapes: list[list[int | str]], build: dict[str, Any] | None = None) -> str:
    """The engine op's metadata string: bindings, each output's shape (ints or expressions over input
    dims such as "in0_1 + 1"), and `build` statistics for lowering reports."""
    doc = {"io_bindings": [b.to_json() for b in meta.io_bindings], **tf32_override_doc(meta), "out_shapes": out_shapes,
           "build": build or {}}
    return json.dumps(doc, separators=(",", ":"))


@functools.lru_cache(maxsize=256)
def decode_op_metadata(text: str) -> tuple[BlobMetadata, list[list[int | str]]]:
    """Inverse of `encode_op_metadata`: (bindings as metadata, output shapes)."""
    doc = json.loads(text)
    bindings = tuple(IOBinding.from_json(b) for b in doc["io_bindings"])
    return BlobMetadata(io_bindings=bindings, tf32_override=read_tf32_override(doc)), doc["out_shapes"]


def op_build_info(text: str) -> dict[str, Any]:
    """The build statistics stored in an engine op's metadata string."""
    return dict(json.loads(text).get("build", {}))


# ---- dtype names ----------------------------------------------------------------------------------
def dtype_from_name(name: str) -> torch.dtype:
    """The torch dtype of a binding's dtype name."""
    row = dtypes.by_name(name)
    if row is None:
        raise CompileSpecError(f"unknown dtype name {name!r} in engine bindings; expected one of {sorted(dtypes.BY_NAME)}")
    return row.torch


# ---- compile-spec bytes -------------------------------------------------------------------------
def encode_compile_specs(values: Mapping[str, Any]) -> list[CompileSpec]:
    """One ExecuTorch compile spec per field, its value the field's JSON."""
    from executorch.exir.backend.compile_spec_schema import CompileSpec  # ExecuTorch only where specs are made

    return [CompileSpec(k, json.dumps(v).encode()) for k, v in values.items()]


def decode_compile_specs(specs: Iterable[CompileSpec]) -> dict[str, Any]:
    """Inverse of `encode_compile_specs`.

    Raises:
        CompileSpecError: a value that is not JSON.
    """
    values: dict[str, Any] = {}
    for spec in specs:
        try:
            values[spec.key] = json.loads(bytes(spec.value).decode())
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise CompileSpecError(f"compile-spec {spec.key!r} is not JSON: {exc}") from exc
    return values
