"""Results of a Hydra multirun side by side: when the sweep ends (whatever launcher ran its jobs),
one table of every job, its overrides and the metrics the DVC stages record (`metrics.json`: sizes,
engines, cache hits, build seconds, errors and latency where a GPU ran), written into the sweep
directory as `summary.json` and `summary.md`; and the objective an autotune (Optuna sweeper)
minimizes. Registered as a Hydra callback in `conf/config.yaml`."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from pipeline.errors import ConfigError
from pipeline.files import write_bytes, write_json

log = logging.getLogger("pipeline")
# Columns first in this order; other metrics (per-method latencies) follow by name.
_ORDER = ["pte_mb", "ptd_mb", "engines", "engine_mb", "outside", "build_s", "cache_hits", "rel_err", "rel_err_ok", "ms"]


def rows(sweep_dir: Path) -> list[dict[str, Any]]:
    """One row per job directory of a sweep: job, the overrides that tell it from the other jobs,
    status and its metrics."""
    jobs = sorted((p for p in sweep_dir.iterdir() if p.is_dir() and p.name.isdigit()), key=lambda p: int(p.name))
    overrides = []
    for job in jobs:
        path = job / ".hydra" / "overrides.yaml"
        overrides.append(list(yaml.safe_load(path.read_text()) or []) if path.exists() else [])
    shared = set.intersection(*map(set, overrides)) if len(jobs) > 1 else set()
    out = []
    for job, own in zip(jobs, overrides):
        metrics_file = job / "metrics.json"
        metrics = json.loads(metrics_file.read_text()) if metrics_file.exists() else {}
        out.append({"job": int(job.name), "overrides": " ".join(o for o in own if o not in shared),
                    "status": "done" if metrics else "failed", **metrics})
    return out


def markdown(table: list[dict[str, Any]]) -> str:
    """The rows as a markdown table (a metric a job lacks is blank)."""
    metrics = {k for row in table for k in row} - {"job", "overrides", "status"}
    columns = ["job", "overrides", "status", *[k for k in _ORDER if k in metrics], *sorted(metrics - set(_ORDER))]
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for row in table:
        lines.append("| " + " | ".join(str(row.get(c, "")) for c in columns) + " |")
    return "\n".join(lines) + "\n"


def write_summary(sweep_dir: Path) -> list[dict[str, Any]]:
    """Write `summary.json` and `summary.md` of the sweep in `sweep_dir`; return the rows."""
    from pipeline.run_dir import record

    table = rows(sweep_dir)
    record(sweep_dir, ["summary.json", "summary.md"])
    write_json(sweep_dir / "summary.json", table)
    write_bytes(sweep_dir / "summary.md", markdown(table).encode())
    return table


# An autotune trial whose build misses the error bound scores this (never the best).
PENALTY = 1e9


def objective(metrics: Mapping[str, Any]) -> float | None:
    """What an autotune minimizes: the build's measured milliseconds per call (summed over methods),
    or `PENALTY` unless the validate step found every method within `runtime.max_rel_error` of eager
    PyTorch (`rel_err_ok`); None without a GPU measurement."""
    latency = [float(v) for k, v in metrics.items() if k == "ms" or k.endswith("_ms")]
    if not latency:
        return None
    return sum(latency) if metrics.get("rel_err_ok") == 1 else PENALTY


def check_autotune(config: DictConfig) -> None:
    """Refuse an autotune (the Optuna sweeper) where no GPU can measure latency.

    Raises:
        ConfigError: this machine has no CUDA GPU visible to PyTorch.
    """
    sweeper = str(OmegaConf.select(config, "hydra.sweeper._target_") or "")
    if "optuna" not in sweeper.lower():
        return
    import torch

    if not torch.cuda.is_available():
        raise ConfigError("autotune (hydra/sweeper=optuna) minimizes latency measured on a GPU, and this machine has "
                          "none visible to PyTorch; run it on a GPU machine, or sweep with the basic, joblib or ray "
                          "launcher (`-m` without the optuna sweeper) to build without measuring")


class SweepSummary(Callback):
    """Hydra callback: refuse an autotune without a GPU before any job; the sweep's summary table
    when a multirun ends."""

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        from pipeline.cli import reported

        with reported():
            check_autotune(config)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(str(config.hydra.sweep.dir))
        table = write_summary(sweep_dir)
        failed = sum(row["status"] == "failed" for row in table)
        log.info("sweep summary of %d jobs (%d failed), also in %s:\n%s", len(table), failed, sweep_dir / "summary.md",
                 markdown(table).rstrip("\n"))
