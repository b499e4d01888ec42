"""The declarative pipeline for real: a temporary git + DVC repo, `dvc repro`, `dvc exp run -S`,
the compose command, the toolchain record, and a Hydra multirun sweep."""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(shutil.which("dvc") is None, reason="needs the dvc command")


def _run(cmd: list[str], cwd: Path, **env: str) -> str:
    env = {**os.environ, "DVC_NO_ANALYTICS": "1", **env}
    result = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, env=env, timeout=600)
    assert result.returncode == 0, f"{' '.join(cmd)} failed:\n{result.stdout}\n{result.stderr}"
    return result.stdout + result.stderr


def _stages_run(output: str) -> list[str]:
    # the always-run toolchain stages are in stages/dvc.yaml: DVC names them with their file
    return re.findall(r"Running stage '(?:stages/dvc\.yaml:)?([\w@.-]+)'", output)


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("project")
    for item in ("conf", "stages", "pipeline", "hydra_plugins", "dvc.yaml", "params.yaml", ".dvcignore"):
        src = ROOT / item
        if src.is_dir():
            shutil.copytree(src, path / item, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(src, path / item)
    _run(["git", "init", "-q"], path)
    _run(["dvc", "init", "-q"], path)
    _run(["dvc", "config", "hydra.enabled", "True"], path)
    _run(["git", "add", "-A"], path)
    _run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "init"], path)
    return path


def test_repro_reruns_exactly_what_changed(repo: Path) -> None:
    assert _stages_run(_run(["dvc", "repro"], repo)) == ["names", "toolchain", "compile", "export", "transform",
                                                         "serialize", "validate"]
    out = repo / "build" / "mlp"
    assert "forward" in json.loads((out / "validation.json").read_text())["methods"]
    metrics = json.loads((repo / "metrics.json").read_text())
    assert metrics["engines"] == 1 and metrics["outside"] == 0 and metrics["pte_mb"] > 0.01 and metrics["build_s"] > 0
    assert (out / "program" / "mlp.pte").stat().st_size > 10_000
    assert json.loads((out / "report.json").read_text())["forward"]["num_engines"] == 1
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["files"]["pte"]["sha256"] and manifest["toolchain"]["packages"]["executorch"] == "1.4.1"

    # Nothing changed: only the always-run toolchain record is rewritten (identically), also once
    # Python has written bytecode into pipeline/ (.dvcignore keeps caches out of the stage deps).
    (repo / "pipeline" / "__pycache__").mkdir(exist_ok=True)
    (repo / "pipeline" / "__pycache__" / "steps.cpython-311.pyc").write_bytes(b"changed")
    key = repo / "build" / ".toolchain" / "toolchain" / "key"
    made = key.stat()
    assert _stages_run(_run(["dvc", "repro"], repo)) == ["toolchain"]
    # ... by copying the kept record back, without Python (stages/toolchain.sh): its key is as it was.
    assert (key.stat().st_ino, key.stat().st_mtime_ns) == (made.st_ino, made.st_mtime_ns)
    assert (out / "toolchain.json").read_bytes() == (key.parent / "record.json").read_bytes()
    assert "plots/build.json" in _run(["dvc", "plots", "show", "--json"], repo)

    # A transform change reruns transform; serialize (and validate) follow only when its output
    # changes, and this pass leaves the mlp's programs byte for byte as they were.
    _run([sys.executable, "-m", "pipeline.config.compose", "transforms=dead_code"], repo)
    ran = _stages_run(_run(["dvc", "repro"], repo))
    assert ran[:2] == ["toolchain", "transform"] and set(ran) <= {"toolchain", "transform", "serialize", "validate"}

    # A compile-spec change reruns compile and everything after it.
    _run([sys.executable, "-m", "pipeline.config.compose", "transforms=dead_code", "compile.precision=fp16"], repo)
    assert _stages_run(_run(["dvc", "repro"], repo)) == ["toolchain", "compile", "export", "transform", "serialize",
                                                         "validate"]
    assert json.loads((out / "manifest.json").read_text())["config"]["compile"]["precision"] == "fp16"

    # (A changed toolchain record, and the run-cache bringing back every stage when it changes back:
    # tests/reliability/test_run_cache.py.)

    # Every file of the program directory is an output like the .pte: cached, and restored by checkout.
    # With external data the engine is named data in the .ptd, which the manifest lists with its hash.
    _run([sys.executable, "-m", "pipeline.config.compose", "transforms=dead_code", "compile.precision=fp16",
          "serialize=external", "serialize.etrecord=true"], repo)
    assert "serialize" in _stages_run(_run(["dvc", "repro"], repo))
    program = {p.name: p.read_bytes() for p in (out / "program").iterdir()}
    assert set(program) == {"mlp.pte", "mlp.ptd", "mlp_etrecord.bin"} and len(program["mlp.pte"]) < 16_000
    (entry,) = json.loads((out / "manifest.json").read_text())["named_data"]
    assert entry["file"] == "ptd" and entry["key"] == f"tensorrt.engine.{entry['sha256']}" and entry["bytes"] > 10_000
    shutil.rmtree(out / "program")
    _run(["dvc", "checkout"], repo)
    assert {p.name: p.read_bytes() for p in (out / "program").iterdir()} == program


