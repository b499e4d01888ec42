"""The delegate contract: blob layouts (TR03 written, TR01/TR02 still read), the named engine, the
engine op's metadata, dtype names and compile-spec bytes; one clear error per violated bound."""

import hashlib
import json
import struct
from pathlib import Path

import pytest
import torch
from executorch.exir.backend.compile_spec_schema import CompileSpec

from pipeline import dtypes
from pipeline.delegate import blob, pte
from pipeline.errors import BlobFormatError, CompileSpecError

META = blob.BlobMetadata(io_bindings=(
    blob.IOBinding("x", "float32", (-1, 3, 224, 224), True, (1, 3, 224, 224), (8, 3, 224, 224)),
    blob.IOBinding("output_0", "float16", (-1, 1000), False),
))
ENGINE = bytes(range(256)) * 3
REF = blob.EngineRef.of(ENGINE)
LEGACY = Path(__file__).parents[1] / "data" / "legacy_tr01.pte"  # written by the pipeline before TR03


def test_layout_names_its_engine() -> None:
    data = blob.encode(REF, META)
    magic, meta_off, meta_size, eng_off, eng_size, reserved = struct.unpack_from("<4sIIIQ8s", data)
    assert magic == b"TR03" and meta_off == 32 and meta_off + meta_size == len(data)
    assert eng_off == 0 and eng_size == len(ENGINE) and reserved[0] == 1
    text = data[meta_off:].decode()
    keys = ["io_bindings", "aliased_io", "hardware_compatible", "device_id", "serialized_metadata", "target_platform",
            "engine_sha256", "engine_key"]
    assert [text.index(f'"{k}"') for k in keys] == sorted(text.index(f'"{k}"') for k in keys)
    assert " " not in text and ENGINE not in data  # compact JSON; the engine itself is named data
    digest = hashlib.sha256(ENGINE).hexdigest()
    assert json.loads(text)["engine_key"] == REF.key == f"tensorrt.engine.{digest}"


def test_round_trip_keeps_dtype_shape_bounds_and_order() -> None:
    meta, ref = blob.decode(blob.encode(REF, META))
    assert ref == REF and meta.io_bindings == META.io_bindings
    assert [b.name for b in meta.inputs] == ["x"] and meta.outputs[0].shape == (-1, 1000)
    assert meta.inputs[0].spec.max == (8, 3, 224, 224)
    assert blob.engine_bytes(ref, {REF.key: memoryview(ENGINE)}) == ENGINE


def test_earlier_inline_layout_still_reads() -> None:
    (call,) = pte.delegate_calls(pte.load_program(LEGACY))
    assert call.payload[:4] == b"TR01"
    meta, ref = blob.decode(call.payload)
    assert ref.key is None and len(ref.inline or b"") == ref.size > 0
    assert blob.engine_bytes(ref, {}) == ref.inline
    assert [b.name for b in meta.inputs] == ["input_1"] and meta.inputs[0].min_shape == (1, 8)


def test_unknown_layout_is_refused_by_name() -> None:
    data = b"TR09" + blob.encode(REF, META)[4:]
    with pytest.raises(BlobFormatError, match=r"magic is b'TR09': a layout this version does not implement "
                                              r"\(it reads b'TR03', b'TR01', b'TR02'\)"):
        blob.decode(data)


def _patched(field: int, value: int) -> bytes:
    data = bytearray(blob.encode(REF, META))
    fields = list(struct.unpack_from("<4sIIIQ8s", data))
    fields[field] = value
    struct.pack_into("<4sIIIQ8s", data, 0, *fields)
    return bytes(data)


@pytest.mark.parametrize("data, message", [
    (b"TR03", "shorter than its 32-byte header"),
    (blob.encode(REF, META)[:-10], "metadata"),
    (blob.encode(REF, META) + b"\x00", "bytes after its metadata"),
    (_patched(3, 64), "inline engine offset"),
    (_patched(4, 0), "empty engine"),
    (blob.encode(REF, META).replace(REF.key.encode(), (REF.key[:-1] + "0").encode()), "not the key of its digest"),
], ids=["short", "truncated", "trailing", "offset", "empty", "key"])
def test_rejects_corrupt_blobs(data: bytes, message: str) -> None:
    with pytest.raises(BlobFormatError, match=message):
        blob.decode(data)


def test_rejects_bad_json() -> None:
    data = bytearray(blob.encode(REF, META))
    data[32] = ord("!")
    with pytest.raises(BlobFormatError, match="not the expected JSON"):
        blob.decode(bytes(data))


@pytest.mark.parametrize("named, checked, message", [
    ({}, True, r"not in the program's named data: the program keeps its engines in its \.ptd"),
    ({REF.key: memoryview(ENGINE[:-1])}, True, "is 767 bytes in the program's data, its blob says 768"),
    ({REF.key: memoryview(ENGINE[::-1])}, False, "does not match its checksum"),
], ids=["missing", "size", "digest"])
def test_named_engine_must_be_the_blobs(named: dict, checked: bool, message: str) -> None:
    with pytest.raises(BlobFormatError, match=message):
        blob.engine_bytes(REF, named, checked=checked)


