"""The coverage suite on a GPU, in one command: every suite model is built through the pipeline
(`pipeline.coverage`, engines built on this machine) and by TensorRT's ONNX parser from the same
model; then, one model at a time on the GPU, its `.pte` runs against eager PyTorch (max error
relative to the reference's largest magnitude, against `runtime.max_rel_error`; a model whose eager
output moves less than that from one input to another cannot fail the check, and is not counted
as correct), and our engine
and the ONNX-parser engine are timed side by side (`bench/benchmark.py`'s `timed`), each as a CUDA
graph (a program of several engines: its `.pte` as one method graph, the inputs kept in the method's
own buffers, as `bench.benchmark` times it; and again with its portable kernels one by one,
`unfused_ms`).

Builds and measurements overlap: a model is measured as soon as both its builds are done, by
`--workers-per-gpu` processes on each GPU that take turns on it (one at a time runs on the GPU;
the others load and build eager models on the CPU meanwhile; with `--no-parser` nothing is timed
and they share the GPU). A measured model's programs are
deleted (`--keep-programs` keeps them). Resumable: results stay under `--out`; a second run only
does what is missing. Writes `<out>/coverage-gpu-<precision>.md` and `.json` after every model.

The eager reference runs in strict fp32 (TF32 off). TF32 off in the engines too (ours and the
parser's, which takes the same builder settings): the variable for the whole command, so that the
builds and the runs both see it; TensorRT-RTX ignores the builder's TF32 flag
(`pipeline/engine/build_env.py`):

    python -m bench.coverage_gpu --precision fp32 --jobs 24 --workers-per-gpu 2
    NVIDIA_TF32_OVERRIDE=0 python -m bench.coverage_gpu timm/lcnet_050 --no-parser
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import multiprocessing
import os
import shutil
import statistics
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import onnx_reference
from bench.benchmark import Timing, Variant, graph_call, kernel_profile, rel_error, timed  # noqa: E402
from pipeline.cli import reported  # noqa: E402
from pipeline.coverage.run import entry_config, kept_row, row_key, run_suite, suite_config  # noqa: E402
from pipeline.coverage.suite import Entry, select  # noqa: E402
from pipeline.files import write_bytes, write_json  # noqa: E402

log = logging.getLogger("bench.coverage_gpu")


@dataclass(frozen=True)
class Setup:
    """What every build and measurement of one run shares: precision, config overrides, folder."""

    precision: str
    overrides: tuple[str, ...]
    out: Path
    kernels: int = 0  # > 0: also the kernels each engine runs, this many by time (`kernel_profile`)
    parser: bool = True  # also the ONNX parser's engine of each model, timed against ours

    @functools.cached_property
    def config(self) -> Any:
        return suite_config(self.precision, self.overrides)

    def folder(self, entry: Entry) -> Path:
        return self.out / "programs" / entry.name.replace("/", "__") / self.precision

    def key(self, entry: Entry) -> str:
        return row_key(entry, self.precision, self.overrides)


def onnx_engine(setup: Setup, entry: Entry) -> None:
    """The ONNX parser's engine of `entry` in its folder (`onnx_reference.build_engine`)."""
    onnx_reference.build_engine(entry, setup.precision, setup.overrides, setup.folder(entry))


def measure(setup: Setup, entry: Entry, row: dict[str, Any], iters: int,
            gpu: AbstractContextManager[Any] | None = None) -> dict[str, Any]:
    """Correctness of the `.pte` against eager, and our engine against the ONNX parser's (CUDA graphs).
    `gpu` is held while anything runs on the GPU (the eager model is built before), so that timings
    see the GPU alone; without the parser nothing is timed, and the workers share the GPU."""
    from pipeline.config import objects

    folder, precision = setup.folder(entry), setup.precision
    tolerance = float(setup.config.runtime.max_rel_error)
    cfg = entry_config(entry, setup.precision, setup.overrides)
    pte_path = folder / "program" / f"{cfg.model.name}.pte"
    ptd = pte_path.with_suffix(".ptd")
    spec = cfg.model.methods["forward"]
    if setup.parser and not any((folder / f).exists() for f in ("onnx.engine", "onnx.error")):
        onnx_engine(setup, entry)  # its build was kept from a run that stopped
    host_inputs = objects.example_inputs(spec, 1)
    other_inputs = objects.example_inputs(spec, 2)  # how much the output depends on the input
    host_model = objects.model(cfg)
    with (gpu if setup.parser else None) or nullcontext():
        try:
            return _measure_on_gpu(host_model, host_inputs, other_inputs, pte_path, ptd, row, precision, folder, iters,
                                   tolerance, setup.kernels)
        finally:
            import gc

            import torch

            gc.collect()
            torch.cuda.empty_cache()  # the next worker's turn gets the whole GPU


