"""Fuzzing the native readers of untrusted bytes under AddressSanitizer and UndefinedBehaviorSanitizer
(`native/tests/fuzz.cpp`, a short run in CI): delegate blobs, the runner's .npy inputs and the
program record, each from seeds the project and NumPy write. Any memory error, overflow or broken
invariant (a taken dim outside int32, data not the shape's bytes, a refusal of more than one line)
ends the run with a report, and the test fails on it. The parsers' own edge cases (integers past
int64, the most negative one, dims past int32, headers without a shape) are held against the
Python readers one by one."""

from __future__ import annotations

import io
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from pipeline.delegate import blob, record
from pipeline.delegate.tensor_spec import TensorSpec

NATIVE = Path(__file__).resolve().parents[2] / "native"
ITERATIONS = 40_000  # per target: about 10 s each under the sanitizers on the 2-core machine


@pytest.fixture(scope="module")
def fuzz(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("g++") is None:
        pytest.skip("needs g++")
    exe = tmp_path_factory.mktemp("fuzz") / "fuzz"
    sources = [NATIVE / "tests" / "fuzz.cpp", NATIVE / "trt" / "blob.cpp", NATIVE / "trt" / "sha256.cpp",
               NATIVE / "runner" / "npy.cpp", NATIVE / "runner" / "record.cpp"]
    subprocess.run(["g++", "-std=c++17", "-O1", "-g", "-Wall", "-Wextra", "-Werror", "-fsanitize=address,undefined",
                    "-fno-sanitize-recover=all", *map(str, sources), "-o", str(exe)], check=True)
    return exe


def npy_bytes(array: np.ndarray) -> bytes:
    out = io.BytesIO()
    np.save(out, array)
    return out.getvalue()


def seeds(kind: str) -> list[bytes]:
    if kind == "blob":
        bindings = (blob.IOBinding("x", "float16", (-1, 4), True, (1, 4), (8, 4)), blob.IOBinding("cache", "float32", (2, 3), True),
                    blob.IOBinding("y", "float16", (-1, 2), False), blob.IOBinding("cache_out", "float32", (2, 3), False, aliases="cache"))
        return [blob.encode(blob.EngineRef.of(bytes(range(200))), blob.BlobMetadata(io_bindings=bindings))]
    if kind == "npy":
        return [npy_bytes(np.arange(24, dtype=np.float32).reshape(2, 3, 4)), npy_bytes(np.array(7, dtype=np.int64)),
                npy_bytes(np.zeros((5,), dtype=np.float16)), npy_bytes(np.ones((2, 1), dtype=bool))]
    specs = {"decode": [TensorSpec("int64", (1, 1), (1, 1), values=(0, 31999)),
                        TensorSpec("int64", (1,), (1,), end=(0, 1, 128)), None],
             "forward": [TensorSpec("float32", (1, 3, 8, 8), (4, 3, 8, 8))]}
    text = record.placeholder(specs)
    return [text.encode()]


def run(fuzz: Path, kind: str, cases: list[bytes], tmp_path: Path, iterations: int = 0) -> list[str]:
    paths = []
    for i, data in enumerate(cases):
        paths.append(tmp_path / f"{kind}{i}")
        paths[-1].write_bytes(data)
    done = subprocess.run([str(fuzz), kind, str(iterations), *map(str, paths)], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]  # a sanitizer report or a broken invariant ends the run
    return done.stdout.splitlines()


@pytest.mark.parametrize("kind", ["blob", "npy", "record"])
def test_fuzz_target_finds_nothing(fuzz: Path, kind: str, tmp_path: Path) -> None:
    lines = run(fuzz, kind, seeds(kind), tmp_path, ITERATIONS)
    assert set(lines[:-1]) == {"seed OK"}, lines
    words = lines[-1].split()  # "<kind> seeds taken N of M; cases taken T refused R"
    taken, refused = int(words[8]), int(words[10])
    assert taken > 0 and refused > ITERATIONS // 10, lines[-1]  # the mutations reach both sides


def binding_doc(dim: str) -> bytes:
    """A TR03 blob whose first binding's first dim is the literal `dim`."""
    data = seeds("blob")[0]
    meta_offset, meta_size = int.from_bytes(data[4:8], "little"), int.from_bytes(data[8:12], "little")
    js = data[meta_offset:meta_offset + meta_size].replace(b'"shape":[-1,4]', b'"shape":[' + dim.encode() + b",4]", 1)
    return data[:8] + len(js).to_bytes(4, "little") + data[12:meta_offset] + js


def python_takes_blob(data: bytes) -> bool:
    try:
        blob.decode(data)
    except Exception:
        return False
    return True


def test_integers_past_int64_are_refused_as_python_refuses_them(fuzz: Path, tmp_path: Path) -> None:
    dims = ["-1", "18446744073709551617", "18446744073709551615", "9223372036854775808", "-9223372036854775808",
            "9223372036854775807", "2147483648", "99999999999999999999999999"]
    cases = [binding_doc(d) for d in dims]
    lines = run(fuzz, "blob", cases, tmp_path)
    assert lines[:-1] == ["seed OK"] + ["seed ERR"] * (len(dims) - 1)
    assert [python_takes_blob(c) for c in cases] == [True] + [False] * (len(dims) - 1)


def test_npy_headers_are_read_strictly(fuzz: Path, tmp_path: Path) -> None:
    good = npy_bytes(np.arange(6, dtype=np.int64).reshape(2, 3))

    def header(text: str, data: bytes = b"") -> bytes:
        text = text.ljust(117) + "\n"
        return b"\x93NUMPY\x01\x00" + len(text).to_bytes(2, "little") + text.encode() + data

    taken = [good, header("{'descr': '<i8', 'fortran_order': False, 'shape': (2, 3), }", bytes(48)),
             header("{'descr': '<f4', 'fortran_order': False, 'shape': (), }", bytes(4)),
             header("{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }", bytes(4))]
    refused = [header("{'descr': '<f4', 'fortran_order': False, }", bytes(4)),  # no shape: not a scalar
               header("{'descr': '<f4', 'fortran_order': False, 'shape': (1), }", bytes(4)),
               header("{'descr': '<f4', 'fortran_order': False, 'shape': (2147483648,), }"),
               header("{'descr': '<f4', 'fortran_order': False, 'shape': (2147483647, 2147483647, 2147483647), }"),
               header("{'descr': '<f4', 'fortran_order': False, 'shape': (1x,), }", bytes(4)),
               header("{'descr': '<f4', 'fortran_order': False, 'shape': (-1,), }", bytes(4)),
               header("{'descr': '<f4', 'fortran_order': False, 'shape': (1,), 'shape': (1,), }", bytes(4)),
               header("{'descr': '<f4', 'fortran_order': True, 'shape': (1,), }", bytes(4)),
               header("{'descr': '>f4', 'fortran_order': False, 'shape': (1,), }", bytes(4)),
               header("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }", bytes(4)),
               good[:-1], good + b"\x00"]
    assert run(fuzz, "npy", taken + refused, tmp_path)[:-1] == ["seed OK"] * len(taken) + ["seed ERR"] * len(refused)
    for data in taken:
        np.load(io.BytesIO(data))  # NumPy reads what the runner reads
