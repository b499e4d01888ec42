"""A run's outputs are its own: a Hydra run never writes into a directory that holds another run's
files, outputs appear complete or not at all, and an interrupted run leaves nothing that looks
current (the next run into its directory removes what it left)."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipeline.errors import RunDirError
from pipeline.run_dir import CLAIM, check_subdir, claim, complete, record, staged

ROOT = Path(__file__).resolve().parents[2]


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_claimed_directory_refuses_a_second_run(tmp_path: Path) -> None:
    marker = claim(tmp_path / "run")
    with pytest.raises(RunDirError, match=f"is being written by another run \\(pid {os.getpid()}\\)"):
        claim(tmp_path / "run")
    complete(marker)
    with pytest.raises(RunDirError, match="holds the outputs of an earlier run"):
        claim(tmp_path / "run")


def test_directory_with_foreign_files_is_refused(tmp_path: Path) -> None:
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "notes.txt").write_text("mine")
    with pytest.raises(RunDirError, match="already holds files that are not this run's"):
        claim(tmp_path / "run")
    assert (tmp_path / "run" / "notes.txt").read_text() == "mine"


def test_interrupted_run_is_cleared_by_the_next(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    pid = _dead_pid()
    (run / CLAIM).write_text(json.dumps({"pid": pid, "complete": False, "created": ["__main__.log"]}))
    (run / f".pipeline-tmp-{pid}-x").mkdir()
    (run / f".pipeline-tmp-{pid}-x" / "compiled").mkdir()
    (run / "__main__.log").write_text("old")
    claim(run)
    assert sorted(p.name for p in run.iterdir()) == [CLAIM]


def test_taking_over_an_interrupted_run_deletes_only_what_it_created(tmp_path: Path) -> None:
    """A marker of a dead run in a folder that also holds someone's files (planted, or put there since
    the run died, under names a run also writes): the entries its marker lists go, the rest stays
    (whatever their names), and the folder is refused."""
    run = tmp_path / "run"
    (run / ".hydra").mkdir(parents=True)
    pid = _dead_pid()
    (run / CLAIM).write_text(json.dumps({"pid": pid, "complete": False, "created": [".hydra", "program", "../x", "/"]}))
    (run / "program").mkdir()
    for name in ("thesis", "toolchain.json", "2024", "notes.log", "compiled", ".pipeline-tmp-1-x"):
        (run / name).write_text("mine")
    with pytest.raises(RunDirError, match=r"also holds files that are not a run's \(.pipeline-tmp-1-x, 2024, compiled\); "
                                          r"they were kept"):
        claim(run)
    assert sorted(p.name for p in run.iterdir()) == [".pipeline-tmp-1-x", "2024", "compiled", "notes.log", "thesis",
                                                     "toolchain.json"]
    assert all((run / n).read_text() == "mine" for n in ("thesis", "toolchain.json", "2024", "notes.log"))


def test_a_run_records_what_it_creates(tmp_path: Path) -> None:
    marker = claim(tmp_path / "run")
    with staged(tmp_path / "run") as tmp:
        (tmp / "program").mkdir()
        (tmp / "metrics.json").write_text("{}")
    assert json.loads(marker.read_text())["created"] == ["metrics.json", "program"]
    record(tmp_path / "run", [".hydra"])
    assert json.loads(marker.read_text())["created"] == [".hydra", "metrics.json", "program"]


@pytest.mark.parametrize("subdir", ["../..", "/tmp/x", ".", "", "a/../..", "${hydra.runtime.cwd}", "~/x", "${now:%Y}/../.."])
def test_a_sweep_job_folder_outside_the_sweep_is_refused(subdir: str) -> None:
    with pytest.raises(RunDirError, match="does not name a folder inside the sweep directory"):
        check_subdir(subdir, [])


def test_a_sweep_job_folder_named_by_overrides_that_hold_paths_is_refused() -> None:
    check_subdir("${hydra.job.num}", ["model.weights=../../x"])
    check_subdir("job_${hydra.job.override_dirname}", ["model=mlp,resnet18"])
    with pytest.raises(RunDirError, match=r"override 'model.weights=../../x' holds a path"):
        check_subdir("${hydra.job.override_dirname}", ["model=mlp", "model.weights=../../x"])


def test_staged_outputs_appear_only_on_success(tmp_path: Path) -> None:
    with pytest.raises(KeyboardInterrupt), staged(tmp_path) as tmp:
        (tmp / "program").mkdir()
        raise KeyboardInterrupt
    assert list(tmp_path.iterdir()) == []
    with staged(tmp_path) as tmp:
        (tmp / "program").mkdir()
    assert [p.name for p in tmp_path.iterdir()] == ["program"]


def _pipeline(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pipeline", *args], cwd=ROOT, capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_two_runs_into_one_directory(tmp_path: Path) -> None:
    first = _pipeline(f"hydra.run.dir={tmp_path}/run")
    assert first.returncode == 0, first.stderr
    before = {p: p.stat().st_mtime_ns for p in (tmp_path / "run").rglob("*")}
    second = _pipeline(f"hydra.run.dir={tmp_path}/run", "model=resnet18")
    assert second.returncode == 2 and "holds the outputs of an earlier run" in second.stderr
    assert second.stderr.strip().count("\n") == 0
    assert {p: p.stat().st_mtime_ns for p in (tmp_path / "run").rglob("*")} == before
    assert json.loads((tmp_path / "run" / "params.json").read_text())["model"]["name"] == "mlp"


@pytest.mark.slow
def _as_a_shell_starts_it() -> None:
    """SIGINT neither ignored nor blocked in the child, as a shell starts a command: a test worker may
    hold it either way (a library's helper process launched from it blocks or ignores it), and the
    child would inherit that and finish its run despite the signal."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def test_sigint_leaves_nothing_that_looks_current(tmp_path: Path) -> None:
    run = tmp_path / "run"
    child = subprocess.Popen([sys.executable, "-m", "pipeline", f"hydra.run.dir={run}"], cwd=ROOT,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=_as_a_shell_starts_it)
    # Under load (CI's two cores shared by two test workers) a build takes minutes: wait for the
    # compile step's output with no short deadline, and for the interrupted run as long again.
    deadline = time.monotonic() + 600
    while not any(run.glob(".pipeline-tmp-*/compiled")) and child.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert child.poll() is None, "the run ended before it could be interrupted"
    child.send_signal(signal.SIGINT)
    child.wait(timeout=600)
    assert not (run / "program").exists() and not (run / "params.json").exists()
    assert not json.loads((run / CLAIM).read_text())["complete"]
    again = _pipeline(f"hydra.run.dir={run}")
    assert again.returncode == 0, again.stderr
    assert (run / "program" / "mlp.pte").exists() and not list(run.glob(".pipeline-tmp-*"))
