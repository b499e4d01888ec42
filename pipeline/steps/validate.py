"""The validate step: run each method of a built `.pte` with `pipeline.runtime` on fixed-seed inputs
and compare with eager PyTorch (errors, which runtime, file sizes; median call time on a GPU)."""

from __future__ import annotations

import json
import logging
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from pipeline.config import objects
from pipeline.config.schema import PipelineConfig
from pipeline.engine import build_env
from pipeline.errors import ExportError, RuntimeUnavailableError
from pipeline.files import write_json
from pipeline.runtime.executors import describe, load_with
from pipeline.steps.metrics import plot_row, summary
from pipeline.steps.progress import step

log = logging.getLogger(__name__)


def validate_program(cfg: PipelineConfig, pte: Path, ptd: Path | None) -> dict[str, Any]:
    """Per-method error metrics of `pte` against eager PyTorch; a method further from it than
    `runtime.max_rel_error` is marked (`within_tolerance`) and named in a warning.

    A method the runtime cannot execute here (no GPU for TensorRT delegates) gets `runtime: null`
    and the reason, not an error: CPU-only machines still build and check everything else. A method
    whose eager outputs are each one constant (say, a zero-initialised head) gets a `note` saying the
    comparison proves nothing, on the CPU too, and a warning.
    """
    model = objects.model(cfg)
    seed, tolerance = cfg.runtime.validation_seed, cfg.runtime.max_rel_error
    metrics: dict[str, Any] = {"files": {"pte_bytes": pte.stat().st_size, "ptd_bytes": ptd.stat().st_size if ptd else 0}}
    refs, notes = {}, {}
    for name, spec in cfg.model.methods.items():
        inputs = objects.example_inputs(spec, seed)
        try:
            with torch.no_grad():
                out = getattr(model, spec.function)(*inputs)
        except Exception as exc:  # the model's own code; the program was built from its traced graph
            reason = (str(exc).strip().splitlines() or [""])[0][:300]
            raise ExportError(f"validate: eager PyTorch cannot run method {name!r} on its example inputs "
                              f"({type(exc).__name__}: {reason}), so the program (traced without running it) has no "
                              f"reference; check model.methods.{name}.inputs (dtypes, shapes)") from exc
        refs[name] = (inputs, [o for o in torch.utils._pytree.tree_leaves(out) if isinstance(o, torch.Tensor)])
        if all(constant_output(r) for r in refs[name][1]):
            notes[name] = {"note": f"every output of eager {name} is one constant, so comparing with it cannot show a "
                                   "wrong engine; model.init=every_layer gives weights in which every layer counts"}
            log.warning("validate: %s", notes[name]["note"])
    executor = cfg.runtime.executor
    try:
        program = load_with(executor, pte, ptd, cfg.runtime)
    except RuntimeUnavailableError as exc:
        return {**metrics, "methods": {m: {**_skipped(exc), **notes.get(m, {})} for m in cfg.model.methods}}
    methods = {}
    for name, (inputs, expected) in refs.items():
        try:
            outs = [o for o in program.method(name).execute(list(inputs)) if isinstance(o, torch.Tensor)]
        except RuntimeUnavailableError as exc:
            methods[name] = {**_skipped(exc), **notes.get(name, {})}
            continue
        abs_err = max(float((o.cpu().float() - r.float()).abs().max()) for o, r in zip(outs, expected))
        scale = max(float(r.float().abs().max()) for r in expected)
        rel_err = abs_err / scale if scale else abs_err
        within = rel_err <= tolerance  # NaN is not
        on_gpu = executor == "executorch" or program.device.type == "cuda"  # it ran, so on the GPU
        methods[name] = {"runtime": describe(program), "max_abs_error": abs_err, "max_rel_error": rel_err,
                         "within_tolerance": within, **notes.get(name, {}),
                         "median_ms": _median_ms(program.method(name), [x.to(program.device) for x in inputs], on_gpu)}
        if not within:
            log.warning("validate: %s", _beyond(cfg, name, rel_err, tolerance, program.device.type))
    return {**metrics, "methods": methods}