def test_the_kept_toolchain_record_is_made_again_when_a_package_comes(repo: Path, tmp_path: Path) -> None:
    """stages/toolchain.sh copies the kept record back only while nothing it was made from changed: a
    package installed into a folder of the search path makes it again, with the package in it."""
    _run([sys.executable, "-m", "pipeline.config.compose"], repo)
    site = tmp_path / "site"
    site.mkdir()
    toolchain = ["dvc", "repro", "stages/dvc.yaml:toolchain"]
    _run(toolchain, repo, PYTHONPATH=str(site))  # another environment: made again, and kept
    key = repo / "build" / ".toolchain" / "toolchain" / "key"
    made = key.stat()
    _run(toolchain, repo, PYTHONPATH=str(site))
    assert (key.stat().st_ino, key.stat().st_mtime_ns) == (made.st_ino, made.st_mtime_ns)  # copied back
    record = repo / "build" / "mlp" / "toolchain.json"
    assert "tensorrt_probe" not in json.loads(record.read_text())["packages"]
    (site / "tensorrt_probe-9.9.dist-info").mkdir()
    _run(toolchain, repo, PYTHONPATH=str(site))
    assert json.loads(record.read_text())["packages"]["tensorrt_probe"] == "9.9"


def _commit(repo: Path, message: str) -> None:
    _run(["git", "add", "-A"], repo)
    _run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", message, "--allow-empty"], repo)


def test_exp_run_applies_overrides_and_carries_metrics(repo: Path) -> None:
    _run([sys.executable, "-m", "pipeline.config.compose"], repo)
    _run(["dvc", "repro"], repo)  # a last build of its own: the test must not depend on the tests before it
    _commit(repo, "last build")  # metrics.json and plots/ are tracked, like dvc.lock
    _run(["dvc", "exp", "run", "-S", "compile.optimization_level=1"], repo)
    manifest = json.loads((repo / "build" / "mlp" / "manifest.json").read_text())
    assert manifest["config"]["compile"]["optimization_level"] == 1
    rows = json.loads(subprocess.run(["dvc", "exp", "show", "--json"], cwd=repo, capture_output=True, text=True).stdout)
    experiments = [rev for row in rows for exp in (row.get("experiments") or []) for rev in exp.get("revs", [])]
    metrics = [e["data"]["metrics"]["metrics.json"]["data"] for e in experiments]
    assert metrics and all(m["engines"] == 1 and m["build_s"] > 0 for m in metrics)
    assert "build_s" in _run(["dvc", "metrics", "diff", "--all"], repo)  # two engine-cache hits may take equal seconds
    # Run-dependent columns (timings.json's engine-cache events differ from the last commit's) are dropped.
    table = _run(["dvc", "exp", "show", "--no-pager", "--only-changed", "--drop",
                  "build/.*|timings.json|engine_cache.*|forward|total"], repo, COLUMNS="120")
    assert "optimization_level" in table and max(map(len, table.splitlines())) <= 120


def test_exp_run_never_drops_composed_overrides(repo: Path) -> None:
    _run([sys.executable, "-m", "pipeline.config.compose", "compile.precision=fp16"], repo)
    result = subprocess.run(["dvc", "exp", "run", "-S", "compile.optimization_level=2"], cwd=repo, capture_output=True,
                            text=True, env={**os.environ, "DVC_NO_ANALYTICS": "1"})
    assert result.returncode != 0 and "dropping what `python -m pipeline.config.compose compile.precision=fp16` set" \
        in result.stdout + result.stderr
    assert "Running stage 'compile'" not in result.stdout  # refused at the first stage, before any build


def test_exp_run_validates_the_params_it_composed(repo: Path) -> None:
    """`dvc exp run -S` composes params.yaml itself; its first stage refuses a bad value with the line
    `compose` gives it, before any build."""
    _run([sys.executable, "-m", "pipeline.config.compose"], repo)
    result = subprocess.run(["dvc", "exp", "run", "-S", "compile.precision=int4"], cwd=repo, capture_output=True,
                            text=True, env={**os.environ, "DVC_NO_ANALYTICS": "1"})
    assert result.returncode != 0 and "compile: precision='int4' is not supported" in result.stdout + result.stderr
    assert "Running stage 'compile'" not in result.stdout
    _run([sys.executable, "-m", "pipeline.config.compose"], repo)


