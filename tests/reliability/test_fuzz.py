"""Fuzzing the readers: every truncation, bit flip or random rewrite of a `.pte`, `.ptd` or TensorRT
blob either reads back as the same program or raises our `ArtifactError`; no other exception, and
no native tool (flatc) is ever handed a damaged file. A blob on its own either fails or names its
engine unchanged."""

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.delegate import blob, pte
from pipeline.errors import ArtifactError

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)


@st.composite
def mutations(draw: st.DrawFn, size: int) -> tuple[str, int, int, bytes]:
    kind = draw(st.sampled_from(["truncate", "flip", "overwrite", "random"]))
    at = draw(st.integers(0, max(size - 1, 0)))
    bit = draw(st.integers(0, 7))
    junk = draw(st.binary(min_size=1, max_size=64))
    return kind, at, bit, junk


def _mutate(data: bytes, mutation: tuple[str, int, int, bytes]) -> bytes:
    kind, at, bit, junk = mutation
    if kind == "truncate":
        return data[:at]
    if kind == "flip":
        out = bytearray(data)
        out[at] ^= 1 << bit
        return bytes(out)
    if kind == "overwrite":
        return data[:at] + junk + data[at + len(junk):]
    return junk * (1 + at % 50)


def _same_or_our_error(files: dict[str, Path], tmp_path: Path, which: str, mutation: tuple[str, int, int, bytes],
                       original: pte.ProgramFile) -> None:
    damaged = {k: tmp_path / p.name for k, p in files.items()}
    for kind, path in files.items():
        data = path.read_bytes()
        damaged[kind].write_bytes(_mutate(data, mutation) if kind == which else data)
    try:
        loaded = pte.read(damaged["pte"], damaged.get("ptd"))
    except ArtifactError as exc:
        assert str(damaged[which].name) in str(exc) or which == "ptd"
        return
    assert loaded.program == original.program and loaded.named == original.named


@pytest.mark.parametrize("which", ["pte", "ptd"])
def test_portable_program_files(portable_files: dict[str, Path], tmp_path_factory: pytest.TempPathFactory,
                                which: str) -> None:
    original = pte.read(portable_files["pte"], portable_files["ptd"])
    tmp = tmp_path_factory.mktemp("fuzz")

    @SETTINGS
    @given(mutations(portable_files[which].stat().st_size))
    def run(mutation: tuple[str, int, int, bytes]) -> None:
        _same_or_our_error(portable_files, tmp, which, mutation, original)

    run()


@pytest.mark.parametrize("layout, which", [("in-pte", "pte"), ("in-ptd", "ptd")])
def test_tensorrt_program_files(trt_files: dict[str, Path], trt_external_files: dict[str, Path],
                                tmp_path_factory: pytest.TempPathFactory, layout: str, which: str) -> None:
    files = trt_files if layout == "in-pte" else trt_external_files
    original = pte.read(files["pte"], files.get("ptd"))
    tmp = tmp_path_factory.mktemp("fuzz")

    @SETTINGS
    @given(mutations(files[which].stat().st_size))
    def run(mutation: tuple[str, int, int, bytes]) -> None:
        _same_or_our_error(files, tmp, which, mutation, original)

    run()


def test_tensorrt_blob(trt_files: dict[str, Path]) -> None:
    file = pte.read(trt_files["pte"])
    (call,) = pte.delegate_calls(file.program)
    _, original = blob.decode(call.payload)

    @SETTINGS
    @given(mutations(len(call.payload)))
    def run(mutation: tuple[str, int, int, bytes]) -> None:
        try:
            _, ref = blob.decode(_mutate(call.payload, mutation))
            engine = blob.engine_bytes(ref, file.named, checked=True)
        except ArtifactError:
            return
        # What the blob names is covered by its key's digest and by the size of the named entry
        # (its metadata, by the .pte's digest around it).
        assert ref == original and engine == pte.engine(file, call.payload)[1]

    run()
