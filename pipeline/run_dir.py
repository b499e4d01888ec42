"""A Hydra run's outputs are its own: before Hydra writes anything, the run (or sweep) claims its
directory with a marker file, and refuses a directory that another run is writing or that holds
another run's files. Outputs are built under a temporary name inside the claimed directory and
moved into place only when complete; an interrupted run leaves no outputs, and the next run into
its directory removes what it left. Registered as a Hydra callback in `conf/config.yaml`."""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from pipeline.errors import RunDirError
from pipeline.files import fix_modes, writing

CLAIM = ".pipeline-run.json"
# What a run (or sweep) writes into its directory, and so all that taking over an interrupted one
# removes: Hydra's `.hydra/` and job log, the staging folder and stale marker, the build's outputs,
# a sweep's job folders and summary. Anything else there is someone else's and stays.
_RUN_FILES = re.compile(r"\.hydra|[^/]*\.log|\.pipeline-tmp-\d+-[^/]*|\.pipeline-run\.json\.stale-\d+|compiled|exported|"
                        r"transformed|program|(timings|report|manifest|validation|metrics|plot|params|toolchain)\.json|"
                        r"multirun\.yaml|summary\.(md|json)|\d+")
log = logging.getLogger("pipeline")


def claim(directory: Path) -> Path:
    """Claim `directory` for this process.

    Raises:
        RunDirError: another live run holds it, or it holds files of another run.
    """
    with writing(directory):
        directory.mkdir(parents=True, exist_ok=True)
    marker = directory / CLAIM
    if marker.exists():
        _take_over_interrupted(directory, marker)
    elif any(directory.iterdir()):
        raise RunDirError(f"{directory} already holds files that are not this run's; choose a new directory "
                          "(hydra.run.dir=... or hydra.sweep.dir=...) or remove it")
    try:
        with writing(marker), open(marker, "x") as f:
            json.dump({"pid": os.getpid(), "started": time.time(), "argv": sys.argv, "complete": False}, f)
    except FileExistsError as exc:
        raise RunDirError(f"{directory} was just claimed by another run; choose a new directory") from exc
    return marker


def complete(marker: Path) -> None:
    """Mark the run that holds `marker` as finished (its outputs are all in place)."""
    doc = json.loads(marker.read_text())
    with writing(marker):
        marker.write_text(json.dumps({**doc, "complete": True, "finished": time.time()}))


def _take_over_interrupted(directory: Path, marker: Path) -> None:
    try:
        doc = json.loads(marker.read_text())
        pid, done = int(doc["pid"]), bool(doc["complete"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise RunDirError(f"{directory} holds an unreadable run marker {CLAIM}; choose a new directory") from exc
    if done:
        raise RunDirError(f"{directory} holds the outputs of an earlier run (pid {pid}); choose a new directory "
                          "(hydra.run.dir=... or hydra.sweep.dir=...) or remove it")
    if _alive(pid):
        raise RunDirError(f"{directory} is being written by another run (pid {pid}); wait for it or choose a new directory")
    log.info("removing what interrupted run (pid %d) left in %s", pid, directory)
    stale = marker.with_name(f"{CLAIM}.stale-{os.getpid()}")
    try:
        os.rename(marker, stale)  # one taker only
    except FileNotFoundError as exc:
        raise RunDirError(f"{directory} was just taken over by another run; choose a new directory") from exc
    theirs = [entry.name for entry in directory.iterdir() if not _RUN_FILES.fullmatch(entry.name)]
    for entry in directory.iterdir():
        if _RUN_FILES.fullmatch(entry.name):
            shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()
    if theirs:
        raise RunDirError(f"{directory} also holds files that are not a run's ({', '.join(sorted(theirs)[:3])}); they "
                          "were kept: choose a new directory (hydra.run.dir=... or hydra.sweep.dir=...) or move them")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@contextmanager
def staged(directory: Path) -> Iterator[Path]:
    """A temporary directory inside `directory` whose entries move into `directory` when the block
    succeeds (entries of one run, so nothing of another is replaced)."""
    with writing(directory):
        tmp = Path(tempfile.mkdtemp(dir=directory, prefix=f".pipeline-tmp-{os.getpid()}-"))
    try:
        yield tmp
        with writing(directory):
            fix_modes(tmp)
            for entry in sorted(tmp.iterdir()):
                os.replace(entry, directory / entry.name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


class RunDirGuard(Callback):
    """Hydra callback: validate the config and claim the run (or sweep) directory before Hydra writes
    into it; mark it complete at the end."""

    def __init__(self) -> None:
        self.marker: Path | None = None

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        self._start(config, "run")

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        self._start(config, "sweep")

    def on_run_end(self, config: DictConfig, **kwargs: Any) -> None:
        from hydra.core.utils import JobStatus

        job = kwargs.get("job_return")
        if job is not None and job.status == JobStatus.COMPLETED:  # a failed run stays incomplete
            self._end()

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        self._end()

    def _start(self, config: DictConfig, mode: str) -> None:
        from pipeline.cli import reported
        from pipeline.config.validate import validate

        # Hydra sets up logging only later, and checking the config imports torch (seconds): say so now.
        print(f"pipeline: checking the config, then claiming the {mode} directory", flush=True)  # stdout, as Hydra logs
        with reported():
            if mode == "run":  # sweeps validate each job's config when it starts
                validate(OmegaConf.masked_copy(config, [str(k) for k in config if k != "hydra"]))
            self.marker = claim(Path(str(config.hydra.run.dir if mode == "run" else config.hydra.sweep.dir)))

    def _end(self) -> None:
        if self.marker is not None and self.marker.exists():
            complete(self.marker)
