"""Build the coverage suite through the pipeline's own steps (the config path a user's build takes,
`steps.run_all`), each model in a process of its own, `jobs` at a time, and write the table.

A model's row is kept under `<out>/rows/`, keyed by its config, the precision, the toolchain and the
pipeline's code: a second run builds only what changed. A model that fails, crashes or runs past
`timeout` gets a row saying so; the others go on."""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import multiprocessing
import os
import shutil
import signal
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from pipeline.coverage.suite import Entry
from pipeline.errors import ConfigError
from pipeline.files import write_bytes, write_json

log = logging.getLogger("pipeline.coverage")


def row_key(entry: Entry, precision: str, overrides: Sequence[str] = ()) -> str:
    """What a row depends on: the model's config section, the precision and other config overrides,
    the toolchain and the code."""
    from pipeline.engine.cache import toolchain_id

    parts = [entry.model, precision, *([list(overrides)] if overrides else []), toolchain_id(), _code(), _versions()]
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def suite_config(precision: str, overrides: Sequence[str] = ()) -> Any:
    """The composed config every suite build starts from: the defaults, the precision, `overrides`
    (those of `model.` are each entry's: `model_overrides`)."""
    from pipeline.config.compose import compose

    model_overrides(overrides)  # a malformed one is refused before anything is built
    rest = [o for o in overrides if not _of_model(o)]
    return compose([*([] if precision == "fp32" else [f"compile.precision={precision}"]), *rest])


def model_overrides(overrides: Sequence[str]) -> Any:
    """The overrides of `model.` (with or without Hydra's `+`) as a config to merge into each entry's
    model section: every suite model has its own, so they cannot apply to the defaults' model.

    Raises:
        ConfigError: one that is not `model.KEY=VALUE`, or names a key the model section does not have
            (any key under `model.kwargs` is the model's own).
    """
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    from pipeline.config.schema import ModelConfig

    lines = [o.lstrip("+") for o in overrides if _of_model(o)]
    bad = [line for line in lines if "=" not in line]
    if bad:
        raise ConfigError(f"--set {bad[0]}: no value; write model.KEY=VALUE")
    try:
        section = OmegaConf.from_dotlist(lines).get("model") or OmegaConf.create({})
        OmegaConf.merge(OmegaConf.structured(ModelConfig), section)  # keys and types the section takes
    except OmegaConfBaseException as exc:
        raise ConfigError(f"--set {' '.join(lines)}: {str(exc).splitlines()[0]}; write model.KEY=VALUE") from exc
    return section


def _of_model(override: str) -> bool:
    return override.lstrip("+").startswith("model.")


def entry_config(entry: Entry, precision: str = "fp32", overrides: Sequence[str] = ()) -> Any:
    """The validated, typed config (`PipelineConfig`) that builds one suite model."""
    from omegaconf import OmegaConf, open_dict

    from pipeline.config.schema import ModelConfig, typed
    from pipeline.config.validate import validate

    cfg = suite_config(precision, overrides)
    with open_dict(cfg):
        cfg.model = OmegaConf.merge(OmegaConf.structured(ModelConfig), entry.model, model_overrides(overrides))
    validate(cfg)
    return typed(cfg)


def build_row(entry: Entry, precision: str, keep: Path | None = None, overrides: Sequence[str] = ()) -> dict[str, Any]:
    """Build one suite model into a `.pte` (in `keep`, or a temporary folder) and return its row."""
    from pipeline import steps

    cfg = entry_config(entry, precision, overrides)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="coverage-") as tmp:
        files = steps.run_all(cfg, Path(tmp))
        report = json.loads((Path(tmp) / "report.json").read_text())
        seconds = time.perf_counter() - start
        pte_mb = sum(p.stat().st_size for p in files.values()) / 1e6
        if keep is not None:  # the program and its report; the intermediate programs go
            shutil.rmtree(keep, ignore_errors=True)
            keep.mkdir(parents=True)
            shutil.move(Path(tmp) / "program", keep / "program")
            shutil.move(Path(tmp) / "report.json", keep / "report.json")
    left = [item for method in report.values() for item in method["left_over"]]
    checks = [e.get("reference") or {} for method in report.values() for e in method["engines"]]
    errors = [c["max_rel_error"] for c in checks if "max_rel_error" in c]
    on_gpu = [c["tensorrt_rel_error"] for c in checks if "tensorrt_rel_error" in c]
    return {
        "model": entry.name, "source": entry.source, "precision": precision, "status": "ok",
        "lowered_whole": not left,
        "engines": sum(m["num_engines"] for m in report.values()),
        # each engine's network, run by the CPU reference executor, against its graph run eagerly
        "reference_error": max(errors) if errors else None, "reference_unchecked": len(checks) - len(errors),
        # where built on a GPU: each engine run by TensorRT against the reference executor, same inputs
        "tensorrt_error": max(on_gpu) if on_gpu else None,
        "left_outside": dict(sorted(Counter(f"{i['op']}: {i['reason']}" for i in left).items())),
        "build_s": round(seconds, 1), "pte_mb": round(pte_mb, 2),
    }


