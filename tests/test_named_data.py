"""Engines as named data (`export.write_program` writes, `pte.read` reads): every engine is an entry
of the program's named data under its content key, stored once, in the `.ptd` with external data
(the `.pte` keeps kilobytes) or as `.pte` segments without; read back as views of the mapped files;
and the layout is ExecuTorch's own, as its runtime and serializers read it."""

import mmap
from pathlib import Path
from typing import Any

import pytest
import torch
from executorch.exir._serialize._cord import Cord
from executorch.exir._serialize._program import deserialize_pte_binary
from executorch.extension.flat_tensor.serialize.serialize import FlatTensorSerializer

from pipeline import dtypes
from pipeline.config.compose import compose, typed
from pipeline.delegate import blob, pte, record
from pipeline.engine.compile_spec import TensorRTCompileSpec
from pipeline.errors import BlobFormatError, ExportError
from pipeline.executorch_api import load_module
from pipeline.lowering.compile import compile_method
from pipeline.lowering.export import stage
from pipeline.lowering.serialize import save
from pipeline.runtime import load
from pipeline.steps import run_all


class Block(torch.nn.Module):
    def __init__(self, seed: int, features: int = 64) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.a, self.b = torch.nn.Linear(features, 128), torch.nn.Linear(128, features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.relu(self.a(x)))


