"""The build's metrics, as DVC shows them: one flat record of short numeric names per build
(`metrics.json`, tracked by git so experiments carry it) and one row for the plots (`plots/build.json`).
Reasons and per-method detail stay in `validation.json` and `report.json`."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pipeline.config.schema import PipelineConfig

_MB = 1 << 20


def summary(program_dir: Path, report: Mapping[str, Any], timings: Mapping[str, Any],
            validation: Mapping[str, Any]) -> dict[str, float | int]:
    """Sizes, engines, ops outside TensorRT, build seconds; errors and latency where a GPU measured them.

    Keys: pte_mb, ptd_mb, engines and engine_mb (distinct engines stored, their bytes), outside (ops
    left to other backends or kernels), build_s (compile step), cache_hits (engines the compile step
    took from the engine cache), rel_err (worst method) and rel_err_ok (1: every method within
    runtime.max_rel_error), ms or <method>_ms (median call, GPU only).
    """
    files = {p.suffix: p.stat().st_size for p in program_dir.iterdir()}
    # Engines as the program stores them: once each, however many delegates of any method call one.
    stored = {e["engine_key"]: int(e["engine_bytes"]) for m in report.values() for e in m["engines"]}
    out: dict[str, float | int] = {
        "pte_mb": round(files.get(".pte", 0) / _MB, 3),
        "ptd_mb": round(files.get(".ptd", 0) / _MB, 3),
        "engines": len(stored),
        "engine_mb": round(sum(stored.values()) / _MB, 3),
        "outside": sum(len(m["left_over"]) for m in report.values()),
        "build_s": round(float(timings.get("total", 0.0)), 2),
    }
    if "engine_cache" in timings:  # engines the compile step took from the cache
        out["cache_hits"] = int(timings["engine_cache"]["hits"])
    methods = validation.get("methods", {})
    errors = [m["max_rel_error"] for m in methods.values() if m.get("max_rel_error") is not None]
    if errors:
        out["rel_err"] = float(f"{max(errors):.3g}")
        out["rel_err_ok"] = int(all(m.get("within_tolerance", True) for m in methods.values()))
    for name, m in methods.items():
        if m.get("median_ms") is not None:
            out["ms" if len(methods) == 1 else f"{name}_ms"] = round(float(m["median_ms"]), 4)
    return out


def plot_row(cfg: PipelineConfig, metrics: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The plots' data: one row naming the build (model/precision) with its metrics."""
    return [{"build": f"{cfg.model.name}/{cfg.compile.precision}", **metrics}]
