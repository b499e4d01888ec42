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


def timed(fn: Callable[[], Any], iters: int, warmup: int, stream: Any = None) -> tuple[float, float, float]:
    """(first call, median, p90) in milliseconds, timed with CUDA events on `stream` (default: current)."""
    stream = stream or torch.cuda.current_stream()
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
        begin.record(stream)
        fn()
        end.record(stream)
        end.synchronize()
        samples.append(begin.elapsed_time(end))
    samples.sort()
    return first, statistics.median(samples), samples[int(0.9 * (len(samples) - 1))]


def bench_model(name: str, precision: str, iters: int, warmup: int, use_compile: bool,
                overrides: list[str]) -> list[dict[str, Any]]:
    """Rows for every method of one zoo model, built from the default config plus Hydra `overrides`."""
    cfg = OmegaConf.to_container(compose([f"model={name}", f"compile.precision={precision}", *overrides]), resolve=True)
    out_dir = Path(tempfile.mkdtemp())
    build_start = time.perf_counter()
    files = run_all(cfg, out_dir)
    build = time.perf_counter() - build_start
    report = json.loads((out_dir / "report.json").read_text())
    program = pte.load_program(files["pte"])
    model = objects.model(cfg).cuda()
    if precision != "fp32":  # eager baselines run in the same precision
        model = model.to(torch.float16 if precision == "fp16" else torch.bfloat16)
    rows = []
    for method, spec in cfg["model"]["methods"].items():
        inputs = [x.cuda() for x in objects.example_inputs(spec, 1)]
        sizes = {"method": method, "pte_MB": files["pte"].stat().st_size / 1e6,
                 "engine_build_s": report[method]["build_seconds"], "pipeline_build_s": build}
        calls = [c for c in pte.delegate_calls(program) if c.backend == blob.BACKEND_ID and c.method == method]
        plan = next(p for p in program.execution_plan if p.name == method)
        rows += [{**sizes, **r} for r in _bench_method(method, model, spec, inputs, files, (calls, plan), iters, warmup,
                                                        use_compile)]
    return [{"model": name, "precision": precision, **r} for r in rows]


def _bench_method(name: str, model: torch.nn.Module, spec: Any, inputs: list[torch.Tensor], files: Any,
                  delegates: tuple[list[Any], Any], iters: int, warmup: int, use_compile: bool) -> list[dict[str, Any]]:
    calls, plan = delegates
    dtype = next(model.parameters()).dtype
    eager_inputs = [x.to(dtype) if x.is_floating_point() else x for x in inputs]
    module = objects.method_module(model, spec)
    rows = []
    with torch.no_grad():
        rows.append({"variant": "eager", **_row(timed(lambda: module(*eager_inputs), iters, warmup))})
        if use_compile:
            compiled = torch.compile(module, mode="reduce-overhead")
            rows.append({"variant": "torch.compile (CUDA graphs)", **_row(timed(lambda: compiled(*eager_inputs), iters, warmup))})
    for graph in (False, True):
        stream = torch.cuda.Stream()
        if len(calls) == 1:
            meta, engine = blob.decode(calls[0].payload)
            runner = EngineRunner(engine, meta.io_bindings, RuntimeOptions(cuda_graph=graph), stream)
            position = {value: i for i, value in enumerate(plan.inputs)}
            args = calls[0].args[: len(meta.inputs)]
            by_position = [inputs[position[a]] for a in args] if all(a in position for a in args) else None
            if by_position is not None:
                rows.append({"variant": f"raw engine{' + CUDA graph' if graph else ''}",
                             **_row(timed(lambda: runner(*by_position), iters, warmup, stream))})
        method = load(files["pte"], options=RuntimeOptions(cuda_graph=graph)).method(name)
        with torch.cuda.stream(method.stream):  # called from its stream, as the raw engine is driven on its own
            rows.append({"variant": f"pipeline.runtime .pte{' + CUDA graph' if graph else ''}",
                         **_row(timed(lambda: method.execute(inputs), iters, warmup, method.stream))})
    return rows


def _row(t: tuple[float, float, float]) -> dict[str, float]:
    return {"first_ms": t[0], "median_ms": t[1], "p90_ms": t[2]}


def markdown(rows: list[dict[str, Any]]) -> str:
    cols = ["model", "method", "precision", "variant", "median_ms", "p90_ms", "first_ms", "engine_build_s", "pte_MB"]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        lines.append("| " + " | ".join(f"{r[c]:.3f}" if isinstance(r[c], float) else str(r[c]) for c in cols) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["mlp", "mobilenet_v3_small", "resnet18", "tiny_decoder"])
    parser.add_argument("--precision", nargs="+", default=["fp32"])
    parser.add_argument("--iters", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--no-compile", action="store_true", help="skip the torch.compile baseline")
    parser.add_argument("--override", nargs="*", default=[], help="Hydra overrides, e.g. compile.optimization_level=5")
    parser.add_argument("--out", type=Path, help="also write the table here")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench/benchmark.py needs a CUDA GPU")
    rows = []
    for model in args.models:
        for precision in args.precision:
            try:
                rows += bench_model(model, precision, args.iters, args.warmup, not args.no_compile, args.override)
            except Exception as exc:  # one broken model must not cost the whole table
                print(f"{model} {precision}: {type(exc).__name__}: {exc}")
    table = markdown(rows)
    print(table)
    if args.out:
        args.out.write_text(table + "\n")


if __name__ == "__main__":
    main()
