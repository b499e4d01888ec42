"""Values from params.yaml never reach DVC's shell: stage commands carry none, so a model name or
a build target written to run code (by `dvc exp run -S`, or by hand in params.yaml) is refused by
the first stage as a name, and nothing runs. The paths each stage writes (`stages/_common.py`
`Layout`) are the outputs `dvc.yaml` declares."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "stages"))
from _common import Layout  # noqa: E402

pytestmark = pytest.mark.skipif(shutil.which("dvc") is None, reason="needs the dvc command")
ENV = {**os.environ, "DVC_NO_ANALYTICS": "1", "PYTHONPATH": str(ROOT)}


@pytest.fixture()
def repo(tmp_path: Path) -> Path:
    for item in ("conf", "stages", "hydra_plugins", "dvc.yaml", ".dvcignore"):
        src = ROOT / item
        shutil.copytree(src, tmp_path / item) if src.is_dir() else shutil.copy(src, tmp_path / item)
    (tmp_path / "pipeline").symlink_to(ROOT / "pipeline")  # a stage dependency; read-only here
    for cmd in (["git", "init", "-q"], ["dvc", "init", "-q"], ["dvc", "config", "hydra.enabled", "True"]):
        subprocess.run(cmd, cwd=tmp_path, check=True, capture_output=True, env=ENV)
    subprocess.run([sys.executable, "-m", "pipeline.config.compose"], cwd=tmp_path, check=True, capture_output=True, env=ENV)
    return tmp_path


def test_no_stage_command_interpolates_a_value() -> None:
    commands = [line for line in (ROOT / "dvc.yaml").read_text().splitlines() if line.strip().startswith("cmd:")]
    assert commands and all("${" not in line for line in commands)


def _hostile(params: Path, **changes: object) -> None:
    doc = yaml.safe_load(params.read_text())
    for key, value in changes.items():
        section, name = key.split(".")
        doc[section][name] = value
    params.write_text(yaml.safe_dump(doc))


NAMES = ["y;touch MARK;#", "$(touch MARK)", "y&&touch MARK"]


@pytest.mark.parametrize("name", NAMES[:2])
def test_a_hostile_model_name_in_params_yaml_runs_nothing(repo: Path, name: str) -> None:
    _hostile(repo / "params.yaml", **{"model.name": name})
    result = subprocess.run(["dvc", "repro"], cwd=repo, capture_output=True, text=True, env=ENV, timeout=300)
    assert result.returncode != 0 and not (repo / "MARK").exists() and not list(repo.rglob("MARK"))
    assert "is not a plain file name" in result.stdout + result.stderr
    assert "Running stage 'compile'" not in result.stdout


@pytest.mark.parametrize("name", ["..", "../stages", "a/b"])
def test_a_name_that_climbs_out_of_build_deletes_nothing(repo: Path, name: str) -> None:
    """DVC removes a stage's outputs before it runs: `build/${model.name}/toolchain.json` with the name
    `..` is the user's `toolchain.json`. DVC itself refuses such output paths when it reads dvc.yaml
    (.dvcignore), before any stage, whatever `dvc repro -s` skips (issue 56); so do target keys."""
    (repo / "toolchain.json").write_text("mine")
    (repo / "compiled").mkdir()
    (repo / "compiled" / "notes.txt").write_text("mine")
    _hostile(repo / "params.yaml", **{"model.name": name})
    for command in (["dvc", "repro"], ["dvc", "repro", "stages/dvc.yaml:toolchain"], ["dvc", "repro", "-s", "compile"],
                    ["dvc", "repro", "-s", "validate"]):
        result = subprocess.run(command, cwd=repo, capture_output=True, text=True, env=ENV, timeout=300)
        assert result.returncode != 0 and "is ignored by .dvcignore" in result.stdout + result.stderr, command
    doc = yaml.safe_load((repo / "params.yaml").read_text())
    doc["model"]["name"], doc["targets"] = "mlp", {"..": {"model": doc["model"], "compile": doc["compile"]}}
    (repo / "params.yaml").write_text(yaml.safe_dump(doc))
    (repo / "matrix").mkdir()
    result = subprocess.run(["dvc", "repro", "-s", "target_compile@.."], cwd=repo, capture_output=True, text=True, env=ENV,
                            timeout=300)
    assert result.returncode != 0 and "is ignored by .dvcignore" in result.stdout + result.stderr
    assert (repo / "toolchain.json").read_text() == "mine" and (repo / "compiled" / "notes.txt").read_text() == "mine"
    scripts = {p.name for p in (ROOT / "stages").glob("*.py")}
    assert {p.name for p in (repo / "stages").glob("*.py")} == scripts  # `../stages`: the scripts are still there


def test_a_hostile_target_key_in_params_yaml_runs_nothing(repo: Path) -> None:
    doc = yaml.safe_load((repo / "params.yaml").read_text())
    doc["targets"] = {"x;touch MARK;#": {"model": doc["model"], "compile": doc["compile"]}}
    (repo / "params.yaml").write_text(yaml.safe_dump(doc))
    result = subprocess.run(["dvc", "repro", "--all-pipelines"], cwd=repo, capture_output=True, text=True, env=ENV,
                            timeout=300)
    assert not list(repo.rglob("MARK")) and result.returncode != 0


@pytest.mark.parametrize("name", NAMES[2:])
def test_exp_run_with_a_hostile_name_runs_nothing(repo: Path, name: str) -> None:
    subprocess.run(["git", "add", "-A"], cwd=repo, check=True, capture_output=True)
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "init"], cwd=repo, check=True,
                   capture_output=True)
    result = subprocess.run(["dvc", "exp", "run", "-S", f"model.name='{name}'"], cwd=repo, capture_output=True, text=True,
                            env=ENV, timeout=300)
    assert result.returncode != 0 and not list(repo.rglob("MARK"))
    assert "Running stage 'compile'" not in result.stdout


def test_each_stage_writes_what_dvc_yaml_declares(repo: Path) -> None:
    from dvc.repo import Repo

    doc = yaml.safe_load((repo / "params.yaml").read_text())
    doc["targets"] = {"t1": {"model": doc["model"], "compile": doc["compile"]}}
    (repo / "params.yaml").write_text(yaml.safe_dump(doc))
    with Repo(str(repo)) as dvc:
        declared = {stage.name: {str(out) for out in stage.outs} for stage in dvc.index.stages}
    for target, build in ((None, "build/mlp"), ("t1", "build/targets/t1")):
        layout = Layout.of(doc, target)
        prefix = "" if target is None else "target_"
        suffix = "" if target is None else f"@{target}"
        assert str(layout.build) == build
        assert declared[f"{prefix}compile{suffix}"] == {f"{layout.build}/compiled", str(layout.timings)}
        assert declared[f"{prefix}validate{suffix}"] == {f"{layout.build}/validation.json", str(layout.metrics),
                                                          str(layout.plot)}
        assert declared[f"{prefix}serialize{suffix}"] == {f"{layout.build}/program", f"{layout.build}/manifest.json"}
        assert declared[f"{prefix}export{suffix}"] == {f"{layout.build}/exported", f"{layout.build}/report.json"}
        assert declared[f"{prefix}transform{suffix}"] == {f"{layout.build}/transformed"}
        assert declared[f"{prefix}toolchain{suffix}"] == {f"{layout.build}/toolchain.json"}
    assert declared["names"] == {"build/names.json"}  # the one output no params value names
