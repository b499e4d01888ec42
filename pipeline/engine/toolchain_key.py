"""The key under which the DVC stage `toolchain` keeps its last record, so that a no-op `dvc repro`
copies it back without starting Python (`stages/toolchain.sh`). The key is the stage's environment (as
that script lists it, handed over in `$PIPELINE_TOOLCHAIN_ENV`) and the size, mtime and inode of every
file the record was made from, taken by `stat` as the script takes them: params.yaml, the interpreter,
every folder on its search path but the project's own (an installed or removed package changes its
folder), the project's modules the stage loaded, and the weight and calibration files the params name. Taken before the record
is made, so a file changed meanwhile makes the next run make it again."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

ENV = "PIPELINE_TOOLCHAIN_ENV"
STAT_FORMAT = "%n %s %.9Y %i"  # the script's
ROOT = Path(__file__).resolve().parents[2]
KEPT = Path("build/.toolchain")


def sources(inputs: Iterable[str | Path]) -> list[str]:
    """The files and folders a record made now is made from, `inputs` (weights, calibration) included."""
    here = (ROOT, Path.cwd().resolve())
    project = sorted({os.path.abspath(f) for m in list(sys.modules.values()) if (f := getattr(m, "__file__", None))
                      and any(Path(f).resolve().is_relative_to(p) for p in here)})
    # The project's own folders on the path (the script's, stages/, where DVC writes stages/dvc.lock after
    # every run; the project root) change on every run: their modules are listed one by one instead.
    own = {*here, Path(sys.path[0] or ".").resolve()}
    folders = [p for p in sys.path if p and os.path.isdir(p) and Path(p).resolve() not in own]
    return ["params.yaml", "stages/toolchain.sh", sys.executable, *folders, *project, *map(str, inputs)]


def key(files: list[str]) -> str | None:
    """The key of `files` now, or None where the stage did not come through its script (no environment
    listed) or a name cannot be listed one per line."""
    env = os.environ.get(ENV)
    if env is None or any("\n" in f for f in files):
        return None
    try:
        found = subprocess.run(["stat", "-L", "-c", STAT_FORMAT, "--", *files], capture_output=True, text=True,
                               check=False).stdout
    except OSError:
        return None
    return (env + "\n" + found).rstrip("\n")


def keep(stage: str, files: list[str], made_under: str | None, out: Path) -> None:
    """Keep the record just written to `out` under the key taken before it was made; with no key, forget
    any kept one, so the script runs the stage again."""
    from pipeline.files import write_bytes

    where = KEPT / stage.rpartition(":")[2]  # the stage's name without its file (stages/dvc.yaml:), as the script's
    with contextlib.suppress(FileNotFoundError):  # first: no key ever stands beside another record
        (where / "key").unlink()
    if made_under is None:
        return
    write_bytes(where / "record.json", out.read_bytes())
    write_bytes(where / "out", f"{out}\n".encode())
    write_bytes(where / "files", "".join(f"{f}\n" for f in files).encode())
    write_bytes(where / "key", f"{made_under}\n".encode())