def run_suite(entries: Iterable[Entry], precision: str, out: Path, jobs: int = 2, timeout: float = 3600,
              keep: bool = False, deadline: float | None = None,
              after: Callable[[Entry], None] | None = None, overrides: Sequence[str] = ()) -> list[dict[str, Any]]:
    """Rows of every entry (built, or kept from an earlier run with the same key); writes the table.

    Args:
        overrides: config overrides of every build (Hydra syntax, e.g. "compile.optimization_level=5").
        keep: keep each program under `<out>/programs/<model>/<precision>/`.
        deadline: seconds after which no further build starts (the rows so far are returned).
        after: also run in each build's process, after the build (e.g. a reference build); picklable.
    """
    entries = list(entries)
    begun = time.monotonic()
    rows: dict[str, dict[str, Any]] = {}
    todo = []
    for entry in entries:
        key = row_key(entry, precision, overrides)
        kept = kept_row(out, entry, precision, key)
        if kept is not None and kept["status"] == "ok":
            rows[entry.name] = kept
        else:
            todo.append((entry, key, row_path(out, entry, precision)))
    # Longest first, by the time an earlier row took (models never built first): the slowest builds
    # do not start last and stretch the run.
    todo.sort(key=lambda item: -_last_build_s(item[2]))
    log.info("coverage: %d model(s) to build, %d kept from earlier runs", len(todo), len(rows))
    # A fresh interpreter per build: forking would copy a CUDA context the parent may hold, and a
    # crash or leak of one build cannot touch the next.
    spawn = multiprocessing.get_context("spawn")
    threads = max(1, (os.cpu_count() or 1) // max(1, jobs))
    running: list[tuple[Entry, str, Path, Any, float]] = []
    while todo or running:
        if deadline is not None and time.monotonic() - begun > deadline and todo:
            log.info("coverage: deadline reached, %d model(s) not started; run again to continue", len(todo))
            todo.clear()
        while todo and len(running) < jobs:
            entry, key, path = todo.pop(0)
            log.info("coverage: building %s (%s)", entry.name, precision)
            programs = out / "programs" / entry.name.replace("/", "__") / precision if keep else None
            proc = spawn.Process(target=_build_child,
                                 args=(entry, precision, key, path, programs, threads, after, tuple(overrides)))
            proc.start()
            running.append((entry, key, path, proc, time.monotonic()))
        time.sleep(0.2)
        _collect(running, rows, precision, timeout)
    ordered = [rows[e.name] for e in dict.fromkeys(entries) if e.name in rows]
    write_table(ordered, precision, out, overrides)
    return ordered


def _collect(running: list[tuple[Entry, str, Path, Any, float]], rows: dict[str, dict[str, Any]], precision: str,
             timeout: float) -> None:
    """Take the rows of the builds that ended (a build past `timeout` is killed; one that crashed or
    timed out gets a failed row) out of `running` into `rows`."""
    for item in list(running):
        entry, key, path, proc, started = item
        seconds = time.monotonic() - started
        if proc.is_alive() and seconds < timeout:
            continue
        if proc.is_alive():
            proc.kill()
        proc.join()
        running.remove(item)
        if proc.exitcode != 0 or not path.exists():
            why = (f"timed out after {timeout:.0f} s" if seconds >= timeout else
                   f"crashed ({_exit(proc.exitcode)})")
            write_json(path, {"key": key, "row": _failed(entry, precision, why, seconds)})
        rows[entry.name] = json.loads(path.read_text())["row"]
        log.info("coverage: %s %s", entry.name, _status(rows[entry.name]))


def row_path(out: Path, entry: Entry, precision: str) -> Path:
    return out / "rows" / f"{entry.name.replace('/', '__')}.{precision}.json"


def kept_row(out: Path, entry: Entry, precision: str, key: str) -> dict[str, Any] | None:
    """The row an earlier build wrote for this entry, if its key is still `key`."""
    path = row_path(out, entry, precision)
    kept = json.loads(path.read_text()) if path.exists() else None
    if kept is None or kept.get("key") != key:
        return None
    return dict(kept["row"])


def _last_build_s(path: Path) -> float:
    if not path.exists():
        return float("inf")
    return float(json.loads(path.read_text())["row"].get("build_s", 0.0))


def _build_child(entry: Entry, precision: str, key: str, path: Path, programs: Path | None, threads: int,
                 after: Callable[[Entry], None] | None, overrides: tuple[str, ...]) -> None:
    """One build in its own process: writes its row (a failure is a row too); only a crash leaves none."""
    import torch

    torch.set_num_threads(threads)
    logging.getLogger("pipeline").setLevel(logging.WARNING)
    start = time.perf_counter()
    try:
        row = build_row(entry, precision, programs, overrides)
    except Exception as exc:  # the row records any failure; the suite goes on
        first = (str(exc).strip().splitlines() or [""])[0]
        row = _failed(entry, precision, f"{type(exc).__name__}: {first[:400]}", time.perf_counter() - start)
    write_json(path, {"key": key, "row": row})
    if after is not None:
        after(entry)


def _failed(entry: Entry, precision: str, why: str, seconds: float) -> dict[str, Any]:
    return {"model": entry.name, "source": entry.source, "precision": precision, "status": why,
            "lowered_whole": False, "engines": 0, "left_outside": {}, "build_s": round(seconds, 1), "pte_mb": 0.0}


def _exit(code: int | None) -> str:
    if code is not None and code < 0:
        name = signal.Signals(-code).name
        return f"{name}{', likely out of memory' if code == -signal.SIGKILL else ''}"
    return f"exit code {code}"


def _status(row: dict[str, Any]) -> str:
    if row["status"] != "ok":
        return f"FAILED: {row['status']}"
    return "lowered whole" if row["lowered_whole"] else f"{len(row['left_outside'])} op kind(s) left outside"


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The numbers DVC shows for a suite run."""
    whole = sum(r["lowered_whole"] for r in rows)
    return {"models": len(rows), "lowered_whole": whole, "failed": sum(r["status"] != "ok" for r in rows),
            "lowered_whole_pct": round(100.0 * whole / len(rows), 1) if rows else 0.0}


def write_table(rows: list[dict[str, Any]], precision: str, out: Path, overrides: Sequence[str] = ()) -> None:
    """`<out>/coverage-<precision>.json` (summary and rows, for DVC) and `.md` (the table)."""
    write_json(out / f"coverage-{precision}.json", {"summary": summary(rows), "overrides": list(overrides), "rows": rows})
    s = summary(rows)
    also = f" with {' '.join(overrides)}" if overrides else ""
    lines = [f"{s['lowered_whole']} of {s['models']} models ({s['lowered_whole_pct']} %) lowered whole at {precision}{also}; "
             f"{s['failed']} failed.", "",
             "| model | precision | lowered whole | engines | ops left outside (reason) | reference error (CPU) | build s | .pte MB |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        outside = "; ".join(f"{k} (x{n})" for k, n in r["left_outside"].items()) if r["status"] == "ok" else r["status"]
        error = "" if r.get("reference_error") is None else f"{r['reference_error']:.1e}"
        if r.get("reference_unchecked"):
            error += f" ({r['reference_unchecked']} unchecked)"
        if r.get("tensorrt_error") is not None:
            error += f"; TensorRT (GPU) {r['tensorrt_error']:.1e} from it"
        lines.append(f"| {r['model']} | {r['precision']} | {'yes' if r['lowered_whole'] else 'no'} | {r['engines']} | "
                     f"{outside.replace('|', '/')} | {error} | {r['build_s']} | {r['pte_mb']} |")
    write_bytes(out / f"coverage-{precision}.md", ("\n".join(lines) + "\n").encode())


@functools.cache
def _code() -> str:
    """Digest of the pipeline package's source."""
    from pipeline.engine.toolchain import source_digest

    return source_digest(Path(__file__).resolve().parents[1])


def _versions() -> dict[str, str]:
    import importlib.metadata

    out = {}
    for name in ("timm", "transformers"):
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = "absent"
    return out
