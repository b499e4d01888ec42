"""GPU benchmark: per model, median and p90 latency of eager PyTorch, torch.compile (CUDA graphs),
the raw TensorRT engine(s) driven directly (with and without a CUDA graph), and pipeline.runtime
on the .pte; plus engine build time and file sizes. Prints a markdown table.

    python bench/benchmark.py --models mobilenet_v3_small resnet18 --precision fp32 fp16
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from omegaconf import OmegaConf

from pipeline import pte
from pipeline.config import objects
from pipeline.config.compose import compose
from pipeline.runtime import load
from pipeline.steps import run_all
from pipeline.tensorrt import blob
from pipeline.tensorrt.engine_runner import EngineRunner, RuntimeOptions


def timed(fn: Callable[[], Any], iters: int, warmup: int) -> tuple[float, float, float]:
    """(first call, median, p90) in milliseconds, timed with CUDA events on the current stream."""
    torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    first = (time.perf_counter() - start) * 1e3
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(iters):
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        fn()
        end.record()
        end.synchronize()
        samples.append(begin.elapsed_time(end))
    samples.sort()
    return first, statistics.median(samples), samples[int(0.9 * (len(samples) - 1))]


def bench_model(name: str, precision: str, iters: int, warmup: int, use_compile: bool) -> list[dict[str, Any]]:
    cfg = OmegaConf.to_container(compose([f"model={name}", f"compile.precision={precision}"]), resolve=True)
    spec = cfg["model"]["methods"]["forward"]
    model = objects.model(cfg).cuda()
    inputs = [x.cuda() for x in objects.example_inputs(spec, 1)]
    if precision != "fp32":  # eager baselines run in the same precision
        model = model.to(torch.float16 if precision == "fp16" else torch.bfloat16)
        inputs = [x.to(next(model.parameters()).dtype) if x.is_floating_point() else x for x in inputs]
    rows = []
    out_dir = Path(tempfile.mkdtemp())
    build_start = time.perf_counter()
    files = run_all(cfg, out_dir)
    build = time.perf_counter() - build_start
    report = json.loads((out_dir / "report.json").read_text())["forward"]
    sizes = {"pte_MB": files["pte"].stat().st_size / 1e6, "engine_build_s": report["build_seconds"], "pipeline_build_s": build}
    with torch.no_grad():
        rows.append({"variant": "eager", **_row(timed(lambda: model(*inputs), iters, warmup))})
        if use_compile:
            compiled = torch.compile(model, mode="reduce-overhead")
            rows.append({"variant": "torch.compile (CUDA graphs)", **_row(timed(lambda: compiled(*inputs), iters, warmup))})
    calls = [c for c in pte.delegate_calls(pte.load_program(files["pte"])) if c.backend == blob.BACKEND_ID]
    fp32_inputs = [x.float() if x.is_floating_point() else x for x in inputs]
    for graph in (False, True):
        stream = torch.cuda.Stream()
        runners = []
        for call in calls:
            meta, engine = blob.decode(call.payload)
            runners.append(EngineRunner(engine, meta.io_bindings, RuntimeOptions(cuda_graph=graph), stream))
        if len(runners) == 1:
            with torch.cuda.stream(stream):
                rows.append({"variant": f"raw engine{' + CUDA graph' if graph else ''}",
                             **_row(timed(lambda: runners[0](*fp32_inputs), iters, warmup))})
        method = load(files["pte"], options=RuntimeOptions(cuda_graph=graph)).method("forward")
        rows.append({"variant": f"pipeline.runtime .pte{' + CUDA graph' if graph else ''}",
                     **_row(timed(lambda: method.execute(fp32_inputs), iters, warmup))})
    return [{"model": name, "precision": precision, **r, **sizes} for r in rows]


def _row(t: tuple[float, float, float]) -> dict[str, float]:
    return {"first_ms": t[0], "median_ms": t[1], "p90_ms": t[2]}


def markdown(rows: list[dict[str, Any]]) -> str:
    cols = ["model", "precision", "variant", "median_ms", "p90_ms", "first_ms", "engine_build_s", "pte_MB"]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        lines.append("| " + " | ".join(f"{r[c]:.3f}" if isinstance(r[c], float) else str(r[c]) for c in cols) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["mobilenet_v3_small", "resnet18"])
    parser.add_argument("--precision", nargs="+", default=["fp32"])
    parser.add_argument("--iters", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--no-compile", action="store_true", help="skip the torch.compile baseline")
    parser.add_argument("--out", type=Path, help="also write the table here")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench/benchmark.py needs a CUDA GPU")
    rows = [r for m in args.models for p in args.precision for r in bench_model(m, p, args.iters, args.warmup, not args.no_compile)]
    table = markdown(rows)
    print(table)
    if args.out:
        args.out.write_text(table + "\n")


if __name__ == "__main__":
    main()