def _measure_on_gpu(host_model: Any, host_inputs: Any, other_inputs: Any, pte_path: Path, ptd: Path, row: dict[str, Any],
                    precision: str, folder: Path, iters: int, tolerance: float, kernels: int) -> dict[str, Any]:
    import torch

    from pipeline.delegate import blob, pte
    from pipeline.runtime import load
    from pipeline.runtime.engine_runner import EngineRunner
    from pipeline.runtime.options import RuntimeOptions

    inputs = [x.cuda() for x in host_inputs]
    model = host_model.cuda()
    with torch.no_grad():
        with strict_fp32():
            ref = model(*inputs)
            other = model(*[x.cuda() for x in other_inputs])
        loose = model(*inputs)  # PyTorch's defaults: cuDNN convolutions in TF32
        # Whole: the engine as a CUDA graph; otherwise engines and the kernels between them as one graph.
        options = RuntimeOptions(cuda_graph=True) if row["lowered_whole"] else RuntimeOptions(method_graph=True)
        ours_program = load(pte_path, ptd if ptd.exists() else None, options=options)
        method = ours_program.method("forward")
        rel = rel_error(method.execute(inputs), ref)
    # eager_tf32_error: how far PyTorch's own default (TF32) execution is from strict fp32, the
    # model's sensitivity to TF32 with these weights.
    # input_sensitivity: how far eager's output on a second input is from `ref`. An output that moves
    # less than the tolerance from one input to another (a constant head, vanishing activations) would
    # match an engine that got the layers before it wrong: such a model is not counted as correct.
    sensitivity = rel_error(other, ref)
    result: dict[str, Any] = {"rel_error": rel, "correct": rel <= tolerance < sensitivity, "tolerance": tolerance,
                              "eager_tf32_error": rel_error(loose, ref), "input_sensitivity": sensitivity}
    file = ours_program.file  # the file load() read and checked
    calls = [c for c in pte.delegate_calls(file.program) if c.backend == blob.BACKEND_ID]
    stream = torch.cuda.Stream()
    if len(calls) == 1 and row["lowered_whole"]:
        meta, engine = pte.engine(file, calls[0].payload)
        runner = EngineRunner(engine, meta.io_bindings, RuntimeOptions(cuda_graph=True), stream)
        ours = lambda: runner(*inputs)  # noqa: E731
        result["ours"] = "engine"
    else:
        ours, stream = graph_call(method, inputs) if not row["lowered_whole"] else (lambda: method.execute(inputs)), method.stream
        result["ours"] = ".pte, method graph" if not row["lowered_whole"] else ".pte"
    extra = []
    if not row["lowered_whole"]:  # also its portable kernels one by one (`runtime.fuse_kernels=false`)
        apart = load(pte_path, ptd if ptd.exists() else None,
                     options=RuntimeOptions(method_graph=True, fuse_kernels=False)).method("forward")
        extra = [Variant("unfused", graph_call(apart, inputs), apart.stream)]
    onnx = folder / "onnx.engine"
    if onnx.exists():
        onnx_runner = onnx_reference.runner(onnx.read_bytes(), stream)
        theirs = lambda: onnx_runner(*[x.to(onnx_runner.dtype) if x.is_floating_point() else x for x in inputs])  # noqa: E731
        variants = [Variant("ours", ours, stream), Variant("onnx", theirs, stream), *extra]
        with torch.no_grad():
            timed(variants, Timing(iters=iters, warmup=20, block=10))
        ours_ms, theirs_ms, *unfused_ms = (statistics.median(v.samples) for v in variants)
        result.update(ours_ms=ours_ms, onnx_ms=theirs_ms, ratio=ours_ms / theirs_ms)
        if unfused_ms:
            result.update(unfused_ms=unfused_ms[0], unfused_ratio=unfused_ms[0] / theirs_ms)
        if kernels:  # where the two engines differ: their kernels, side by side in the .json
            for v in variants:
                result[f"{v.name}_kernels"] = kernel_profile(lambda f=v.fn: _calls(f, stream, 10), 10, kernels)
        with torch.no_grad():
            outs = theirs()
            stream.synchronize()  # the engine ran on `stream`: read its outputs once it is done
            result["onnx_rel_error"] = rel_error(outs, ref)
    else:
        error = folder / "onnx.error"
        result["onnx_error"] = error.read_text() if error.exists() else "no ONNX engine"
    return result


def _calls(fn: Any, stream: Any, n: int) -> None:
    for _ in range(n):
        fn()
    stream.synchronize()