class Split(torch.nn.Module):
    """Two engines around a portable `cumsum` (kept out of TensorRT) whose weight-free kernel sits between them, and a
    constant the portable part reads: a `.ptd` then holds both engines and that tensor."""

    def __init__(self) -> None:
        super().__init__()
        self.first, self.second = Block(1), Block(2)
        self.register_buffer("offset", torch.linspace(0, 1, 64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.second(torch.cumsum(self.first(x), dim=1) * self.offset)


X = torch.randn(4, 64, generator=torch.Generator().manual_seed(0))


@pytest.fixture(scope="module")
def programs() -> dict[str, Any]:
    """`forward` and `again` call one engine (one compile, staged twice); `head` another."""
    spec = TensorRTCompileSpec()
    forward = compile_method(Block(0), (X,), spec, method="forward")
    return {"forward": forward, "again": stage(forward), "head": compile_method(Block(3), (X,), spec, method="head")}


@pytest.fixture(scope="module")
def written(programs: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> dict[bool, dict[str, Path]]:
    out = tmp_path_factory.mktemp("named")
    return {external: save(programs, out / ("ext" if external else "in") / "p.pte", external_data=external)
            for external in (False, True)}


def _keys(file: pte.ProgramFile) -> dict[str, list[str]]:
    """Engine key per TensorRT delegate call, by method."""
    out: dict[str, list[str]] = {}
    for call in pte.delegate_calls(file.program):
        out.setdefault(call.method, []).append(str(blob.decode(call.payload)[1].key))
    return out


@pytest.mark.parametrize("external", [True, False], ids=["ptd", "pte"])
def test_each_engine_is_stored_once_under_its_content_key(written: dict[bool, dict[str, Path]], external: bool) -> None:
    files = written[external]
    file = pte.read(files["pte"], files.get("ptd"))
    keys = _keys(file)
    assert keys["forward"] == keys["again"] != keys["head"]
    entries = pte.named_entries(file)
    assert [e["key"] for e in entries] == sorted({keys["forward"][0], keys["head"][0]})
    assert all(e["key"] == blob.KEY_PREFIX + e["sha256"] for e in entries)
    assert {e["file"] for e in entries} == {"ptd" if external else "pte"}
    assert ("ptd" in files) == external
    stored = files["ptd" if external else "pte"].stat().st_size
    assert sum(e["bytes"] for e in entries) < stored < sum(e["bytes"] for e in entries) + 64_000


def test_pte_keeps_kilobytes_with_external_data(written: dict[bool, dict[str, Path]]) -> None:
    assert written[True]["pte"].stat().st_size < 16_000 < written[False]["pte"].stat().st_size


@pytest.mark.parametrize("model", ["mlp", "tiny_decoder"])
def test_zoo_pte_keeps_kilobytes_with_external_data(model: str, tmp_path: Path) -> None:
    cfg = typed(compose([f"model={model}", "serialize=external"]))
    files = run_all(cfg, tmp_path)  # type: ignore[arg-type]
    assert files["pte"].stat().st_size < 64_000 and files["ptd"].stat().st_size > 10 * files["pte"].stat().st_size
    assert {e["file"] for e in pte.named_entries(pte.read(files["pte"], files["ptd"]))} == {"ptd"}


def test_engines_and_weights_share_one_ptd(tmp_path: Path) -> None:
    program = compile_method(Split(), (X,), TensorRTCompileSpec(torch_executed_ops=("aten.cumsum",)))
    files = save(program, tmp_path / "split.pte", external_data=True)
    file = pte.read(files["pte"], files["ptd"])
    engines = [e for e in pte.named_entries(file) if blob.is_engine_key(e["key"])]
    assert len(engines) == 2 and len(file.named) > 2 and set(file.sources.values()) == {"ptd"}


def test_engines_are_views_of_the_mapped_file(written: dict[bool, dict[str, Path]]) -> None:
    for files in written.values():
        file = pte.read(files["pte"], files.get("ptd"))
        (call, *_) = pte.delegate_calls(file.program)
        _, engine = pte.engine(file, call.payload)
        assert isinstance(engine, memoryview) and isinstance(engine.obj, mmap.mmap), "the engine was copied"


def test_sizes_past_4_gb_round_trip_in_the_blob() -> None:
    ref = blob.EngineRef("ab" * 32, 5 << 30, blob.KEY_PREFIX + "ab" * 32)
    meta = blob.BlobMetadata(io_bindings=(blob.IOBinding("x", "float32", (4,), True), blob.IOBinding("y", "float32", (4,), False)))
    assert blob.decode(blob.encode(ref, meta))[1] == ref


def test_unknown_layout_in_a_program_is_refused(written: dict[bool, dict[str, Path]], tmp_path: Path) -> None:
    data = bytearray(written[True]["pte"].read_bytes())
    at = data.find(b"TR03")
    data[at : at + 4] = b"TR07"
    data[data.find(record.PREFIX)] ^= 1  # a program of another writer: no record vouches for it
    path = tmp_path / "p.pte"
    path.write_bytes(bytes(data))
    with pytest.raises(BlobFormatError, match="magic is b'TR07': a layout this version does not implement"):
        load(path, written[True]["ptd"], verify=False)


def test_executorch_reads_the_program_with_its_data(written: dict[bool, dict[str, Path]]) -> None:
    """ExecuTorch's runtime loads the program with its `.ptd` (data map included), runs its record,
    gives every method's metadata, and stops only at the TensorRT backend it has not registered;
    ExecuTorch's serializers find every engine key the blobs name."""
    files = written[True]
    module = load_module(str(files["pte"]), str(files["ptd"]))
    assert set(module.method_names()) == {"forward", "again", "head", record.METHOD}
    (text,) = module.run_method(record.METHOD, [])
    assert text.startswith(record.PREFIX.decode()) and record.sha256(files["ptd"].read_bytes()) in text
    meta = module.method_meta("forward")
    assert meta.num_inputs() == 1 and list(meta.input_tensor_meta(0).sizes()) == [4, 64]
    with pytest.raises(RuntimeError, match="Failed to execute method forward"):
        module.run_method("forward", [X])  # "Backend TensorRTBackend is not registered"
    ptd_keys = set(FlatTensorSerializer().deserialize(Cord(files["ptd"].read_bytes())).named_data)
    file = pte.read(files["pte"], files["ptd"])
    assert {k for keys in _keys(file).values() for k in keys} == ptd_keys
    inside = deserialize_pte_binary(written[False]["pte"].read_bytes()).named_data
    assert inside is not None and set(inside.pte_data) == ptd_keys


class Table(torch.nn.Module):
    def __init__(self, table: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("table", table)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.table


def test_one_name_never_holds_two_methods_different_data(tmp_path: Path) -> None:
    """A program stores constants by name for all its methods: one name with different data in two
    methods would have one read the other's (it did: the compile step's folded constants were
    numbered per method). The compile step names what it makes by content; a clash from elsewhere
    is refused before anything is written."""
    x = torch.randn(4)
    clash = {"a": torch.export.export(Table(torch.zeros(4)), (x,)), "b": torch.export.export(Table(torch.ones(4)), (x,))}
    with pytest.raises(ExportError, match="constant 'table' holds different data in methods 'a' and 'b'"):
        save(clash, tmp_path / "clash.pte", external_data=True)
    cfg = typed(compose(["model=llama_tiny", "serialize=external", "cache=off",  # decode its own engine
                                          "model.kwargs.num_hidden_layers=1",
                                          "model.methods.decode={function:step,inputs:[{shape:[1,1],dtype:int64},"
                                          "{shape:[1],dtype:int64}],dims:{},dynamic:{}}"]))
    files = run_all(cfg, tmp_path / "llama")  # type: ignore[arg-type]
    file = pte.read(files["pte"], files["ptd"])
    for plan in file.program.execution_plan:
        for value in plan.values:
            info = getattr(value.val, "extra_tensor_info", None)
            name = getattr(info, "fully_qualified_name", None)
            if name and int(getattr(info.location, "value", 0)) == 1:  # external: one .ptd entry per name
                size = torch.empty([int(s) for s in value.val.sizes], dtype=dtypes.of_scalar_type(value.val.scalar_type).torch)
                assert len(file.named[name]) == size.numel() * size.element_size(), (plan.name, name)
