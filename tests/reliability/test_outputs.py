"""Outputs appear complete or not at all, with the usual modes (umask applies); temporaries of
killed writers are removed by the next writer, a live writer's never; a full disk names the path."""

import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from pipeline.errors import OutputError
from pipeline.files import atomic_dir, write_bytes, write_json
from tests.reliability.test_run_dir import _dead_pid


def _modes(root: Path) -> set[tuple[str, int]]:
    return {("d" if p.is_dir() else "f", stat.S_IMODE(p.stat().st_mode)) for p in [root, *root.rglob("*")]}


@pytest.fixture
def umask_022() -> Iterator[None]:
    old = os.umask(0o022)
    yield
    os.umask(old)


def test_outputs_get_the_usual_modes(tmp_path: Path, umask_022: None, portable_files: dict[str, Path]) -> None:
    write_json(tmp_path / "out" / "report.json", {"a": 1})
    with atomic_dir(tmp_path / "out" / "compiled") as tmp:
        (tmp / "sub").mkdir()
        (tmp / "sub" / "f.bin").write_bytes(b"x")
    assert _modes(tmp_path / "out") == {("d", 0o755), ("f", 0o644)}
    assert {stat.S_IMODE(p.stat().st_mode) for p in portable_files.values()} == {0o644}


def test_umask_applies(tmp_path: Path) -> None:
    old = os.umask(0o077)
    try:
        write_bytes(tmp_path / "secret.bin", b"x")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "secret.bin").stat().st_mode) == 0o600


def test_killed_writers_temporaries_go_live_ones_and_the_users_files_stay(tmp_path: Path) -> None:
    dead, live = _dead_pid(), os.getppid()
    users = [".program.k2j4h5", ".program.swp", ".program.bak", f".program.tmp-{dead}", ".program.tmp-backup-abc",
             f".program.tmp-{dead}-abc.old"]
    for name in (f".program.tmp-{dead}-abc", f".program.tmp-{live}-xyz", *users):
        (tmp_path / name).mkdir()
        (tmp_path / name / "program.pte").write_bytes(b"x" * 1000)
    with atomic_dir(tmp_path / "program") as tmp:
        (tmp / "mlp.pte").write_bytes(b"new")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([f".program.tmp-{live}-xyz", "program", *users])
    for name in (".params.yaml.swp", ".params.yaml.bak"):  # the case found: compose deleted an editor's files
        (tmp_path / name).write_text("mine")
    write_bytes(tmp_path / "params.yaml", b"x: 1\n")
    assert (tmp_path / ".params.yaml.swp").read_text() == "mine" and (tmp_path / ".params.yaml.bak").exists()


def test_failed_block_leaves_the_old_output(tmp_path: Path) -> None:
    with atomic_dir(tmp_path / "program") as tmp:
        (tmp / "a").write_text("old")
    with pytest.raises(RuntimeError), atomic_dir(tmp_path / "program") as tmp:
        (tmp / "a").write_text("half")
        raise RuntimeError
    assert (tmp_path / "program" / "a").read_text() == "old" and len(list(tmp_path.iterdir())) == 1


@pytest.fixture
def tiny_disk(tmp_path: Path) -> Iterator[Path]:
    mount = tmp_path / "disk"
    mount.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount)], capture_output=True).returncode:
        pytest.skip("cannot mount a small tmpfs here (needs root)")
    yield mount
    subprocess.run(["umount", str(mount)], check=True)


def test_disk_full_names_the_path(tiny_disk: Path) -> None:
    with pytest.raises(OutputError, match=f"cannot write {tiny_disk}/out/report.json: No space left on device"):
        write_json(tiny_disk / "out" / "report.json", {"x": "y" * 200_000})
    with pytest.raises(OutputError, match=f"cannot write {tiny_disk}/compiled: No space left on device"), \
            atomic_dir(tiny_disk / "compiled") as tmp:
        (tmp / "forward.pt2").write_bytes(b"z" * 200_000)
    assert [p.name for p in tiny_disk.iterdir()] == ["out"] and not list((tiny_disk / "out").iterdir())


def test_disk_full_is_one_line_from_the_command(tiny_disk: Path) -> None:
    root = Path(__file__).resolve().parents[2]
    code = ("import sys; from pipeline.cli import reported; from pipeline.files import write_json\n"
            f"with reported(): write_json({str(tiny_disk / 'm.json')!r}, {{'x': 'y' * 200_000}})")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            env={**os.environ, "PYTHONPATH": str(root)})
    assert result.returncode == 2 and result.stderr.count("\n") == 1 and str(tiny_disk / "m.json") in result.stderr
