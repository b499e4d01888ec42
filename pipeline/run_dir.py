"""A Hydra run's outputs are its own: before Hydra writes anything, the run (or sweep) claims its
directory with a marker file, and refuses a directory that another run is writing or that holds
another run's files. The marker lists every entry the run creates there (`record`): Hydra's
`.hydra/` and job log, the build's outputs, a sweep's job folders and summary. Outputs are built
under a temporary name inside the claimed directory and moved into place only when complete; an
interrupted run leaves no outputs, and the next run into its directory removes what the marker
lists and nothing else. A sweep's job folders lie inside its claimed directory (`check_subdir`).
Registered as a Hydra callback in `conf/config.yaml`."""

from __future__ import annotations

import fcntl
import json
import logging
import os
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from pipeline.errors import RunDirError
from pipeline.files import fix_modes, writing

CLAIM = ".pipeline-run.json"
_STAGING = ".pipeline-tmp-"
# Interpolations a sweep's job folder name may use: each names a job, never a path out of the sweep.
_SUBDIR_NAMES = re.compile(r"\$\{hydra\.job\.(num|id|name|override_dirname)\}|\$\{now:[^}/]*\}")
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
            json.dump({"pid": os.getpid(), "started": time.time(), "argv": sys.argv, "complete": False, "created": []}, f)
    except FileExistsError as exc:
        raise RunDirError(f"{directory} was just claimed by another run; choose a new directory") from exc
    return marker


def complete(marker: Path) -> None:
    """Mark the run that holds `marker` as finished (its outputs are all in place)."""
    _update(marker, lambda doc: {**doc, "complete": True, "finished": time.time()})


def record(directory: Path, names: Iterable[str]) -> None:
    """Add entries of `directory` to what its run created (before they are written), where a run
    claimed it; a later run taking over an interrupted one removes those and nothing else."""
    marker = directory / CLAIM
    if marker.is_file():
        _update(marker, lambda doc: {**doc, "created": sorted(set(doc.get("created") or []) | set(names))})


def _update(marker: Path, change: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
    """Rewrite the marker under a lock (a sweep's jobs record their folders from their own processes)."""
    with writing(marker), open(marker, "r+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        doc = change(json.loads(f.read()))
        f.seek(0)
        f.truncate()
        f.write(json.dumps(doc))


def check_subdir(raw: str, task_overrides: Iterable[str]) -> None:
    """A sweep's job folder (`hydra.sweep.subdir`, as written, before interpolation) is a relative path
    inside the sweep's directory: no absolute path, no `..`, interpolations that name a job only, and
    with `${hydra.job.override_dirname}`, no override value that holds a path.

    Raises:
        RunDirError: naming the setting and the fix.
    """
    plain = _SUBDIR_NAMES.sub("x", raw)
    parts = Path(plain).parts
    if not plain or "${" in plain or plain.startswith(("/", "~")) or ".." in parts or all(p == "." for p in parts):
        raise RunDirError(f"hydra.sweep.subdir={raw!r} does not name a folder inside the sweep directory; use a relative "
                          "name such as ${hydra.job.num} (the default), without '..', '/' first or other interpolations")
    if "override_dirname" in raw:
        paths = [o for o in task_overrides if "/" in o.partition("=")[2] or "\\" in o.partition("=")[2]]
        if paths:
            raise RunDirError(f"hydra.sweep.subdir uses ${{hydra.job.override_dirname}} and override {paths[0]!r} holds a "
                              "path, which would name a folder elsewhere; use ${hydra.job.num}")


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
    created = {str(n) for n in doc.get("created") or [] if isinstance(n, str) and "/" not in n and n not in ("", ".", "..")}
    ours = created | {stale.name}
    ours |= {e.name for e in directory.iterdir() if e.name.startswith(f"{_STAGING}{pid}-")}  # its staging folder
    theirs = [entry.name for entry in directory.iterdir() if entry.name not in ours]
    for entry in directory.iterdir():
        if entry.name in ours:
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
        tmp = Path(tempfile.mkdtemp(dir=directory, prefix=f"{_STAGING}{os.getpid()}-"))
    try:
        yield tmp
        with writing(directory):
            fix_modes(tmp)
            entries = sorted(tmp.iterdir())
            record(directory, [e.name for e in entries])
            for entry in entries:
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
        from pipeline.cli import reported

        with reported():
            raw: Any = OmegaConf.to_container(config.hydra.sweep)  # as written: before interpolation
            check_subdir(str(raw["subdir"]), config.hydra.overrides.task)
        self._start(config, "sweep")

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        """Hydra has made the job's folder and written its `.hydra/` and log: record them as the run's
        (a sweep job: its folder, in the sweep's marker, once it is known to lie inside the sweep)."""
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        from pipeline.cli import reported

        job_dir = Path(str(config.hydra.runtime.output_dir))
        if HydraConfig.get().mode != RunMode.MULTIRUN:
            record(job_dir, [e.name for e in job_dir.iterdir() if e.name != CLAIM])
            return
        sweep_dir = Path(str(config.hydra.sweep.dir)).resolve()
        inside = job_dir.resolve().relative_to(sweep_dir).parts if job_dir.resolve().is_relative_to(sweep_dir) else ()
        with reported():
            if not inside:
                raise RunDirError(f"sweep job folder {job_dir} is not inside the sweep directory {sweep_dir}; set "
                                  "hydra.sweep.subdir to a name such as ${hydra.job.num}")
        record(sweep_dir, [inside[0], "multirun.yaml"])

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
