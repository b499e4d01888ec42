"""Where the runtime's time goes per call, against the raw engine (GPU): host time of one call
(Python + launches, no sync), span on the GPU (CUDA events around one synced call), and throughput
time (many calls back to back, so host work hides behind the GPU). Prints a markdown table.

    python -m bench.overhead --model mobilenet_v3_small --precision fp32
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from pipeline.config import objects
from pipeline.config.compose import compose, typed
from pipeline.delegate import blob, pte
from pipeline.runtime import load
from pipeline.runtime.engine_runner import EngineRunner
from pipeline.runtime.options import RuntimeOptions
from pipeline.steps import run_all


def measure(fn: Callable[[], Any], stream: Any, iters: int) -> dict[str, float]:
    """Median host microseconds per call, median GPU span (ms), and ms per call back to back."""
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    host, span = [], []
    for _ in range(iters):
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record(stream)
        t0 = time.perf_counter()
        fn()
        host.append((time.perf_counter() - t0) * 1e6)
        end.record(stream)
        end.synchronize()
        span.append(begin.elapsed_time(end))
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    begin.record(stream)
    for _ in range(iters):
        fn()
    end.record(stream)
    end.synchronize()
    return {"host_us": statistics.median(host), "span_ms": statistics.median(span),
            "back_to_back_ms": begin.elapsed_time(end) / iters}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="mobilenet_v3_small")
    parser.add_argument("--precision", default="fp32")
    parser.add_argument("--iters", type=int, default=300)
    args = parser.parse_args()
    cfg = typed(compose([f"model={args.model}", f"compile.precision={args.precision}"]))
    files = run_all(cfg, Path(tempfile.mkdtemp()))
    file = pte.read(files["pte"], files.get("ptd"))
    program = file.program
    method_name = next(iter(cfg.model.methods))
    (call,) = [c for c in pte.delegate_calls(program) if c.backend == blob.BACKEND_ID and c.method == method_name]
    meta, engine = pte.engine(file, call.payload)
    x = [t.cuda() for t in objects.example_inputs(cfg.model.methods[method_name], 1)]
    options = RuntimeOptions(cuda_graph=True)
    loaded = load(files["pte"], files.get("ptd"), options=options)
    method = loaded.method(method_name)
    stream = method.stream
    runner = EngineRunner(engine, meta.io_bindings, options, stream)
    staged = [t.clone() for t in x]
    outs = runner(*staged)
    rows = {}
    with torch.cuda.stream(stream):
        rows["raw engine (new outputs)"] = measure(lambda: runner(*x), stream, args.iters)
        rows["raw engine (fixed outputs)"] = measure(lambda: runner(*staged, outputs=outs), stream, args.iters)
        rows["copy in + engine + clone out"] = measure(
            lambda: (staged[0].copy_(x[0]), runner(*staged, outputs=outs), outs[0].clone()), stream, args.iters)
        rows[".pte execute"] = measure(lambda: method.execute(x), stream, args.iters)
        rows[".pte execute (no output copy)"] = measure(lambda: method.execute(x, copy_outputs=False), stream, args.iters)
        rows["enter + leave only"] = measure(lambda: loaded.leave(loaded.enter()), stream, args.iters)
    rows[".pte execute from the default stream"] = measure(lambda: method.execute(x), stream, args.iters)
    print(f"{args.model} {args.precision}, CUDA graph on\n")
    print("| variant | host_us | span_ms | back_to_back_ms |\n|---|---|---|---|")
    for name, r in rows.items():
        print(f"| {name} | {r['host_us']:.1f} | {r['span_ms']:.3f} | {r['back_to_back_ms']:.3f} |")


if __name__ == "__main__":
    main()
