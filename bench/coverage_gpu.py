"""The coverage suite on a GPU, in one command: every suite model is built through the pipeline
(`pipeline.coverage`, engines built on this machine) and by TensorRT's ONNX parser from the same
model; then, one model at a time on the GPU, its `.pte` runs against eager PyTorch (max error
relative to the reference's largest magnitude, against `runtime.max_rel_error`), and our engine
and the ONNX-parser engine are timed side by side (`bench/benchmark.py`'s `timed`), each as a CUDA graph (a program of several
engines: its `.pte` with CUDA graphs). Resumable: results stay under `--out`; a second run only
does what is missing. Prints and writes `<out>/coverage-gpu-<precision>.md` and `.json`.

    python bench/coverage_gpu.py --precision fp32 --jobs 12 --deadline 540
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.benchmark import Timing, Variant, timed  # noqa: E402
from pipeline.config.compose import compose  # noqa: E402
from pipeline.coverage.run import run_suite  # noqa: E402
from pipeline.coverage.suite import Entry, select  # noqa: E402
from pipeline.files import write_bytes, write_json  # noqa: E402

log = logging.getLogger("bench.coverage_gpu")


def onnx_engine(entry: Entry, precision: str, folder: Path) -> None:
    """Export the suite model to ONNX (TorchScript exporter, opset 17) and build the ONNX parser's
    engine with a default builder config (fp16 precision: the model in fp16, as TensorRT-RTX builds
    strongly typed networks); writes `<folder>/onnx.engine` or `<folder>/onnx.error`."""
    import torch

    from pipeline.config import objects
    from pipeline.tensorrt.trt_api import trt

    target = folder / "onnx.engine"
    if target.exists():
        return
    folder.mkdir(parents=True, exist_ok=True)
    try:
        model = objects.model({"model": entry.model})
        inputs = objects.example_inputs(entry.model["methods"]["forward"], 0)
        if precision != "fp32":
            dtype = torch.float16 if precision == "fp16" else torch.bfloat16
            model = model.to(dtype)
            inputs = tuple(x.to(dtype) if x.is_floating_point() else x for x in inputs)
        path = folder / "model.onnx"
        torch.onnx.export(model, inputs, str(path), dynamo=False, opset_version=17, input_names=["x"])
        t = trt()
        logger = t.Logger(t.Logger.ERROR)
        builder = t.Builder(logger)
        network = builder.create_network(0)
        parser = t.OnnxParser(network, logger)
        if not parser.parse_from_file(str(path)):
            raise RuntimeError("; ".join(str(parser.get_error(i)) for i in range(parser.num_errors)))
        start = time.perf_counter()
        engine = builder.build_serialized_network(network, builder.create_builder_config())
        if engine is None:
            raise RuntimeError("the ONNX parser's network did not build")
        write_json(folder / "onnx.json", {"build_s": round(time.perf_counter() - start, 2)})
        write_bytes(target, bytes(engine))
        path.unlink()
        for extra in folder.glob("*.onnx*"):
            extra.unlink()
    except Exception as exc:  # recorded; the suite goes on
        write_bytes(folder / "onnx.error", f"{type(exc).__name__}: {str(exc).strip()[:300]}".encode())


def program_folder(out: Path, precision: str, entry: Entry) -> Path:
    return out / "programs" / entry.name.replace("/", "__") / precision


def onnx_in(precision: str, out: Path, entry: Entry) -> None:
    onnx_engine(entry, precision, program_folder(out, precision, entry))


def measure(entry: Entry, row: dict[str, Any], precision: str, folder: Path, iters: int, tolerance: float) -> dict[str, Any]:
    """Correctness of the `.pte` against eager, and our engine against the ONNX parser's (CUDA graphs)."""
    import torch

    from pipeline import pte
    from pipeline.config import objects
    from pipeline.runtime import load
    from pipeline.tensorrt import blob
    from pipeline.tensorrt.engine_runner import EngineRunner, RuntimeOptions

    name = entry.model["name"]
    files = {"pte": folder / "program" / f"{name}.pte"}
    ptd = files["pte"].with_suffix(".ptd")
    spec = entry.model["methods"]["forward"]
    inputs = [x.cuda() for x in objects.example_inputs(spec, 1)]
    model = objects.model({"model": entry.model}).cuda()
    with torch.no_grad():
        ref = model(*inputs)
        ref = ref[next(iter(ref))] if isinstance(ref, dict) else ref  # segmentation models return {"out": ...}
        ours_program = load(files["pte"], ptd if ptd.exists() else None, options=RuntimeOptions(cuda_graph=True))
        method = ours_program.method("forward")
        out = method.execute(inputs)
    got = out[0] if isinstance(out, (list, tuple)) else out
    rel = ((got.float() - ref.float()).abs().max() / ref.float().abs().max().clamp_min(1e-12)).item()
    result: dict[str, Any] = {"rel_error": rel, "correct": rel <= tolerance, "tolerance": tolerance}
    file = pte.read(files["pte"], ptd if ptd.exists() else None)
    calls = [c for c in pte.delegate_calls(file.program) if c.backend == blob.BACKEND_ID]
    stream = torch.cuda.Stream()
    if len(calls) == 1 and row["lowered_whole"]:
        meta, engine = pte.engine(file, calls[0].payload)
        runner = EngineRunner(engine, meta.io_bindings, RuntimeOptions(cuda_graph=True), stream)
        ours = lambda: runner(*inputs)  # noqa: E731
        result["ours"] = "engine"
    else:
        ours, stream = (lambda: method.execute(inputs)), method.stream
        result["ours"] = ".pte"
    onnx = folder / "onnx.engine"
    if onnx.exists():
        onnx_runner = _onnx_runner(onnx.read_bytes(), inputs, precision, stream)
        theirs = lambda: onnx_runner(*[x.to(onnx_runner.dtype) if x.is_floating_point() else x for x in inputs])  # noqa: E731
        variants = [Variant("ours", ours, stream), Variant("onnx", theirs, stream)]
        with torch.no_grad():
            timed(variants, Timing(iters=iters, warmup=20, block=10))
        ours_ms, theirs_ms = (statistics.median(v.samples) for v in variants)
        result.update(ours_ms=ours_ms, onnx_ms=theirs_ms, ratio=ours_ms / theirs_ms)
    else:
        error = folder / "onnx.error"
        result["onnx_error"] = error.read_text() if error.exists() else "no ONNX engine"
    return result


