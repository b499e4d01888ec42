"""GPU benchmark: per model, median and p90 latency of eager PyTorch, torch.compile (CUDA graphs),
the raw TensorRT engine(s) driven directly (with and without a CUDA graph; on device tensors, and on
host tensors copied in and out, as ExecuTorch's runtime takes and gives them), pipeline.runtime
on the .pte (engines step by step, each with and without its CUDA graph, and the whole method as one
CUDA graph: `RuntimeOptions(method_graph=True)`), and ExecuTorch's own runtime with the native
TensorRT delegate (from Python, and the C++ runner `pipeline-runner run --repeat`, each with and
without TensorRT-RTX's CUDA graph; the runner also with each engine call one graph,
`--method-graph`); plus compile seconds (engine builds) and file sizes. Prints a markdown table.
Variants take turns in blocks of calls, so that noise on the machine hits them alike.

    python -m bench.benchmark --models mobilenet_v3_small resnet18 --precision fp32 fp16
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from pipeline.config import objects
from pipeline.config.compose import compose, typed
from pipeline.coverage.suite import first_output
from pipeline.delegate import blob, pte
from pipeline.errors import RuntimeUnavailableError
from pipeline.runtime import executorch_runtime, load
from pipeline.runtime.engine_runner import EngineRunner
from pipeline.runtime.native_library import run_runner
from pipeline.runtime.options import RuntimeOptions
from pipeline.steps import run_all


@dataclass(frozen=True)
class Timing:
    """Timed calls per variant, untimed warm-up calls, and calls per turn (see `timed`)."""

    iters: int = 200
    warmup: int = 50
    block: int = 20


@dataclass
class Variant:
    """One way of running a method: a name, a zero-argument call, the stream it runs on; and, once
    timed, its first call and its samples in milliseconds."""

    name: str
    fn: Callable[[], Any]
    stream: Any = None
    first_ms: float = 0.0
    samples: list[float] = field(default_factory=list)


def timed(variants: list[Variant], timing: Timing) -> None:
    """First call and warm-up per variant, then `timing.iters` timed calls per variant, in blocks
    of `timing.block` calls taking turns: noise on the machine (other work, clock changes) spreads over
    every variant alike, while each block runs hot as a steady-state loop does (its first call,
    after another variant's, is the cold one). Each call is timed with CUDA events on the
    variant's stream (default: the default stream) around one synced call."""
    for v in variants:
        torch.cuda.synchronize()
        start = time.perf_counter()
        with torch.cuda.stream(v.stream) if v.stream is not None else contextlib.nullcontext():
            v.fn()
            torch.cuda.synchronize()
            v.first_ms = (time.perf_counter() - start) * 1e3
            for _ in range(timing.warmup):
                v.fn()
    for done in range(0, timing.iters, timing.block):
        for v in variants:
            stream = v.stream if v.stream is not None else torch.cuda.default_stream()
            with torch.cuda.stream(stream):
                for _ in range(min(timing.block, timing.iters - done)):
                    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    begin.record(stream)
                    v.fn()
                    end.record(stream)
                    end.synchronize()
                    v.samples.append(begin.elapsed_time(end))


# Kernel classes of a profile, by name (first match): the project's products, TensorRT's and cuBLAS's
# products, attention, and the rest (norms, rotary, cache writes, copies between layouts).
KERNEL_CLASSES = (("products (ours)", re.compile(r"^dp_(fp16|int4|fp8)_t\d")),  # the first that matches a name
                  ("attention (ours)", re.compile(r"^da_(split|combine)$")),
                  ("attention", re.compile(r"fmha|attention|mha|softmax|flash", re.I)),  # TensorRT's `_gemv_mha`
                  ("products", re.compile(r"gemm|gemv|xmma|cutlass|matmul|sm\d\d_|splitK", re.I)))


def kernel_class(name: str) -> str:
    return next((label for label, pattern in KERNEL_CLASSES if pattern.search(name)), "the rest")


def kernel_profile(run: Callable[[], Any], calls: int, top: int = 10) -> dict[str, Any]:
    """What the GPU did during `run`, per call of the `calls` it makes: bytes copied, copies, kernels
    and graph launches, the kernels' summed time, by class (`KERNEL_CLASSES`), and the `top` kernels by
    time (name: [µs, count])."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        run()
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        prof.export_chrome_trace(f.name)
        events = json.loads(Path(f.name).read_text()).get("traceEvents", [])
    copies = [e for e in events if e.get("cat") in ("gpu_memcpy", "gpu_memset")]
    kernels = [e for e in events if e.get("cat") == "kernel"]
    launches = [e for e in events if e.get("cat") == "cuda_runtime" and "GraphLaunch" in str(e.get("name"))]
    by_name: dict[str, list[float]] = {}
    for e in kernels:
        by_name.setdefault(str(e.get("name"))[:80], []).append(float(e.get("dur", 0.0)))
    longest = sorted(by_name.items(), key=lambda kv: -sum(kv[1]))[:top]
    return {"copied_bytes_per_step": sum(float(e.get("args", {}).get("bytes", 0)) for e in copies) / calls,
            "copies_per_step": len(copies) / calls, "kernels_per_step": len(kernels) / calls,
            "graph_launches_per_step": len(launches) / calls,
            "kernel_us_per_step": sum(sum(d) for d in by_name.values()) / calls,
            "kernel_us_per_step_by_class": {label: round(sum(sum(d) for n, d in by_name.items() if kernel_class(n) == label)
                                                         / calls, 1) for label in [*(c for c, _ in KERNEL_CLASSES), "the rest"]},
            "top_kernels_us_per_step": {name: [round(sum(d) / calls, 1), len(d) / calls] for name, d in longest}}


def bench_model(name: str, precision: str, timing: Timing, use_compile: bool,
                overrides: list[str]) -> list[dict[str, Any]]:
    """Rows for every method of one zoo model, built from the default config plus Hydra `overrides`."""
    cfg = typed(compose([f"model={name}", f"compile.precision={precision}", *overrides]))
    out_dir = Path(tempfile.mkdtemp())
    build_start = time.perf_counter()
    files = run_all(cfg, out_dir)
    build = time.perf_counter() - build_start
    compile_seconds = json.loads((out_dir / "timings.json").read_text())  # engines build in the compile step
    file = pte.read(files["pte"], files.get("ptd"))
    program = file.program
    model = objects.model(cfg).cuda()
    if precision != "fp32":  # eager baselines run in the same precision
        model = model.to(torch.float16 if precision == "fp16" else torch.bfloat16)
    rows = []
    for method, spec in cfg.model.methods.items():
        inputs = [x.cuda() for x in objects.example_inputs(spec, 1)]
        sizes = {"method": method, "pte_MB": files["pte"].stat().st_size / 1e6,
                 "ptd_MB": files["ptd"].stat().st_size / 1e6 if "ptd" in files else 0.0,
                 "compile_s": compile_seconds[method], "pipeline_build_s": build}
        calls = [c for c in pte.delegate_calls(program) if c.backend == blob.BACKEND_ID and c.method == method]
        plan = next(p for p in program.execution_plan if p.name == method)
        rows += [{**sizes, **r} for r in _bench_method(method, model, spec, inputs, file, files, (calls, plan), timing,
                                                        use_compile)]
    return [{"model": name, "precision": precision, **r} for r in rows]


def _bench_method(name: str, model: torch.nn.Module, spec: Any, inputs: list[torch.Tensor], file: Any, files: Any,
                  delegates: tuple[list[Any], Any], timing: Timing, use_compile: bool) -> list[dict[str, Any]]:
    calls, plan = delegates
    dtype = next(model.parameters()).dtype
    eager_inputs = [x.to(dtype) if x.is_floating_point() else x for x in inputs]
    module = objects.method_module(model, spec)
    variants = [Variant("eager", lambda: module(*eager_inputs))]
    if use_compile:
        compiled = torch.compile(module, mode="reduce-overhead")
        variants.append(Variant("torch.compile (CUDA graphs)", lambda: compiled(*eager_inputs)))
    for graph in (False, True):
        suffix = " + CUDA graph" if graph else ""
        if len(calls) == 1:
            meta, engine = pte.engine(file, calls[0].payload)
            stream = torch.cuda.Stream()
            runner = EngineRunner(engine, meta.io_bindings, RuntimeOptions(cuda_graph=graph), stream)
            position = {value: i for i, value in enumerate(plan.inputs)}
            args = calls[0].args[: len(meta.inputs)]
            if all(a in position for a in args):
                by_position = [inputs[position[a]] for a in args]
                variants.append(Variant(f"raw engine{suffix}", lambda r=runner, a=by_position: r(*a), stream))
                # What ExecuTorch's runtime is handed and hands back: host tensors, copied in and out.
                host = [x.cpu() for x in by_position]
                variants.append(Variant(f"raw engine{suffix}, host copies", lambda r=runner, a=host: [
                    o.cpu() for o in r(*[x.cuda() for x in a])], stream))
        method = load(files["pte"], files.get("ptd"), options=RuntimeOptions(cuda_graph=graph)).method(name)
        # called from its stream, as the raw engine is driven on its own
        variants.append(Variant(f"pipeline.runtime .pte{suffix}", lambda m=method: m.execute(inputs), method.stream))
        try:
            native = executorch_runtime.load(files["pte"], files.get("ptd"), RuntimeOptions(cuda_graph=graph)).method(name)
        except RuntimeUnavailableError as exc:  # ExecuTorch's Python runtime needs its own torch
            print(f"ExecuTorch runtime (Python) skipped: {exc}")
        else:
            host_inputs = [x.cpu() for x in inputs]
            variants.append(Variant(f"ExecuTorch runtime (Python) .pte{suffix}",
                                    lambda m=native, a=host_inputs: m.execute(a, copy_outputs=False)))
    whole = load(files["pte"], files.get("ptd"), options=RuntimeOptions(method_graph=True)).method(name)
    variants.append(Variant("pipeline.runtime .pte + method graph", graph_call(whole, inputs), whole.stream))
    with torch.no_grad():
        timed(variants, timing)
    rows = [{"variant": v.name, **_row(v)} for v in variants]
    return rows + [runner_row(files, name, inputs, flag, timing) for flag in RUNNER_GRAPHS]


RUNNER_GRAPHS = {"": None, " + CUDA graph": "--cuda-graph", " + method graph": "--method-graph"}  # label: flag


def graph_call(method: Any, inputs: list[torch.Tensor]) -> Callable[[], Any]:
    """A call of a `method_graph` method as a caller that keeps its inputs in the method's own buffers
    (as generate does) makes it: one launch, outputs left in planned memory."""
    buffers = [method.input_buffer(i, tuple(x.shape)) for i, x in enumerate(inputs)]
    if all(b is not None for b in buffers):
        for b, x in zip(buffers, inputs):
            b.copy_(x)
    else:  # an input the plan gives no memory: the inputs are passed as they are
        buffers = inputs
    return lambda: method.execute(buffers, copy_outputs=False)


def runner_row(files: Any, method: str, inputs: list[torch.Tensor], label: str, timing: Timing) -> dict[str, Any]:
    """The Python-free runner's median over `timing.iters` calls (`pipeline-runner run --repeat`), host
    inputs copied in and outputs out each call, as ExecuTorch's C++ runtime is used."""
    with tempfile.TemporaryDirectory() as tmp:
        args: list[object] = ["run", files["pte"], "--method", method, "--output-dir", tmp, "--repeat", timing.iters]
        args += ["--ptd", files["ptd"]] if "ptd" in files else []
        for i, x in enumerate(inputs):
            np.save(Path(tmp) / f"in{i}.npy", x.cpu().numpy())
            args += ["--input", Path(tmp) / f"in{i}.npy"]
        done = run_runner(*args, *filter(None, [RUNNER_GRAPHS[label]]))
        if done.returncode != 0:
            raise RuntimeError(f"pipeline-runner failed: {done.stderr.strip()}")
    median = float(re.search(r"median ([0-9.]+) ms", done.stdout).group(1))  # type: ignore[union-attr]
    return {"variant": "pipeline-runner (C++, no Python)" + label, "first_ms": float("nan"),
            "median_ms": median, "p90_ms": float("nan")}


def _row(v: Variant) -> dict[str, float]:
    samples = sorted(v.samples)
    return {"first_ms": v.first_ms, "median_ms": statistics.median(samples), "p90_ms": samples[int(0.9 * (len(samples) - 1))]}


def markdown(rows: list[dict[str, Any]]) -> str:
    cols = ["model", "method", "precision", "variant", "median_ms", "p90_ms", "first_ms", "compile_s", "pte_MB", "ptd_MB"]
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
    parser.add_argument("--block", type=int, default=20, help="calls per variant per turn (variants take turns)")
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
                rows += bench_model(model, precision, Timing(args.iters, args.warmup, args.block), not args.no_compile,
                                    args.override)
            except Exception as exc:  # one broken model must not cost the whole table
                print(f"{model} {precision}: {type(exc).__name__}: {exc}")
    table = markdown(rows)
    print(table)
    if args.out:
        args.out.write_text(table + "\n")


def rel_error(out: Any, ref: Any) -> float:
    """Largest absolute error relative to the reference's largest magnitude (first outputs)."""
    got, want = first_output(out), first_output(ref)
    return float(((got.float() - want.float()).abs().max() / want.float().abs().max().clamp_min(1e-12)).item())


if __name__ == "__main__":
    main()
