"""Nothing the pipeline reads runs code: a stage intermediate that asks for unpickling is refused
before torch reads it, and every torch.load inside runs weights-only."""

import io
import json
import os
import pickle
import shutil
import zipfile
from pathlib import Path

import pytest
import torch

from pipeline.errors import ArtifactError
from pipeline.lowering.compile import compile_method
from pipeline.steps.intermediates import load_edge, load_exported, save_exported
from tests.reliability.conftest import linear


class Payload:
    """Unpickling this writes the marker file: proof that code ran."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, (f"touch {self.marker}",))


@pytest.fixture(scope="module")
def pt2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("pt2") / "forward.pt2"
    save_exported(compile_method(linear(0), (torch.randn(2, 8),)), path)
    return path


def _rewrite(src: Path, dst: Path, change: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w") as zout:
        for info in zin.infolist():
            zout.writestr(info.filename, change.get(info.filename, zin.read(info)))
    return dst


def test_intermediate_loads_back(pt2: Path) -> None:
    program = load_exported(pt2)
    assert any("execute_engine" in str(n.target) for n in program.graph.nodes)


def test_weights_flagged_as_pickle_are_refused_before_loading(pt2: Path, tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    with zipfile.ZipFile(pt2) as z:
        config_name = next(n for n in z.namelist() if n.endswith("weights_config.json"))
        config = json.loads(z.read(config_name))
        weight = next(iter(config["config"].values()))
    for meta in config["config"].values():
        meta["use_pickle"] = True
    evil = _rewrite(pt2, tmp_path / "evil.pt2", {
        config_name: json.dumps(config).encode(),
        f"{config_name.split('/')[0]}/data/weights/{weight['path_name']}": pickle.dumps(Payload(marker)),
    })
    with pytest.raises(ArtifactError, match="as a pickle, which the pipeline never unpickles"):
        load_exported(evil)
    assert not marker.exists()


def test_pickled_sample_inputs_do_not_run(pt2: Path, tmp_path: Path) -> None:
    # torch's loader falls back to weights_only=False when a weights-only load of these fails.
    marker = tmp_path / "ran"
    buffer = io.BytesIO()
    torch.save({"x": Payload(marker)}, buffer)
    with zipfile.ZipFile(pt2) as z:
        name = next(n for n in z.namelist() if "sample_inputs" in n)
    evil = _rewrite(pt2, tmp_path / "evil.pt2", {name: buffer.getvalue()})
    with pytest.raises(ArtifactError):
        load_exported(evil)
    assert not marker.exists()


@pytest.mark.parametrize("data", [b"", b"PK\x03\x04 truncated", b"not a zip at all"])
def test_damaged_intermediates_are_one_error(tmp_path: Path, data: bytes) -> None:
    (tmp_path / "forward.pt2").write_bytes(data)
    with pytest.raises(ArtifactError, match="forward.pt2"):
        load_exported(tmp_path / "forward.pt2")
    (tmp_path / "forward.edge").write_bytes(data)
    with pytest.raises(ArtifactError, match="forward.edge"):
        load_edge(["forward"], tmp_path)


def test_edge_loader_is_weights_only(tmp_path: Path) -> None:
    """A real `.edge` archive (one that loads back as written) whose tensors were replaced by a pickle
    that runs code: refused, and the code never runs. The archive is sound up to the tensors, so the
    refusal comes from the weights-only load, not from an earlier check of the archive."""
    from pipeline.steps.intermediates import save_edge
    from tests.helpers import lower

    edge, _ = lower(linear(0), (torch.randn(2, 8),))
    (tmp_path / "good").mkdir()
    save_edge(edge, ["forward"], tmp_path / "good")
    load_edge(["forward"], tmp_path / "good")  # as written, it loads
    archive = tmp_path / "good" / "forward.edge"
    with zipfile.ZipFile(archive) as z:
        pickled = [n for n in z.namelist() if n.endswith(".pt")]
    assert pickled, "the archive has no torch.save'd part"
    marker = tmp_path / "ran"
    buffer = io.BytesIO()
    torch.save({"w": Payload(marker)}, buffer)
    shutil.copytree(tmp_path / "good", tmp_path / "bad")
    _rewrite(archive, tmp_path / "bad" / archive.name, {name: buffer.getvalue() for name in pickled})
    with pytest.raises(ArtifactError):
        load_edge(["forward"], tmp_path / "bad")
    assert not marker.exists()


def test_edge_engines_are_kept_beside_the_program_once(tmp_path: Path) -> None:
    """ExecuTorch's serde would write each engine into the `.edge` JSON as base64, twice: the stage
    writes it beside, by content, once for every method that calls it, and reads it back checked."""
    from pipeline.lowering.export import export
    from pipeline.steps.intermediates import DATA, save_edge

    layer = torch.nn.Linear(640, 640)
    programs = {m: compile_method(layer, (torch.randn(2, 640),), method=m) for m in ("a", "b")}
    manager = export(programs).manager
    (mine,) = [c for _, c in manager.exported_program("a").graph_module.named_children() if hasattr(c, "original_module")]
    engine = bytes(mine.named_data_store_output.buffers[0])
    save_edge(manager, ["a", "b"], tmp_path)
    (stored,) = (tmp_path / DATA).iterdir()  # one engine, both methods'
    assert stored.read_bytes() == engine and all((tmp_path / f"{m}.edge").stat().st_size < len(engine) for m in "ab")
    back = load_edge(["a", "b"], tmp_path)
    for m in "ab":
        (module,) = [c for _, c in back.exported_program(m).graph_module.named_children() if hasattr(c, "original_module")]
        assert bytes(module.named_data_store_output.buffers[0]) == engine
        (constant,) = module.original_module.state_dict.values()
        assert constant.numpy().tobytes() == engine
    assert bytes(mine.named_data_store_output.buffers[0]) == engine  # the caller's program, as it was
    stored.write_bytes(engine[:-1] + b"\0")
    with pytest.raises(ArtifactError, match="is not the data its name says"):
        load_edge(["a"], tmp_path)