def _beyond(cfg: PipelineConfig, method: str, rel_err: float, tolerance: float, device: str) -> str:
    """The line said when a method is further from eager PyTorch than the build allows (run on `device`)."""
    said = (f"method {method!r} is {rel_err:.3g} from eager PyTorch (relative to its largest output), above "
            f"runtime.max_rel_error={tolerance:g}")
    if device == "cuda" and cfg.compile.precision == "fp32" and build_env.current() != "0":
        said += (f"; on TensorRT-RTX, fp32 engines compute convolutions in TF32 unless the program is built and run "
                 f"with {build_env.VARIABLE}=0")
    return said


def constant_output(out: torch.Tensor) -> bool:
    """All of `out` is one value (a zero-initialised head makes every logit 0, whatever the input)."""
    flat = out.detach().flatten()
    return flat.numel() == 0 or bool((flat == flat[0]).all())


def _median_ms(method: Any, inputs: list[torch.Tensor], on_gpu: bool, calls: int = 50) -> float | None:
    """Median milliseconds of one call on the GPU (None on the CPU, where no number would mean much)."""
    if not on_gpu:
        return None
    times = []
    for _ in range(calls + 10):
        start = time.perf_counter()
        method.execute(inputs)
        torch.cuda.synchronize()
        times.append((time.perf_counter() - start) * 1e3)
    return float(statistics.median(times[10:]))


def reference_check(method_report: dict[str, Any], precision: str) -> dict[str, Any]:
    """What the compile step's reference executor found for a method's engines (`report.json`): each
    engine's network run on the CPU against its graph run eagerly, on the example inputs. It checks
    what the converters built, not TensorRT's kernels, which only a GPU runs."""
    from pipeline.engine.reference.check import TOLERANCE

    found = [e.get("reference") or {"skipped": "built before engines were checked"} for e in method_report.get("engines", [])]
    checked = [f["max_rel_error"] for f in found if "max_rel_error" in f]
    worst = max(checked, default=None)
    within = None if worst is None else worst <= TOLERANCE[precision]
    said = (f"its {len(checked)} of {len(found)} engine(s) were checked by the reference executor on the CPU "
            f"(TensorRT's kernels not run): largest error {worst:.3g} against their graphs run eagerly"
            if worst is not None else "no engine of it was checked by the reference executor")
    return {"checked_by": "reference executor (CPU), not TensorRT's kernels", "engines": len(found),
            "engines_checked": len(checked), "max_rel_error": worst, "within_tolerance": within,
            "skipped": [f["skipped"] for f in found if "skipped" in f], "said": said}


def _skipped(exc: Exception) -> dict[str, Any]:
    return {"runtime": None, "max_abs_error": None, "max_rel_error": None, "reason": str(exc)}


def run_validate(cfg: PipelineConfig, build_dir: str | Path, timings: str | Path, metrics: str | Path,
                 plot: str | Path) -> dict[str, Any]:
    """Run the built program (in `<build_dir>/program`) against eager PyTorch; write the details
    (`<build_dir>/validation.json`, reasons included), the flat `metrics` and the `plot` row, from
    `<build_dir>/report.json` and the compile step's `timings`."""
    build = Path(build_dir)
    name = cfg.serialize.output_name or cfg.model.name
    pte = build / "program" / f"{name}.pte"
    ptd = pte.with_suffix(".ptd")
    with step("validate"):
        details = validate_program(cfg, pte, ptd if ptd.exists() else None)
    report = json.loads((build / "report.json").read_text())
    for method, row in details["methods"].items():  # said where the user looks, not only in validation.json
        if row.get("runtime") is None:
            row["reference"] = reference_check(report.get(method) or {}, cfg.compile.precision)
            log.warning("validate: method %r was not run, so not checked against eager PyTorch: %s; %s", method,
                        row.get("reason"), row["reference"]["said"])
    write_json(build / "validation.json", details)
    result = summary(build / "program", report, json.loads(Path(timings).read_text()), details)
    write_json(metrics, result)
    write_json(plot, plot_row(cfg, result))
    return result
