"""Artifacts prove what they are: `load` checks the `.pte` (identifier, header, segment bounds, its
digest), every TensorRT blob (header, engine checksum), and that the `.ptd` is the one the `.pte`
was written with. Every malformed file is one `ArtifactError` naming the file."""

import shutil
from pathlib import Path

import pytest
import torch
from executorch.exir import to_edge_transform_and_lower

from pipeline.delegate import pte, record
from pipeline.errors import ArtifactError, BlobFormatError
from pipeline.runtime import load
from tests.reliability.conftest import linear, portable


def _copy(files: dict[str, Path], tmp_path: Path) -> dict[str, Path]:
    return {k: Path(shutil.copy(p, tmp_path / p.name)) for k, p in files.items()}


def _flip(path: Path, offset: int, count: int) -> None:
    data = bytearray(path.read_bytes())
    for i in range(offset, offset + count):
        data[i] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("other", [{"seed": 1}, {"features": 12}])
def test_ptd_of_another_build_is_refused(portable_files: dict[str, Path], tmp_path: Path, other: dict[str, int]) -> None:
    foreign = portable(tmp_path / "other.pte", **other)
    with pytest.raises(ArtifactError, match=r"other.ptd is not the .ptd that lin.pte was written with"):
        load(portable_files["pte"], foreign["ptd"])


def test_missing_and_unexpected_ptd_are_refused(portable_files: dict[str, Path], trt_files: dict[str, Path]) -> None:
    with pytest.raises(ArtifactError, match="keeps its tensor data in a .ptd file"):
        load(portable_files["pte"])
    with pytest.raises(ArtifactError, match="was written without external data"):
        load(trt_files["pte"], portable_files["ptd"])


def _flip_engine(files: dict[str, Path]) -> None:
    file = pte.read(files["pte"], files.get("ptd"))
    (call,) = pte.delegate_calls(file.program)
    engine = bytes(pte.engine(file, call.payload)[1])
    where = files["ptd" if "ptd" in files else "pte"]
    _flip(where, where.read_bytes().find(engine[1000:1064]), 64)


@pytest.mark.parametrize("external", [False, True], ids=["in-pte", "in-ptd"])
def test_flipped_engine_bytes_are_refused(trt_files: dict[str, Path], trt_external_files: dict[str, Path],
                                          tmp_path: Path, external: bool) -> None:
    files = _copy(trt_external_files if external else trt_files, tmp_path)
    _flip_engine(files)
    message = "trt.ptd is not the .ptd that trt.pte was written with" if external else "trt.pte is corrupt"
    with pytest.raises(ArtifactError, match=message):
        load(files["pte"], files.get("ptd"))


def test_engine_checksum_is_checked_without_a_record(trt_files: dict[str, Path], tmp_path: Path) -> None:
    files = _copy(trt_files, tmp_path)
    _flip_engine(files)
    data = bytearray(files["pte"].read_bytes())
    at = data.find(record.PREFIX)
    data[at : at + len(record.PREFIX)] = b"x" * len(record.PREFIX)  # no longer a pipeline record
    files["pte"].write_bytes(bytes(data))
    with pytest.raises(BlobFormatError, match="does not match its checksum"):
        load(files["pte"], verify=False)


@pytest.mark.parametrize("offset, value, message", [
    (4, b"XX12", "is not an ExecuTorch program"),
    (4, b"ET13", "is corrupt"),
    (8, b"eh01", "is corrupt"),
])
def test_changed_identifiers_are_refused(trt_files: dict[str, Path], tmp_path: Path, offset: int, value: bytes,
                                         message: str) -> None:
    files = _copy(trt_files, tmp_path)
    data = bytearray(files["pte"].read_bytes())
    data[offset : offset + len(value)] = value
    files["pte"].write_bytes(bytes(data))
    with pytest.raises(ArtifactError, match=message):
        load(files["pte"])


@pytest.mark.parametrize("which, cut", [("pte", 0.5), ("pte", 0.0), ("pte", 0.01), ("ptd", 0.5), ("ptd", 0.0)])
def test_truncated_and_empty_files_are_refused(portable_files: dict[str, Path], tmp_path: Path, which: str,
                                               cut: float) -> None:
    files = _copy(portable_files, tmp_path)
    data = files[which].read_bytes()
    files[which].write_bytes(data[: int(len(data) * cut)])
    with pytest.raises(ArtifactError, match=files[which].name):
        load(files["pte"], files["ptd"])


def test_flipped_ptd_bytes_are_refused(portable_files: dict[str, Path], tmp_path: Path) -> None:
    files = _copy(portable_files, tmp_path)
    _flip(files["ptd"], files["ptd"].stat().st_size // 2, 8)
    with pytest.raises(ArtifactError, match="lin.ptd is not the .ptd that lin.pte was written with"):
        load(files["pte"], files["ptd"])


def test_programs_without_a_record_need_verify_false(tmp_path: Path) -> None:
    ep = torch.export.export(linear(0), (torch.randn(2, 8),))
    path = tmp_path / "plain.pte"
    path.write_bytes(to_edge_transform_and_lower(ep).to_executorch().buffer)
    with pytest.raises(ArtifactError, match="has no pipeline program record"):
        load(path)
    x = torch.randn(2, 8)
    torch.testing.assert_close(load(path, verify=False).method("forward").execute([x])[0], linear(0)(x))


def test_missing_file_is_one_error(tmp_path: Path) -> None:
    with pytest.raises(ArtifactError, match="cannot read .*nothing.pte"):
        load(tmp_path / "nothing.pte")


def test_executorch_loads_our_programs_with_their_data(portable_files: dict[str, Path]) -> None:
    from pipeline.executorch_api import load_module

    module = load_module(str(portable_files["pte"]), str(portable_files["ptd"]))
    x = torch.randn(3, 8)
    torch.testing.assert_close(module.forward([x])[0], linear(0)(x))
    torch.testing.assert_close(load(portable_files["pte"], portable_files["ptd"]).method("forward").execute([x])[0],
                               module.forward([x])[0])
