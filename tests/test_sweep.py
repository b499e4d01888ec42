"""Sweeps for real: Hydra multirun with the joblib launcher (parallel jobs on this machine) and the
Ray launcher against a real local Ray cluster, each ending in one summary table of its jobs; a sweep
run again takes every engine from the shared engine cache; the autotune's objective, and its refusal
where no GPU can measure."""

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from pipeline.sweep import PENALTY, markdown, objective, rows
from tests.helpers import GPU

ROOT = Path(__file__).resolve().parents[1]


def _sweep(tmp: Path, name: str, *overrides: str) -> list[dict]:
    cmd = [sys.executable, "-m", "pipeline", "-m", *overrides, f"cache.url={tmp / 'engines'}", f"hydra.sweep.dir={tmp / name}"]
    result = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    table = json.loads((tmp / name / "summary.json").read_text())
    assert (tmp / name / "summary.md").read_text() == markdown(rows(tmp / name))
    assert markdown(rows(tmp / name)).rstrip("\n") in result.stdout + result.stderr  # the table, on the console
    return table


@pytest.mark.slow
def test_joblib_sweep_runs_jobs_side_by_side(tmp_path: Path) -> None:
    table = _sweep(tmp_path, "joblib", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2", "compile.precision=fp32,fp16")
    assert [(r["job"], r["overrides"], r["status"]) for r in table] == [
        (0, "compile.precision=fp32", "done"), (1, "compile.precision=fp16", "done")]
    assert all(r["engines"] == 1 and r["cache_hits"] == 0 and r["pte_mb"] > 0 for r in table)
    logs = [(tmp_path / "joblib" / str(i) / "__main__.log").read_text() for i in (0, 1)]
    assert all("wrote" in log for log in logs)


@pytest.fixture(scope="module")
def ray_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    pytest.importorskip("hydra_plugins.hydra_ray_launcher", exc_type=ImportError)
    ray = shutil.which("ray")
    if ray is None:
        pytest.skip("needs the ray command")
    temp = tmp_path_factory.mktemp("ray")
    started = subprocess.run([ray, "start", "--head", "--num-cpus=2", "--include-dashboard=false",
                              "--disable-usage-stats", f"--temp-dir={temp}"], capture_output=True, text=True, timeout=300)
    assert started.returncode == 0, started.stdout + started.stderr
    try:
        yield "auto"
    finally:
        subprocess.run([ray, "stop", "--force"], capture_output=True, timeout=120)


@pytest.mark.slow
def test_ray_sweep_on_a_local_cluster_shares_engines(ray_cluster: str, tmp_path: Path) -> None:
    overrides = ("hydra/launcher=ray_cluster", f"hydra.launcher.ray.init.address={ray_cluster}",
                 "compile.precision=fp32,fp16")
    cold = _sweep(tmp_path, "cold", *overrides)
    assert [r["status"] for r in cold] == ["done", "done"] and all(r["cache_hits"] == 0 for r in cold)
    log = (tmp_path / "cold" / "0" / "__main__.log").read_text()
    assert "wrote" in log
    warm = _sweep(tmp_path, "warm", *overrides)
    assert all(r["cache_hits"] == r["engines"] == 1 for r in warm)  # every engine from the shared cache
    assert [r["pte_mb"] for r in warm] == [r["pte_mb"] for r in cold]


@pytest.mark.parametrize("metrics, expected", [
    ({"ms": 0.25, "rel_err": 0.004, "rel_err_ok": 1}, 0.25),
    ({"prefill_ms": 0.1, "decode_ms": 0.05, "rel_err": 0.01, "rel_err_ok": 1}, 0.15),
    ({"ms": 0.2, "rel_err": 0.5, "rel_err_ok": 0}, PENALTY),   # fast but wrong: never the best
    ({"ms": 0.2}, PENALTY),                                     # no error measured
    ({"pte_mb": 1.0, "rel_err": 0.001, "rel_err_ok": 1}, None),  # nothing timed (no GPU)
])
def test_autotune_objective(metrics: dict, expected: float | None) -> None:
    assert objective(metrics) == (pytest.approx(expected) if expected is not None else None)


@pytest.mark.skipif(GPU, reason="the refusal is for machines without a GPU")
def test_autotune_refuses_without_a_gpu_before_any_trial(tmp_path: Path) -> None:
    pytest.importorskip("hydra_plugins.hydra_optuna_sweeper", exc_type=ImportError)
    result = subprocess.run([sys.executable, "-m", "pipeline", "-m", "+experiment=autotune", f"hydra.sweep.dir={tmp_path / 'at'}"],
                            cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 2 and "autotune (hydra/sweeper=optuna) minimizes latency measured on a GPU" in result.stderr
    assert not (tmp_path / "at").exists()