def _onnx_runner(engine: bytes, inputs: list[Any], precision: str, stream: Any) -> Any:
    import torch

    from pipeline.tensorrt.blob import IOBinding
    from pipeline.tensorrt.engine_runner import EngineRunner, RuntimeOptions
    from pipeline.tensorrt.trt_api import trt

    t = trt()
    probe = t.Runtime(t.Logger(t.Logger.ERROR)).deserialize_cuda_engine(engine)
    bindings = []
    for i in range(probe.num_io_tensors):
        tensor = probe.get_tensor_name(i)
        dtype = {t.DataType.FLOAT: torch.float32, t.DataType.HALF: torch.float16, t.DataType.BF16: torch.bfloat16,
                 t.DataType.INT64: torch.int64, t.DataType.INT32: torch.int32}[probe.get_tensor_dtype(tensor)]
        bindings.append(IOBinding.of(tensor, dtype, tuple(probe.get_tensor_shape(tensor)),
                                     probe.get_tensor_mode(tensor) == t.TensorIOMode.INPUT))
    runner = EngineRunner(engine, bindings, RuntimeOptions(cuda_graph=True), stream)
    runner.dtype = bindings[0].torch_dtype  # type: ignore[attr-defined]
    return runner


def markdown(rows: list[dict[str, Any]], precision: str) -> str:
    ratios = [r["ratio"] for r in rows if "ratio" in r]
    correct = sum(bool(r.get("correct")) for r in rows)
    lines = [f"{correct} of {len(rows)} models match eager within their tolerance at {precision}; "
             f"ours / ONNX-parser engine over {len(ratios)} models: median "
             f"{statistics.median(ratios) if ratios else float('nan'):.3f}, max {max(ratios, default=float('nan')):.3f}, "
             f"{sum(r > 1.10 for r in ratios)} above 1.10.", "",
             "| model | lowered whole | rel. error | correct | ours | ours ms | ONNX ms | ratio |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['model']} | {'yes' if r.get('lowered_whole') else 'no'} | "
                     f"{r.get('rel_error', float('nan')):.2e} | {r.get('correct', r.get('status'))} | {r.get('ours', '')} | "
                     f"{r.get('ours_ms', float('nan')):.3f} | {r.get('onnx_ms', float('nan')):.3f} | "
                     f"{r.get('ratio', float('nan')):.3f} |" + (f" {r['onnx_error']}" if "onnx_error" in r else ""))
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("models", nargs="*")
    parser.add_argument("--slice", default="all")
    parser.add_argument("--precision", default="fp32")
    parser.add_argument("--jobs", type=int, default=8)
    parser.add_argument("--iters", type=int, default=100)
    parser.add_argument("--timeout", type=float, default=3600, help="seconds one model's builds may take")
    parser.add_argument("--out", type=Path, default=Path("build/coverage-gpu"))
    parser.add_argument("--deadline", type=float, default=None, help="seconds after which no new model is started")
    parser.add_argument("--skip-measure", action="store_true", help="only build (both ways)")
    parser.add_argument("--measure-only", action="store_true", help="build nothing; measure what is built")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    start = time.monotonic()
    entries = select(args.models or None, args.slice)
    folder = functools.partial(program_folder, args.out, args.precision)
    rows = run_suite(entries, args.precision, args.out, args.jobs, args.timeout, keep=True, deadline=0 if args.measure_only else args.deadline,
                     after=functools.partial(onnx_in, args.precision, args.out))
    if args.skip_measure:
        return 0
    results_path = args.out / f"measured-{args.precision}.json"
    measured = json.loads(results_path.read_text()) if results_path.exists() else {}
    by_name = {e.name: e for e in entries}
    tolerance = float(compose([])["runtime"]["max_rel_error"])
    for row in rows:
        name = row["model"]
        if name in measured or row["status"] != "ok":
            continue
        if args.deadline and time.monotonic() - start > args.deadline:
            log.info("deadline reached; run again to continue")
            break
        if not any((folder(by_name[name]) / f).exists() for f in ("onnx.engine", "onnx.error")):
            onnx_engine(by_name[name], args.precision, folder(by_name[name]))  # its build was kept from a run that stopped
        try:
            measured[name] = measure(by_name[name], row, args.precision, folder(by_name[name]), args.iters, tolerance)
        except Exception as exc:  # recorded; the suite goes on
            measured[name] = {"status": f"{type(exc).__name__}: {str(exc).strip()[:300]}"}
        log.info("%s %s", name, measured[name])
        write_json(results_path, measured)
    table = [{**row, **measured.get(row["model"], {})} for row in rows]
    text = markdown(table, args.precision)
    write_bytes(args.out / f"coverage-gpu-{args.precision}.md", text.encode())
    write_json(args.out / f"coverage-gpu-{args.precision}.json", table)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
