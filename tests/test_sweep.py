"""Sweeps for real: Hydra multirun with the joblib launcher (parallel jobs on this machine) and the
Ray launcher against a real local Ray cluster, each ending in one summary table of its jobs; a sweep
run again takes every engine from the shared engine cache."""

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from pipeline.sweep import markdown, rows

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


def _sweep(tmp: Path, name: str, *overrides: str) -> list[dict]:
    cmd = [sys.executable, "-m", "pipeline", "-m", *overrides, f"cache.url={tmp / 'engines'}", f"hydra.sweep.dir={tmp / name}"]
    result = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    table = json.loads((tmp / name / "summary.json").read_text())
    assert (tmp / name / "summary.md").read_text() == markdown(rows(tmp / name))
    return table


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
