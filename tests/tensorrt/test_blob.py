"""The delegate blob contract: layout, round trip, and one clear error per violated bound."""

import struct

import pytest

from pipeline.errors import BlobFormatError
from pipeline.tensorrt import blob

META = blob.BlobMetadata(io_bindings=(
    blob.IOBinding("x", "float32", (-1, 3, 224, 224), True),
    blob.IOBinding("output_0", "float16", (-1, 1000), False),
))
ENGINE = bytes(range(256)) * 3


def test_layout_matches_torch_tensorrt() -> None:
    data = blob.encode(ENGINE, META)
    magic, meta_off, meta_size, eng_off, eng_size, reserved = struct.unpack_from("<4sIIIQ8s", data)
    assert magic == b"TR01" and meta_off == 32 and eng_off % 16 == 0
    assert reserved[0] == 1 and eng_size == len(ENGINE) and data[eng_off:] == ENGINE
    text = data[meta_off:meta_off + meta_size].decode()
    keys = ["io_bindings", "aliased_io", "hardware_compatible", "device_id", "serialized_metadata", "target_platform"]
    assert [text.index(f'"{k}"') for k in keys] == sorted(text.index(f'"{k}"') for k in keys)
    assert " " not in text  # compact JSON


def test_round_trip_keeps_dtype_shape_and_order() -> None:
    meta, engine = blob.decode(blob.encode(ENGINE, META))
    assert engine == ENGINE and meta.io_bindings == META.io_bindings
    assert [b.name for b in meta.inputs] == ["x"] and meta.outputs[0].shape == (-1, 1000)


def test_aliased_io_bumps_magic() -> None:
    meta = blob.BlobMetadata(io_bindings=META.io_bindings, aliased_io=({"output": "output_0", "input": "x", "kind": "kv"},))
    data = blob.encode(ENGINE, meta)
    assert data[:4] == b"TR02" and blob.decode(data)[0].aliased_io == meta.aliased_io


def _patched(field: int, value: int) -> bytes:
    data = bytearray(blob.encode(ENGINE, META))
    fields = list(struct.unpack_from("<4sIIIQ8s", data))
    fields[field] = value
    struct.pack_into("<4sIIIQ8s", data, 0, *fields)
    return bytes(data)


@pytest.mark.parametrize("data, message", [
    (b"TR01", "shorter than its 32-byte header"),
    (b"XXXX" + blob.encode(ENGINE, META)[4:], "magic is b'XXXX'"),
    (blob.encode(ENGINE, META)[:-10], "runs past"),
    (_patched(2, 10**6), "metadata"),
    (_patched(3, 48), "overlaps the metadata"),
    (_patched(3, 33), "not 16-byte aligned"),
    (_patched(4, 0), "empty engine"),
], ids=["short", "magic", "truncated", "meta-bounds", "overlap", "alignment", "empty"])
def test_rejects_corrupt_blobs(data: bytes, message: str) -> None:
    with pytest.raises(BlobFormatError, match=message.replace("(", r"\(")):
        blob.decode(data)


def test_rejects_bad_json() -> None:
    data = bytearray(blob.encode(ENGINE, META))
    data[32] = ord("!")
    with pytest.raises(BlobFormatError, match="not the expected JSON"):
        blob.decode(bytes(data))
