"""The TensorRT delegate blob: the one place that writes and reads it.

Layout (compatible with Torch-TensorRT's ExecuTorch integration), all little-endian:

    offset 0   header, struct "<4sIIIQ8s" (32 bytes):
               magic        4s   b"TR01" (b"TR02" when `aliased_io` is non-empty, so old readers refuse)
               meta_offset  u32  start of the JSON metadata (32)
               meta_size    u32  its length in bytes
               eng_offset   u32  start of the engine, 16-byte aligned, after the metadata
               eng_size     u64  engine length in bytes
               reserved     8s   first byte 1, the rest 0
    then       compact UTF-8 JSON metadata, keys in this order: io_bindings [{name, dtype, shape,
               is_input[, min, max]}] (inputs in delegate-argument order, then outputs), aliased_io
               [{output, input, kind}], hardware_compatible, device_id, serialized_metadata,
               target_platform, engine_sha256
    then       zero padding to eng_offset, then the serialized engine.

Unlike upstream, every binding carries its dtype (torch name without "torch.", e.g. "float32") and
shape (a list whose dynamic dims are -1); an input with dynamic dims also carries `min` and `max`
(its optimization-profile bounds, which the runtime checks), and `engine_sha256` (hex SHA-256 of
the engine bytes) is required: `decode` refuses an engine that does not match it. The binding
encoding below is also the engine op's (`engine_op.py`). Backend id: "TensorRTBackend".
"""

from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import dataclass, field
from typing import Any

from pipeline.errors import BlobFormatError
from pipeline.tensor_spec import TensorSpec

BACKEND_ID = "TensorRTBackend"
MAGIC = b"TR01"
MAGIC_ALIASED = b"TR02"
HEADER = struct.Struct("<4sIIIQ8s")
ALIGN = 16
_RESERVED = b"\x01" + b"\x00" * 7


@dataclass(frozen=True)
class IOBinding:
    """One engine input or output: TensorRT tensor name, torch dtype name, shape (-1: dynamic)."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    is_input: bool
    min_shape: tuple[int, ...] = ()  # dynamic inputs: the profile's bounds; () for static bindings
    max_shape: tuple[int, ...] = ()

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
        return doc

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> IOBinding:
        return cls(str(doc["name"]), str(doc["dtype"]), tuple(int(d) for d in doc["shape"]), bool(doc["is_input"]),
                   tuple(int(d) for d in doc.get("min", ())), tuple(int(d) for d in doc.get("max", ())))


@dataclass(frozen=True)
class BlobMetadata:
    """The JSON part of a blob."""

    io_bindings: tuple[IOBinding, ...]
    aliased_io: tuple[dict[str, Any], ...] = ()
    hardware_compatible: bool = False
    device_id: int = 0
    serialized_metadata: str = ""
    target_platform: str = "linux_x86_64"
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def inputs(self) -> tuple[IOBinding, ...]:
        return tuple(b for b in self.io_bindings if b.is_input)

    @property
    def outputs(self) -> tuple[IOBinding, ...]:
        return tuple(b for b in self.io_bindings if not b.is_input)


def encode(engine: bytes, meta: BlobMetadata) -> bytes:
    """Pack an engine and its metadata into a delegate blob."""
    doc = {
        "io_bindings": [b.to_json() for b in meta.io_bindings],
        "aliased_io": [dict(a) for a in meta.aliased_io],
        "hardware_compatible": meta.hardware_compatible,
        "device_id": meta.device_id,
        "serialized_metadata": meta.serialized_metadata,
        "target_platform": meta.target_platform,
        "engine_sha256": hashlib.sha256(engine).hexdigest(),
    }
    js = json.dumps(doc, separators=(",", ":")).encode()
    meta_offset = HEADER.size
    eng_offset = _align(meta_offset + len(js))
    magic = MAGIC_ALIASED if meta.aliased_io else MAGIC
    header = HEADER.pack(magic, meta_offset, len(js), eng_offset, len(engine), _RESERVED)
    pad = b"\x00" * (eng_offset - meta_offset - len(js))
    return header + js + pad + bytes(engine)


def decode(blob: bytes) -> tuple[BlobMetadata, bytes]:
    """Unpack a delegate blob.

    Returns:
        (metadata, engine bytes).
    Raises:
        BlobFormatError: one message per violated bound (size, magic, offsets, alignment, JSON).
    """
    meta_offset, meta_size, eng_offset, eng_size = read_header(blob)
    try:
        doc = json.loads(bytes(blob[meta_offset : meta_offset + meta_size]).decode())
        bindings = tuple(IOBinding.from_json(b) for b in doc["io_bindings"])
        meta = BlobMetadata(
            io_bindings=bindings,
            aliased_io=tuple(doc.get("aliased_io", ())),
            hardware_compatible=bool(doc.get("hardware_compatible", False)),
            device_id=int(doc.get("device_id", 0)),
            serialized_metadata=str(doc.get("serialized_metadata", "")),
            target_platform=str(doc.get("target_platform", "")),
        )
        digest = str(doc["engine_sha256"])
    except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError) as exc:
        raise BlobFormatError(f"TensorRT blob metadata is not the expected JSON ({type(exc).__name__}: {exc})") from exc
    engine = bytes(blob[eng_offset : eng_offset + eng_size])
    if hashlib.sha256(engine).hexdigest() != digest:
        raise BlobFormatError("TensorRT engine does not match its checksum (corrupt or altered); rebuild the program")
    return meta, engine


def read_header(blob: bytes) -> tuple[int, int, int, int]:
    """Check the header against the blob's size; return (meta_offset, meta_size, eng_offset, eng_size)."""
    if len(blob) < HEADER.size:
        raise BlobFormatError(f"TensorRT blob is {len(blob)} bytes, shorter than its {HEADER.size}-byte header")
    magic, meta_offset, meta_size, eng_offset, eng_size, _ = HEADER.unpack_from(blob)
    if magic not in (MAGIC, MAGIC_ALIASED):
        raise BlobFormatError(f"TensorRT blob magic is {magic!r}, expected {MAGIC!r} or {MAGIC_ALIASED!r}")
    if meta_offset < HEADER.size or meta_offset + meta_size > len(blob):
        raise BlobFormatError(
            f"TensorRT blob metadata [{meta_offset}, {meta_offset + meta_size}) lies outside the {len(blob)}-byte blob"
        )
    if eng_offset % ALIGN:
        raise BlobFormatError(f"TensorRT blob engine offset {eng_offset} is not {ALIGN}-byte aligned")
    if eng_offset < meta_offset + meta_size:
        raise BlobFormatError(f"TensorRT blob engine offset {eng_offset} overlaps the metadata")
    if eng_offset + eng_size > len(blob):
        raise BlobFormatError(
            f"TensorRT blob engine [{eng_offset}, {eng_offset + eng_size}) runs past the {len(blob)}-byte blob (truncated?)"
        )
    if eng_size == 0:
        raise BlobFormatError("TensorRT blob holds an empty engine")
    return meta_offset, meta_size, eng_offset, eng_size


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN

