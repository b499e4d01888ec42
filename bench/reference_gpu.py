"""TensorRT's kernels against the CPU reference executor, engine by engine, on a GPU (issue 57): the
zoo at fp32 and fp16 and a sample of the coverage suite at fp32 are built through the pipeline on
this machine; each engine runs on TensorRT and on the reference executor with the same inputs
(`reference.tensorrt_rel_error` in the report) and on the reference executor against its graph run
eagerly (`reference.max_rel_error`). One row per build, largest error over its engines; written as
JSON for the docs' figures (`bench/figures.py`). fp32 builds are built and run with TF32 off
(`NVIDIA_TF32_OVERRIDE=0` and `compile.allow_tf32=false`, `pipeline/engine/build_env.py`): with TF32
TensorRT-RTX's fp32 convolutions differ by TF32's rounding (1e-2), which would hide a wrong kernel
behind the tolerance; without it they are held to the reference executor's own fp32 tolerance. `tests/tensorrt/test_reference_gpu.py` is the test, built
on these rows: with `$PIPELINE_REFERENCE_ROWS` set, each of its builds adds its row to that file, and
`--rows` makes the results from them instead of building again.

    python -m bench.reference_gpu --out results/reference-gpu.json --jobs 8
    PIPELINE_REFERENCE_ROWS=rows.jsonl pytest -m gpu tests/tensorrt/test_reference_gpu.py
    python -m bench.reference_gpu --out results/reference-gpu.json --rows rows.jsonl
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

ZOO = ["mlp", "mobilenet_v3_small", "resnet18", "tiny_decoder", "llama_tiny", "whisper_tiny", "transducer_tiny"]
SUITE_SAMPLE = ["torchvision/squeezenet1_1", "torchvision/shufflenet_v2_x0_5", "timm/lcnet_050",
                "timm/vit_tiny_patch16_224", "hf/bert_tiny", "hf-decoder/qwen3", "hf-decoder/gemma3_text",
                "hf-decoder/phi3", "hf-decoder/gpt2", "hf-decoder/qwen3_moe"]


ROWS = "PIPELINE_REFERENCE_ROWS"


def add_row(row: dict[str, Any]) -> None:
    """Add a test's row to the file `$PIPELINE_REFERENCE_ROWS` names, where set (one line, one write)."""
    where = os.environ.get(ROWS)
    if where:
        with open(where, "a") as f:
            f.write(json.dumps(row) + "\n")


@contextlib.contextmanager
def tf32_off(precision: str) -> Iterator[list[str]]:
    """The overrides of a `precision` build, inside which it is built and run: fp32 with TF32 off."""
    if precision != "fp32":
        yield []
        return
    from pipeline.engine.build_env import VARIABLE

    before = os.environ.get(VARIABLE)
    os.environ[VARIABLE] = "0"
    try:
        yield ["compile.allow_tf32=false"]
    finally:
        if before is None:
            del os.environ[VARIABLE]
        else:
            os.environ[VARIABLE] = before


def engine_checks(report: dict[str, Any]) -> list[dict[str, Any]]:
    """The reference record of every engine of a build's report."""
    return [e.get("reference") or {} for method in report.values() for e in method["engines"]]


def zoo_row(model: str, precision: str) -> dict[str, Any]:
    from pipeline.config.compose import compose, typed
    from pipeline.steps import run_all

    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="reference-gpu-") as tmp, tf32_off(precision) as strict:
        run_all(typed(compose([f"model={model}", f"compile.precision={precision}", "cache=off", *strict])), Path(tmp))
        checks = engine_checks(json.loads((Path(tmp) / "report.json").read_text()))
    on_gpu = [c["tensorrt_rel_error"] for c in checks if "tensorrt_rel_error" in c]
    errors = [c["max_rel_error"] for c in checks if "max_rel_error" in c]
    return {"model": model, "precision": precision, "engines": len(checks),
            "tensorrt_error": max(on_gpu) if len(on_gpu) == len(checks) and checks else None,
            "reference_error": max(errors) if errors else None,
            "skipped": sorted({c["tensorrt_skipped"] for c in checks if "tensorrt_skipped" in c}),
            "build_s": round(time.perf_counter() - start, 1)}


def suite_row(name: str) -> dict[str, Any]:
    from pipeline.coverage.run import build_row
    from pipeline.coverage.suite import select

    (entry,) = select([name])
    with tf32_off("fp32") as strict:
        row = build_row(entry, "fp32", overrides=strict)
    return {key: row[key] for key in ("model", "precision", "engines", "tensorrt_error", "reference_error",
                                      "reference_unchecked", "build_s")}


def _one(kind: str, args: tuple[str, ...]) -> dict[str, Any]:
    try:
        return zoo_row(*args) if kind == "zoo" else suite_row(*args)
    except Exception as exc:  # a build that fails is a row that says so
        return {"model": args[0], "precision": args[-1] if kind == "zoo" else "fp32",
                "error": f"{type(exc).__name__}: {str(exc).strip()[:300]}"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--jobs", type=int, default=4)
    parser.add_argument("--rows", type=Path, help="the rows a test run added ($PIPELINE_REFERENCE_ROWS), not built again")
    args = parser.parse_args(argv)
    import tensorrt_rtx
    import torch

    work = [("zoo", (m, p)) for p in ("fp32", "fp16") for m in ZOO] + [("suite", (n,)) for n in SUITE_SAMPLE]
    if args.rows:
        found = {(r["model"], r["precision"]): r for r in map(json.loads, args.rows.read_text().splitlines())}
        rows = [found[o] for o in ((a[0], a[1] if k == "zoo" else "fp32") for k, a in work) if o in found]
    else:
        with ProcessPoolExecutor(args.jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
            rows = list(pool.map(_one, *zip(*work, strict=True)))
    for row in rows:
        print(json.dumps(row), flush=True)
    result = {"command": "python -m bench.reference_gpu " + " ".join(sys.argv[1:] if argv is None else argv),
              "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              "machine": torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU",
              "torch": torch.__version__, "tensorrt_rtx": tensorrt_rtx.__version__, "rows": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0 if all("error" not in r and r["tensorrt_error"] is not None for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
