"""Files built to hurt the reader rather than damaged by accident: a flatbuffer whose tables are
shared many times (kilobytes that would unpack into millions of objects), a huge sparse file, a
FIFO in place of a program, and programs read without a record (`verify=False`) then fuzzed through
`pipeline.runtime`: each is one `ArtifactError` (or a correct result), quickly, with bounded memory."""

import os
import resource
import time
from pathlib import Path
from typing import Any

import flatbuffers
import pytest
import torch
from executorch.exir._serialize.generated.executorch_flatbuffer import Chain, ExecutionPlan, Instruction, Program
from hypothesis import HealthCheck, given, settings

from pipeline.config.compose import read_params
from pipeline.delegate import pte, record
from pipeline.errors import ArtifactError, ConfigError, PipelineError
from pipeline.runtime import load
from tests.reliability.test_fuzz import _mutate, mutations


def _shared_tables(n: int) -> bytes:
    """A Program of n plans that are all one table, of n chains all one table, of n instructions all
    one table: a few kilobytes, n**3 objects once unpacked as a tree."""
    b = flatbuffers.Builder(1024)
    Instruction.Start(b)
    instructions = _repeated(b, Chain.StartInstructionsVector, Instruction.End(b), n)
    Chain.Start(b)
    Chain.AddInstructions(b, instructions)
    chains = _repeated(b, ExecutionPlan.StartChainsVector, Chain.End(b), n)
    name = b.CreateString("forward")
    ExecutionPlan.Start(b)
    ExecutionPlan.AddName(b, name)
    ExecutionPlan.AddChains(b, chains)
    plans = _repeated(b, Program.StartExecutionPlanVector, ExecutionPlan.End(b), n)
    Program.Start(b)
    Program.AddExecutionPlan(b, plans)
    b.Finish(Program.End(b), file_identifier=b"ET12")
    return bytes(b.Output())


def _repeated(b: flatbuffers.Builder, start: Any, table: int, n: int) -> int:
    """A vector of n offsets to one table."""
    start(b, n)
    for _ in range(n):
        b.PrependUOffsetTRelative(table)
    return int(b.EndVector())


def test_shared_tables_are_refused_at_once(tmp_path: Path) -> None:
    path = tmp_path / "dag.pte"
    path.write_bytes(_shared_tables(300))  # 27 million tables unpacked as a tree
    assert path.stat().st_size < 8000
    start = time.perf_counter()
    with pytest.raises(ArtifactError, match="unpacks into more objects than it could hold as a tree"):
        pte.read(path, verify=False)
    assert time.perf_counter() - start < 10


def test_shared_tables_with_a_resealed_record_are_refused(tmp_path: Path, portable_files: dict[str, Path]) -> None:
    """The forger appends a record and seals it, so that the digest check passes."""
    text = record.placeholder({"forward": []}).encode()
    data = _shared_tables(300) + len(text).to_bytes(4, "little") + text
    path = tmp_path / "dag.pte"
    path.write_bytes(record.seal(data, None))
    assert record.verify(path.read_bytes(), str(path)) is not None
    with pytest.raises(ArtifactError, match="unpacks into more objects"):
        pte.read(path)


def test_a_huge_sparse_file_is_refused_without_reading_it(tmp_path: Path) -> None:
    path = tmp_path / "huge.pte"
    with open(path, "wb") as f:
        f.write(b"\x00" * 4 + b"ET12")
        f.truncate(3 << 30)  # 3 GiB, almost all a hole
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(ArtifactError, match="more than a flatbuffer can hold"):
        pte.read(path, verify=False)
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 200_000  # KiB: nothing was copied


def test_a_ptd_whose_index_claims_gigabytes_is_refused_without_reading_it(tmp_path: Path,
                                                                        portable_files: dict[str, Path]) -> None:
    head = bytearray(portable_files["ptd"].read_bytes()[:48])  # root offset, b"FT01", then the b"FH01" header
    head[24:32] = (3 << 30).to_bytes(8, "little")  # flatbuffer_size: 3 GiB
    head[32:48] = bytes(16)  # no segments
    path = tmp_path / "huge.ptd"
    with open(path, "wb") as f:
        f.write(bytes(head))
        f.truncate(4 << 30)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(ArtifactError, match="its index is 3221225472 bytes"):
        pte.parse_ptd(pte.map_file(path), str(path))
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 200_000


@pytest.mark.parametrize("verify", [True, False])
def test_a_fifo_is_refused_without_blocking(tmp_path: Path, portable_files: dict[str, Path], verify: bool) -> None:
    fifo = tmp_path / "program.pte"
    os.mkfifo(fifo)
    with pytest.raises(ArtifactError, match="is not a regular file"):
        load(fifo, verify=verify)
    with pytest.raises(ArtifactError, match="is not a regular file"):
        load(portable_files["pte"], fifo)
    with pytest.raises(ArtifactError, match="is not a regular file"):
        load(tmp_path, verify=verify)
    params = tmp_path / "params.yaml"
    os.mkfifo(params)
    with pytest.raises(ConfigError, match="params.yaml is not a regular file"):
        read_params(params)


@pytest.fixture(scope="module")
def unrecorded(tmp_path_factory: pytest.TempPathFactory, portable_files: dict[str, Path]) -> Path:
    """The portable program with its record cut out: read only with verify=False, as other tools' files."""
    data = bytearray(portable_files["pte"].read_bytes())
    at = bytes(data).find(record.PREFIX)
    data[at : at + len(record.PREFIX)] = b"x" * len(record.PREFIX)
    path = tmp_path_factory.mktemp("unrecorded") / "lin.pte"
    path.write_bytes(bytes(data))
    return path


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(mutation=mutations(4000))
def test_unrecorded_programs_fuzzed_through_the_runtime(unrecorded: Path, portable_files: dict[str, Path],
                                                        tmp_path_factory: pytest.TempPathFactory,
                                                        mutation: tuple[str, int, int, bytes]) -> None:
    path = tmp_path_factory.mktemp("fuzz") / "lin.pte"
    data = unrecorded.read_bytes()
    kind, at, bit, junk = mutation
    path.write_bytes(_mutate(data, (kind, at % len(data), bit, junk)))
    x = torch.randn(2, 8)
    try:
        program = load(path, portable_files["ptd"], verify=False, device="cpu")
        for name in program.method_names:
            program.method(name).execute([x])
    except PipelineError:  # ArtifactError for the structure, InputError, RuntimeUnavailableError for what it asks
        return