@contextmanager
def strict_fp32() -> Iterator[None]:
    """PyTorch's own fp32, TF32 off for matmuls and cuDNN convolutions (cuDNN's default is on)."""
    import torch

    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def markdown(rows: list[dict[str, Any]], precision: str) -> str:
    ratios = [r["ratio"] for r in rows if "ratio" in r]
    correct = sum(bool(r.get("correct")) for r in rows)
    lines = [f"{correct} of {len(rows)} models match eager within their tolerance at {precision}; "
             f"ours / ONNX-parser engine over {len(ratios)} models: median "
             f"{statistics.median(ratios) if ratios else float('nan'):.3f}, max {max(ratios, default=float('nan')):.3f}, "
             f"{sum(r > 1.10 for r in ratios)} above 1.10.", "",
             "| model | lowered whole | rel. error | ONNX rel. error | eager TF32 rel. error | input sensitivity | correct | "
             "ours | ours ms | ONNX ms | ratio |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    nan = float("nan")
    for r in rows:
        lines.append(f"| {r['model']} | {'yes' if r.get('lowered_whole') else 'no'} | {r.get('rel_error', nan):.2e} | "
                     f"{r.get('onnx_rel_error', nan):.2e} | {r.get('eager_tf32_error', nan):.2e} | "
                     f"{r.get('input_sensitivity', nan):.2e} | {r.get('correct', r.get('status'))}"
                     f"{' (unchecked: the output hardly depends on the input)' if _unchecked(r) else ''} | {r.get('ours', '')} | "
                     f"{r.get('ours_ms', float('nan')):.3f} | {r.get('onnx_ms', float('nan')):.3f} | "
                     f"{r.get('ratio', float('nan')):.3f} |" + (f" {r['onnx_error']}" if "onnx_error" in r else ""))
    return "\n".join(lines) + "\n"


def _unchecked(r: dict[str, Any]) -> bool:
    return "input_sensitivity" in r and r["input_sensitivity"] <= r["tolerance"]


def _ready(setup: Setup, entry: Entry, builds_done: bool) -> dict[str, Any] | None:
    """The model's current row, once both its builds are done (or no build is running any more)."""
    row = kept_row(setup.out, entry, setup.precision, setup.key(entry))
    if row is None or row["status"] != "ok":
        return None
    if builds_done or not setup.parser or any((setup.folder(entry) / f).exists() for f in ("onnx.engine", "onnx.error")):
        return row
    return None


_GPU: Any = None  # this worker's turn on its GPU


def _worker_init(gpu: int, lock: Any) -> None:
    global _GPU
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")  # the GPUs this run was given, if restricted
    os.environ["CUDA_VISIBLE_DEVICES"] = visible.split(",")[gpu] if visible else str(gpu)  # before CUDA starts
    _GPU = lock
    logging.basicConfig(level=logging.WARNING)


def _measure_job(setup: Setup, entry: Entry, row: dict[str, Any], iters: int) -> dict[str, Any]:
    try:
        return measure(setup, entry, row, iters, _GPU)
    except Exception as exc:  # recorded; the suite goes on
        return {"status": f"{type(exc).__name__}: {str(exc).strip()[:300]}"}


def _pool(gpu: int, per_gpu: int) -> ProcessPoolExecutor:
    """`per_gpu` fresh interpreters that see only this GPU and take turns on it."""
    spawn = multiprocessing.get_context("spawn")
    return ProcessPoolExecutor(per_gpu, mp_context=spawn, initializer=_worker_init, initargs=(gpu, spawn.Lock()))


class Measurements:
    """Models measured so far (kept in `<out>/measured-<precision>.json`) and those on the GPUs."""

    def __init__(self, setup: Setup, entries: list[Entry], gpus: int, per_gpu: int, iters: int,
                 keep_programs: bool) -> None:
        self.setup, self.entries, self.per_gpu, self.iters, self.keep_programs = setup, entries, per_gpu, iters, keep_programs
        self.path = setup.out / f"measured-{setup.precision}.json"
        self.done: dict[str, Any] = json.loads(self.path.read_text()) if self.path.exists() else {}
        self.waiting = [e for e in entries if e.name not in self.done]
        self.pools = [_pool(gpu, per_gpu) for gpu in range(gpus)]
        self.pending: dict[str, tuple[Entry, Future[dict[str, Any]], int]] = {}
        self.crashes: dict[str, int] = {}

    def submit_ready(self, builds_done: bool) -> None:
        for entry in list(self.waiting):
            row = _ready(self.setup, entry, builds_done)
            if row is None:
                continue
            self.waiting.remove(entry)
            busy = [sum(1 for *_, g in self.pending.values() if g == i) for i in range(len(self.pools))]
            gpu = busy.index(min(busy))
            self.pending[entry.name] = (entry, self.pools[gpu].submit(_measure_job, self.setup, entry, row, self.iters), gpu)

    def collect(self) -> None:
        for name, (entry, future, gpu) in list(self.pending.items()):
            if not future.done():
                continue
            del self.pending[name]
            if isinstance(future.exception(), BrokenProcessPool):
                # A worker died and took its pool's other models down: a fresh pool, and each of
                # them measured again once; a second crash is the model's result.
                if self.pools[gpu]._broken:  # type: ignore[attr-defined]
                    self.pools[gpu] = _pool(gpu, self.per_gpu)
                self.crashes[name] = self.crashes.get(name, 0) + 1
                if self.crashes[name] < 2:
                    self.waiting.append(entry)
                    continue
                self.done[name] = {"status": "the measuring process crashed, twice"}
            else:
                self.done[name] = future.result()
            log.info("measured %s %s", name, self.done[name])
            write_json(self.path, self.done)
            if not self.keep_programs:
                shutil.rmtree(self.setup.folder(entry) / "program", ignore_errors=True)
                (self.setup.folder(entry) / "onnx.engine").unlink(missing_ok=True)
            self.write()

    def finished(self, builds_done: bool, late: bool) -> bool:
        if not builds_done or self.pending:
            return False
        return late or not any(_ready(self.setup, e, True) for e in self.waiting)

    def write(self) -> str:
        setup = self.setup
        rows = [row for e in self.entries if (row := kept_row(setup.out, e, setup.precision, setup.key(e))) is not None]
        table = [{**row, **self.done.get(row["model"], {})} for row in rows]
        text = markdown(table, setup.precision + "".join(f" {o}" for o in setup.overrides))
        write_bytes(setup.out / f"coverage-gpu-{setup.precision}.md", text.encode())
        write_json(setup.out / f"coverage-gpu-{setup.precision}.json", {"overrides": list(setup.overrides), "rows": table})
        return text

    def close(self) -> None:
        for pool in self.pools:
            pool.shutdown()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("models", nargs="*")
    parser.add_argument("--slice", default="all")
    parser.add_argument("--precision", default="fp32")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="a config override of every build, e.g. compile.optimization_level=5 (repeatable)")
    parser.add_argument("--jobs", type=int, default=8, help="builds at a time")
    parser.add_argument("--gpus", type=int, default=None, help="GPUs to measure on (default: all)")
    parser.add_argument("--workers-per-gpu", type=int, default=2)
    parser.add_argument("--iters", type=int, default=100)
    parser.add_argument("--timeout", type=float, default=3600, help="seconds one model's builds may take")
    parser.add_argument("--out", type=Path, default=Path("build/coverage-gpu"))
    parser.add_argument("--deadline", type=float, default=None, help="seconds after which no new model is started")
    parser.add_argument("--skip-measure", action="store_true", help="only build (both ways)")
    parser.add_argument("--measure-only", action="store_true", help="build nothing; measure what is built")
    parser.add_argument("--keep-programs", action="store_true", help="keep a model's programs once it is measured")
    parser.add_argument("--no-parser", action="store_true",
                        help="no ONNX parser engines: our .pte against eager only (correctness, no timing)")
    parser.add_argument("--kernels", type=int, default=0, metavar="N",
                        help="also profile both engines: their N longest-running kernels, in the .json")
    args = parser.parse_args()
    if args.kernels < 0:
        parser.error(f"--kernels {args.kernels}: give how many kernels to list, 0 or more")
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    start = time.monotonic()
    setup = Setup(args.precision, tuple(args.overrides), args.out, args.kernels, not args.no_parser)
    with reported():
        # Single-forward models; the decoders' prefill and decode are checked teacher-forced on the GPU
        # by tests/test_decoders.py.
        entries = [e for e in select(args.models or None, args.slice) if "forward" in e.model["methods"]]
        setup.config  # noqa: B018  (bad overrides: one line, before anything starts)
    builds = threading.Thread(target=run_suite, args=(entries, args.precision, args.out, args.jobs, args.timeout),
                              kwargs={"keep": True, "deadline": 0 if args.measure_only else args.deadline,
                                      "after": functools.partial(onnx_engine, setup) if setup.parser else None,
                                      "overrides": setup.overrides})
    builds.start()
    if args.skip_measure:
        builds.join()
        return 0
    import torch

    measurements = Measurements(setup, entries, args.gpus or torch.cuda.device_count(), args.workers_per_gpu,
                                args.iters, args.keep_programs)
    while True:
        done = not builds.is_alive()
        late = args.deadline is not None and time.monotonic() - start > args.deadline
        if not late:
            measurements.submit_ready(done)
        measurements.collect()
        if measurements.finished(done, late):
            break
        time.sleep(1.0)
    measurements.close()
    print(measurements.write())
    return 0


if __name__ == "__main__":
    sys.exit(main())