def test_op_metadata_round_trip() -> None:
    text = blob.encode_op_metadata(META, [["in0_0", 1000]], {"num_layers": 3})
    meta, shapes = blob.decode_op_metadata(text)
    assert meta.io_bindings == META.io_bindings and shapes == [["in0_0", 1000]]
    assert blob.op_build_info(text) == {"num_layers": 3}


@pytest.mark.parametrize("name", sorted(dtypes.BY_NAME))
def test_dtype_names_round_trip(name: str) -> None:
    dtype = blob.dtype_from_name(name)
    assert isinstance(dtype, torch.dtype) and blob.IOBinding.of("x", dtype, (1,), True).dtype == name


def test_unknown_dtype_name_is_refused() -> None:
    with pytest.raises(CompileSpecError, match="unknown dtype name 'complex64'"):
        blob.dtype_from_name("complex64")


def test_compile_spec_bytes() -> None:
    specs = blob.encode_compile_specs({"precision": "fp16", "dynamic_shapes": {"x": {"0": [1, None, 8]}}})
    assert [(s.key, s.value) for s in specs][0] == ("precision", b'"fp16"')
    assert blob.decode_compile_specs(specs) == {"precision": "fp16", "dynamic_shapes": {"x": {"0": [1, None, 8]}}}
    with pytest.raises(CompileSpecError, match="'precision' is not JSON"):
        blob.decode_compile_specs([CompileSpec("precision", b"fp16")])


def test_in_place_outputs_name_their_input() -> None:
    """An output written in place (a KV cache) names the input whose memory it shares; the runner
    refuses a name the engine has no matching input for."""
    from pipeline.runtime.engine_runner import _aliases

    cache = blob.IOBinding("cache", "float16", (1, 2, 8, 4), True)
    meta = blob.BlobMetadata(io_bindings=(cache, blob.IOBinding("output_0", "float16", (1, 2, 8, 4), False, aliases="cache")))
    back, _ = blob.decode(blob.encode(REF, meta))
    assert back.io_bindings == meta.io_bindings and _aliases(back.inputs, back.outputs) == {0: 0}
    assert "aliases" not in json.dumps(META.io_bindings[1].to_json())  # only where there is one
    wrong = blob.IOBinding("output_0", "float32", (1, 2, 8, 4), False, aliases="cache")
    with pytest.raises(BlobFormatError, match="updates input 'cache' in place, but the engine has no input of that"):
        _aliases((cache,), (wrong,))


def _binding(**changes: object) -> dict[str, object]:
    doc: dict[str, object] = {"name": "x", "dtype": "float32", "shape": [-1, 8], "is_input": True, "min": [1, 8],
                              "max": [16, 8]}
    doc.update(changes)
    return doc


@pytest.mark.parametrize("bindings, message", [
    ([_binding(min=[5, 8], max=[2, 8])], "dynamic dim bounded 5..2"),
    ([_binding(min=[-3, 8])], "dynamic dim bounded -3..16"),
    ([_binding(max=[2**62, 8])], "dynamic dim bounded 1..4611686018427387904"),
    ([_binding(min=[1], max=[16])], "bounds of another rank"),
    ([_binding(min=[1, 4], max=[16, 9])], "a static dim is its own bounds"),
    ([_binding(shape=[-5, 8])], "a static dim is its own bounds"),
    ([_binding(), _binding(is_input=False, min=[], max=[])], "every binding needs its own non-empty name"),
    ([_binding(name="")], "every binding needs its own non-empty name"),
    ([_binding(), {"name": "y", "dtype": "float32", "shape": [-1, 8], "is_input": False, "aliases": "nothing"}],
     "aliases 'nothing', which is not an input binding"),
    ([_binding(), {"name": "y", "dtype": "int64", "shape": [-1, 8], "is_input": False, "aliases": "x"}],
     "aliases 'x', which is not an input binding of its dtype"),
    ([_binding(dtype="float128")], "has dtype 'float128'"),
    ([_binding(layout="nhwc")], "has layout 'nhwc': only a 4-D float binding"),
    ([_binding(layout="channels_last")], "has layout 'channels_last': only a 4-D float binding"),
    ([_binding()], "binds no output"),
])
def test_incoherent_metadata_is_refused_whoever_sealed_it(bindings: list[dict[str, object]], message: str) -> None:
    """A forged blob that parses as JSON: the reader checks what its metadata says, not only its form."""
    out = [{"name": "out", "dtype": "float32", "shape": [-1, 4], "is_input": False}]
    doc = {"io_bindings": bindings if any(not b["is_input"] for b in bindings) or "no output" in message
           else bindings + out, "engine_sha256": REF.sha256, "engine_key": REF.key}
    js = json.dumps(doc).encode()
    data = struct.pack("<4sIIIQ8s", b"TR03", 32, len(js), 0, len(ENGINE), b"\x01" + b"\x00" * 7) + js
    with pytest.raises(BlobFormatError, match=message):
        blob.decode(data)