def test_weights_are_a_dependency_of_the_build(repo: Path) -> None:
    """`model.weights`: a changed checkpoint rebuilds, a touched one does not, and `dvc exp run -S
    model.weights=...` builds from the file it names (its digest in the manifest)."""
    import torch
    from safetensors.torch import save_file

    from pipeline.models.mlp import MLP
    from pipeline.models.weight_files import digests

    (repo / "weights").mkdir()
    for name, seed in (("a", 5), ("b", 6)):
        torch.manual_seed(seed)
        save_file(MLP().state_dict(), str(repo / "weights" / f"{name}.safetensors"))
    checkpoint = repo / "weights" / "a.safetensors"
    _run([sys.executable, "-m", "pipeline.config.compose", "model.weights=weights/a.safetensors"], repo)
    assert "compile" in _stages_run(_run(["dvc", "repro"], repo))
    manifest = repo / "build" / "mlp" / "manifest.json"
    assert json.loads(manifest.read_text())["weights"]["files"] == digests(checkpoint)
    os.utime(checkpoint)  # touched, not changed: nothing to build
    assert _stages_run(_run(["dvc", "repro"], repo)) == ["toolchain"]
    torch.manual_seed(7)
    save_file(MLP().state_dict(), str(checkpoint))
    assert _stages_run(_run(["dvc", "repro"], repo))[:2] == ["toolchain", "compile"]
    assert json.loads(manifest.read_text())["weights"]["files"] == digests(checkpoint)
    _run([sys.executable, "-m", "pipeline.config.compose"], repo)  # an experiment from the defaults
    _commit(repo, "weights")
    _run(["dvc", "exp", "run", "-S", "model.weights=weights/b.safetensors"], repo)
    assert json.loads(manifest.read_text())["weights"] == {"path": "weights/b.safetensors",
                                                           "files": digests(repo / "weights" / "b.safetensors")}
    _run([sys.executable, "-m", "pipeline.config.compose"], repo)


def test_hydra_multirun_sweep(tmp_path: Path) -> None:
    _run([sys.executable, "-m", "pipeline", "-m", "compile.precision=fp32,fp16", f"hydra.sweep.dir={tmp_path}"], ROOT)
    outputs = sorted(tmp_path.glob("*/program/mlp.pte"))
    assert len(outputs) == 2 and outputs[0].read_bytes() != outputs[1].read_bytes()
    for pte in outputs:
        manifest = json.loads((pte.parent.parent / "manifest.json").read_text())
        assert manifest["files"]["pte"]["bytes"] == pte.stat().st_size
    precisions = {json.loads((p.parent.parent / "params.json").read_text())["compile"]["precision"] for p in outputs}
    assert precisions == {"fp32", "fp16"}


def test_bad_config_fails_before_any_build(repo: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "pipeline.config.compose", "partitioners=tensorrt_xnnpack",
                             "++partitioners.chain.0.name=xnnpack"], cwd=repo, capture_output=True, text=True)
    assert result.returncode != 0 and "must start with `- name: tensorrt`" in result.stderr


STEPS = ("compile", "export", "transform", "serialize", "validate")


def test_build_matrix_builds_every_target_and_rebuilds_a_changed_one_alone(repo: Path) -> None:
    """Targets: mlp in fp16, and the two small decoders of `matrix=decoders` (prefill and decode,
    one engine each, nothing left outside TensorRT; llama_tiny's engine has a one-token profile)."""
    targets = ["matrix=decoders", "+model@targets.a.model=mlp", "+compile@targets.a.compile=fp16"]
    _run([sys.executable, "-m", "pipeline.config.compose", *targets], repo)
    names = ("a", "llama_tiny", "qwen2_tiny")
    ran = [s for s in _stages_run(_run(["dvc", "repro"], repo)) if "@" in s]
    assert sorted(ran) == sorted(f"target_{step}@{t}" for step in ("toolchain", *STEPS) for t in names)
    for target, precision in (("a", "fp16"), ("llama_tiny", "fp32"), ("qwen2_tiny", "fp32")):
        assert json.loads((repo / "matrix" / target / "metrics.json").read_text())["engines"] == 1
        manifest = json.loads((repo / "build" / "targets" / target / "manifest.json").read_text())
        assert manifest["config"]["compile"]["precision"] == precision and manifest["config"]["targets"] == {}
    for target, profiles in (("llama_tiny", 2), ("qwen2_tiny", 1)):
        report = json.loads((repo / "build" / "targets" / target / "report.json").read_text())
        assert {m: (r["num_engines"], r["left_over"], [e["profiles"] for e in r["engines"]])
                for m, r in report.items()} == {"prefill": (1, [], [profiles]), "decode": (1, [], [profiles])}
    shown = _run(["dvc", "metrics", "show"], repo)
    assert "matrix/a/metrics.json" in shown and "matrix/qwen2_tiny/metrics.json" in shown
    assert "matrix/a/plot.json" in _run(["dvc", "plots", "show", "--json"], repo)

    _run([sys.executable, "-m", "pipeline.config.compose", *targets, "targets.a.compile.optimization_level=1"], repo)
    ran = [s for s in _stages_run(_run(["dvc", "repro"], repo)) if "@" in s and not s.startswith("target_toolchain")]
    assert ran == [f"target_{step}@a" for step in STEPS]
