"""The warm stage server (`pipeline.stage_server`): a stage handed over runs in a fork with its own
argv, folder, environment and streams, reads the project's modules from disk each time, returns its
exit status, and ends when its own process is killed; switched off, a stage runs in its own process.
Each test has a key of its own (an environment variable), so its server starts cold."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

SCRIPT = """\
import os, sys
from pipeline.stage_server import hand_over

hand_over()
import project_module
print("served", os.environ.get("PIPELINE_STAGE_SERVED"), "torch loaded", "torch" in sys.modules)
print("cwd", os.getcwd(), "args", sys.argv[1:], "value", project_module.VALUE, "x", os.environ.get("X"))
print("to stderr", file=sys.stderr)
if sys.argv[1] == "sleep":
    open("pid", "w").write(str(os.getpid()))
    import time
    time.sleep(120)
sys.exit(int(sys.argv[1]))
"""


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "stage.py").write_text(SCRIPT)
    (tmp_path / "project_module.py").write_text("VALUE = 1\n")
    return tmp_path


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, "STAGE_SERVER_TEST": uuid.uuid4().hex, **extra}


def _run(project: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "stage.py", *args], cwd=project, env=env, capture_output=True, text=True,
                          timeout=300)


def test_a_stage_runs_in_a_fork_with_its_own_process_state_and_fresh_project_code(project: Path) -> None:
    env = _env(X="first")
    done = _run(project, env, "3")
    assert done.returncode == 3, done.stderr
    assert done.stdout.splitlines() == ["served 1 torch loaded True", f"cwd {project} args ['3'] value 1 x first"]
    assert done.stderr == "to stderr\n"
    (project / "project_module.py").write_text("VALUE = 2\n")  # what the stage runs is read from disk each time
    again = _run(project, env | {"DVC_STAGE": "export"}, "0")  # DVC's per-command variables: the same server
    assert again.returncode == 0 and again.stdout.splitlines()[1] == f"cwd {project} args ['0'] value 2 x first"


def test_switched_off_a_stage_runs_in_its_own_interpreter(project: Path) -> None:
    done = _run(project, _env(PIPELINE_STAGE_SERVER="off"), "0")
    assert done.returncode == 0 and done.stdout.splitlines()[0] == "served None torch loaded False"


@pytest.mark.parametrize("how", ["killed", "interrupted"])
def test_a_stage_ends_with_its_own_process(project: Path, how: str) -> None:
    """Killed (DVC stopped hard), the stage in the fork goes too; interrupted (Ctrl-C), it gets the
    signal and exits as Python does."""
    client = subprocess.Popen([sys.executable, "stage.py", "sleep"], cwd=project, env=_env(), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not (project / "pid").is_file() and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(0.2)
    stage = int((project / "pid").read_text())
    assert stage != client.pid
    client.send_signal(signal.SIGKILL if how == "killed" else signal.SIGINT)
    code = client.wait(timeout=60)
    assert code == (-signal.SIGKILL if how == "killed" else 128 + signal.SIGINT), client.stderr.read() if client.stderr else ""
    if how == "interrupted":
        assert "KeyboardInterrupt" in (client.stderr.read() if client.stderr else "")
    deadline = time.monotonic() + 30
    while Path(f"/proc/{stage}").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not Path(f"/proc/{stage}").exists()
