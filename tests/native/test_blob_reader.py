"""The native blob reader (`native/trt/blob.cpp`) against the Python one, under AddressSanitizer and
UndefinedBehaviorSanitizer: blobs the pipeline writes (TR03, and inline TR01/TR02) read the same;
truncations, flipped bits, absurd header sizes and damaged JSON are refused with one line, never a
crash or a read outside the blob; the native reader never takes a blob the Python one refuses."""

from __future__ import annotations

import random
import shutil
import struct
import subprocess
from pathlib import Path
from typing import Any

import pytest
import torch

from pipeline import dtypes
from pipeline.delegate import blob, plan
from pipeline.errors import BlobFormatError
from pipeline.kernels import decode_attention, formats

NATIVE = Path(__file__).resolve().parents[2] / "native"


@pytest.fixture(scope="module")
def reader(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("g++") is None:
        pytest.skip("needs g++")
    exe = tmp_path_factory.mktemp("blob") / "blob_reader"
    sources = [NATIVE / "tests" / "blob_reader.cpp", NATIVE / "trt" / "blob.cpp", NATIVE / "trt" / "sha256.cpp"]
    subprocess.run(["g++", "-std=c++17", "-O1", "-g", "-Wall", "-Wextra", "-Werror", "-fsanitize=address,undefined",
                    "-fno-sanitize-recover=all", *map(str, sources), "-o", str(exe)], check=True)
    return exe


def read_all(reader: Path, blobs: list[bytes], tmp_path: Path) -> list[str]:
    path = tmp_path / "records.bin"
    path.write_bytes(b"".join(struct.pack("<I", len(b)) + b for b in blobs))
    run = subprocess.run([str(reader), str(path)], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-4000:]  # a sanitizer report ends the run with an error
    lines = run.stdout.splitlines()
    assert len(lines) == len(blobs)
    return lines


def meta(aliased: bool = False) -> blob.BlobMetadata:
    bindings = [blob.IOBinding("x", "float16", (-1, 4), True, (1, 4), (8, 4)),
                blob.IOBinding("cache", "float32", (2, 3), True),
                blob.IOBinding("y", "float16", (-1, 2), False),
                blob.IOBinding("cache_out", "float32", (2, 3), False, aliases="cache" if aliased else "")]
    return blob.BlobMetadata(io_bindings=tuple(bindings), tf32_override="")


def inline(magic: bytes, engine: bytes, m: blob.BlobMetadata) -> bytes:
    """An inline-engine blob as the older writers laid it out."""
    doc = blob.encode(blob.EngineRef.of(engine), m)
    _, meta_offset, meta_size, _, _, _ = blob.HEADER.unpack_from(doc)
    js = bytes(doc[meta_offset:meta_offset + meta_size]).replace(b',"engine_key":"tensorrt.engine.' +
                                                                 blob.EngineRef.of(engine).sha256.encode() + b'"', b"")
    eng_offset = -(-(blob.HEADER.size + len(js)) // blob.ALIGN) * blob.ALIGN
    head = blob.HEADER.pack(magic, blob.HEADER.size, len(js), eng_offset, len(engine), b"\x01" + b"\x00" * 7)
    return (head + js).ljust(eng_offset, b"\x00") + engine


def python_refusal(data: bytes, read: Any = blob.decode) -> str:
    """Why the Python reader (`read`: of blobs, or of plans) refuses `data` ("" when it takes it)."""
    try:
        read(data)
    except (BlobFormatError, ValueError, TypeError, KeyError, OverflowError, struct.error) as exc:
        return str(exc) or type(exc).__name__
    return ""


def test_dtypes_are_the_pipelines(reader: Path) -> None:
    """One dtype table: the native reader's names, element sizes and ExecuTorch scalar types are
    pipeline.dtypes'."""
    table = subprocess.run([str(reader), "--dtypes"], capture_output=True, text=True, check=True).stdout.split()[0]
    rows = {name: (int(size), int(code)) for name, size, code in (row.split(":") for row in table.split(","))}
    assert rows == {name: (torch.empty((), dtype=row.torch).element_size(), row.scalar_type)
                    for name, row in dtypes.BY_NAME.items()}


def test_blobs_the_pipeline_writes_read_the_same(reader: Path, tmp_path: Path) -> None:
    engine = bytes(range(256)) * 5
    ref = blob.EngineRef.of(engine)
    blobs = [blob.encode(ref, meta()), blob.encode(ref, meta(aliased=True)), inline(b"TR01", engine, meta()),
             inline(b"TR02", engine, meta(aliased=True)), inline(b"TR01", b"e", meta())]
    blobs += [inline(b"TR01", bytes(range(n)), meta()) for n in (55, 56, 63, 64, 119, 120)]  # every padding case
    for data in blobs:
        assert not python_refusal(data)
    assert read_all(reader, blobs, tmp_path) == [f"OK 4 {ref.key}"] * 2 + ["OK 4 inline"] * 9


def test_damaged_blobs_are_refused_never_read_past(reader: Path, tmp_path: Path) -> None:
    rng = random.Random(0)
    engine = bytes(rng.randrange(256) for _ in range(300))
    seeds = [blob.encode(blob.EngineRef.of(engine), meta(aliased=True)), inline(b"TR02", engine, meta(aliased=True))]
    cases: list[bytes] = []
    for seed in seeds:
        cases += [seed[:n] for n in range(len(seed))]  # every truncation
        for _ in range(1500):  # flipped bits, one to four at a time
            data = bytearray(seed)
            for _ in range(rng.randint(1, 4)):
                data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
            cases.append(bytes(data))
        for field, fmt in ((4, "<I"), (8, "<I"), (12, "<I"), (16, "<Q")):  # absurd header sizes
            for value in (0, 1, 31, 32, len(seed) - 1, len(seed), len(seed) + 1, 2**31, 2**32 - 1,
                          *((2**63, 2**64 - 1) if fmt == "<Q" else ())):
                data = bytearray(seed)
                struct.pack_into(fmt, data, field, value)
                cases.append(bytes(data))
        js_start = blob.HEADER.size
        for _ in range(300):  # JSON bytes replaced by structural characters
            data = bytearray(seed)
            data[js_start + rng.randrange(200)] = ord(rng.choice('{}[]",:-0e\\u'))
            cases.append(bytes(data))
    cases.append(b"TR03" + b"\xff" * 28)
    results = read_all(reader, cases, tmp_path)
    refused = 0
    for data, line in zip(cases, results):
        if line.startswith("OK"):
            why = python_refusal(data)
            assert not why, f"the native reader took a blob the Python reader refuses ({why}): {data!r}"
        else:
            refused += 1
            assert line.startswith("ERR TensorRT blob ") and "\n" not in line
    assert refused > len(cases) // 2


def test_layouts_are_read_and_refused_as_the_pipeline_does(reader: Path, tmp_path: Path) -> None:
    ref = blob.EngineRef.of(bytes(range(256)))

    def held(dtype: str, shape: tuple[int, ...], layout: str = blob.CHANNELS_LAST) -> bytes:
        bindings = (blob.IOBinding("x", dtype, shape, True, layout=layout), blob.IOBinding("y", "float32", (1, 4), False))
        return blob.encode(ref, blob.BlobMetadata(io_bindings=bindings))

    taken, refused = [held("float32", (1, 8, 4, 4)), held("float16", (1, 8, 4, 4))], [
        held("float32", (1, 8)), held("int64", (1, 8, 4, 4)), held("float32", (1, 8, 4, 4), layout="nhwc")]
    lines = read_all(reader, taken + refused, tmp_path)
    assert lines[:2] == [f"OK 2 {ref.key}"] * 2 and not any(map(python_refusal, taken))
    for line, data in zip(lines[2:], refused):
        assert line.startswith("ERR TensorRT blob ") and "has layout" in line and "has layout" in python_refusal(data)


def a_plan() -> bytes:
    """A plan as `lowering/plans.py` writes one: an engine that updates a cache in place and writes an
    activation, then one of the project's kernels reading it into the delegate's output."""
    engine_meta = blob.BlobMetadata((blob.IOBinding("x", "float16", (1, 8), True), blob.IOBinding("cache", "float32", (2, 3), True),
                                     blob.IOBinding("h", "float16", (1, 8), False),
                                     blob.IOBinding("cache_out", "float32", (2, 3), False, aliases="cache")), tf32_override="")
    io = (blob.IOBinding("input_0", "float16", (1, 8), True), blob.IOBinding("input_1", "float32", (2, 3), True),
          blob.IOBinding("output_0", "float16", (1, 4), False),
          blob.IOBinding("output_1", "float32", (2, 3), False, aliases="input_1"))
    module = plan.DataRef.of(b"ptx\0", plan.KERNELS_PREFIX)
    weight = plan.DataRef.of(bytes(64), plan.WEIGHT_PREFIX)
    steps = (plan.EngineStep(engine_meta, blob.EngineRef.of(bytes(range(256))), ("input_0", "input_1"), ("value_0", "input_1")),
             plan.KernelStep("dp_fp16_t1", module, weight, None, None, 4, 8, 0, 1, 128, ("value_0",), ("output_0",)))
    return plan.encode(plan.Plan(io, (blob.IOBinding("value_0", "float16", (1, 8), False),), steps))


def test_plans_read_as_the_pipeline_reads_them_and_damage_is_refused(reader: Path, tmp_path: Path) -> None:
    """The plan contract (`delegate/plan.py`) natively: the plan reads whole; truncations, flipped bits and
    damaged JSON are refused with one line, never a crash or a read outside the blob, and the native
    reader takes no plan the Python one refuses."""
    seed, rng = a_plan(), random.Random(1)
    cases = [seed, *(seed[:n] for n in range(0, len(seed), 3))]
    for _ in range(1500):
        data = bytearray(seed)
        for _ in range(rng.randint(1, 3)):
            data[blob.HEADER.size + rng.randrange(len(seed) - blob.HEADER.size)] ^= 1 << rng.randrange(8)
        cases.append(bytes(data))
    for old, new in ((b'"dp_fp16_t1"', b'"dp_fp16_t2"'), (b'"n":4', b'"n":9'), (b'"inputs":["value_0"]', b'"inputs":["value_9"]'),
                     (b'"block":128', b'"block":4'), (b'"aliases":"input_1"', b'"aliases":"input_0"')):
        assert old in seed
        cases.append(seed.replace(old, new))
    # One warp of 32 lanes for the kernel's 4 rows: enough where a warp computes 4 (the kernels' Format<F>::rows).
    one_warp = [seed.replace(b'"block":128', b'"block":32 ').replace(b'"dp_fp16_t1"', f'"dp_{f}_t1"'.encode().ljust(12))
                for f in formats.FORMATS]  # the same length (JSON's spaces): the header frames it
    results = read_all(reader, cases + one_warp, tmp_path)
    taken = [layout.rows >= 4 for layout in formats.FORMATS.values()]
    assert [line.startswith("OK") for line in results[-len(one_warp):]] == taken, results[-len(one_warp):]
    assert [not python_refusal(data, plan.decode) for data in one_warp] == taken
    results = results[:-len(one_warp)]
    assert results[0] == "OK plan 4 2" and not python_refusal(seed, plan.decode)
    for data, line in zip(cases[1:], results[1:]):
        if line.startswith("OK"):
            why = python_refusal(data, plan.decode)
            assert not why, f"the native reader took a plan the Python reader refuses ({why}): {data!r}"
        else:
            assert line.startswith("ERR TensorRT ") and "\n" not in line
    assert all(line.startswith("ERR") for line in results[-5:])  # a kernel of other tokens, sizes, reads; an alias


def an_attention_plan() -> bytes:
    """A plan as `lowering/plans.py` writes a decode attention: q [1, 4, 1, 8] over a cache of 70 positions
    of 2 K/V heads, a mask, o with its heads merged and the workspace the kernels fill."""
    sizes = decode_attention.sizes((1, 4, 1, 8), (1, 2, 70, 8), (1, 2, 70, 8), (1, 1, 1, 70))
    assert not isinstance(sizes, str)
    io = (blob.IOBinding("input_0", "float16", (1, 4, 1, 8), True), blob.IOBinding("input_1", "float16", (1, 2, 70, 8), True),
          blob.IOBinding("input_2", "float16", (1, 2, 70, 8), True), blob.IOBinding("input_3", "float16", (1, 1, 1, 70), True),
          blob.IOBinding("output_0", "float16", (1, 1, 32), False))
    step = plan.AttentionStep(plan.DataRef.of(b"ptx\0", plan.KERNELS_PREFIX), plan.AttentionStep.bits(8 ** -0.5),
                              ("input_0", "input_1", "input_2", "input_3"), ("output_0", "value_0"))
    return plan.encode(plan.Plan(io, (blob.IOBinding("value_0", "float32", (sizes.workspace,), False),), (step,)))


def test_attention_steps_read_as_the_pipeline_reads_them(reader: Path, tmp_path: Path) -> None:
    """An attention step natively: read whole, its scale exact; a workspace short of what the kernels write,
    a mask for each head, K/V heads that do not divide the query heads, o of other values, a scale that is
    no float32's bits, a value never written and a step of one output are refused by both readers in one
    line; no damaged plan is taken by the native reader alone."""
    seed = an_attention_plan()
    assert plan.decode(seed).steps[0].scale == pytest.approx(8 ** -0.5, rel=1e-7)
    damaged = [seed.replace(old, new.ljust(len(old))) for old, new in (  # the same length: the header frames it
        (b'"shape":[80]', b'"shape":[79]'),  # 2 chunks of 64 positions x 4 query rows x (8 values + 2)
        (b'[1,1,1,70]', b'[1,4,1,70]'), (b'"shape":[1,2,70,8]', b'"shape":[1,3,70,8]'), (b'[1,1,32]', b'[1,1,31]'),
        (b'"scale_bits":1', b'"scale_bits":-'), (b'"input_3"]', b'"input_9"]'),
        (b'"outputs":["output_0","value_0"]', b'"outputs":["output_0"]'))]
    rng, flipped = random.Random(2), []
    for _ in range(400):
        data = bytearray(seed)
        data[blob.HEADER.size + rng.randrange(len(seed) - blob.HEADER.size)] ^= 1 << rng.randrange(8)
        flipped.append(bytes(data))
    lines = read_all(reader, [seed, *damaged, *flipped], tmp_path)
    assert lines[0] == "OK plan 5 1" and not python_refusal(seed, plan.decode)
    for data, line in zip(damaged, lines[1:1 + len(damaged)]):
        assert data != seed and line.startswith("ERR TensorRT plan") and python_refusal(data, plan.decode), (line, data)
    for data, line in zip(flipped, lines[1 + len(damaged):]):
        assert not line.startswith("OK") or not python_refusal(data, plan.decode), data
