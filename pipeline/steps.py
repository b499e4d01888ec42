"""The four build steps, each reading its inputs from disk and writing complete outputs:
compile (-> .pt2 per method) -> export (-> lowered Edge programs + report.json) -> transform
(-> transformed Edge programs) -> serialize (-> .pte, .ptd, manifest.json). DVC stages and the
in-process Hydra app both call these."""

from __future__ import annotations

import hashlib
import logging
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pipeline import pte, runtime_kernels, toolchain
from pipeline.compile import compile_program, export_method, written_state
from pipeline.config import objects
from pipeline.errors import ConfigError, ExportError
from pipeline.export import export, write_program
from pipeline.files import atomic_dir, write_json
from pipeline.intermediates import load_constants, load_edge, load_exported, save_constants, save_edge, save_exported
from pipeline.models import checkpoint
from pipeline.tensorrt.engine_cache import EngineCache

log = logging.getLogger("pipeline")


def run_compile(cfg: Mapping[str, Any], out_dir: str | Path, weights: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """Compile every method into `<out_dir>/<method>.pt2`, engines through the configured engine cache.
    `weights`: the digests of `model.weights` that an earlier step recorded (`weight_digests`), which
    the files read now must still have.

    Returns:
        Seconds per method and in all ("total"), and with the cache on its hits and misses
        ("engine_cache": {"hits", "misses", "engines": {label: "hit" or "miss"}}): run-dependent, so
        kept out of `out_dir`.
    """
    start = time.perf_counter()
    model = objects.model(cfg)
    read = weight_digests(cfg)
    if weights is not None and read != weights:
        raise ConfigError(f"model.weights = {cfg['model']['weights']!r} changed after its digests were recorded (a file "
                          "written during the build?); run the build again")
    cache = objects.engine_cache(cfg)
    # With the cache off, engines are still shared within the run: methods with the same graph
    # (a decoder's prefill and decode) call one engine, stored once (TensorRT builds are not
    # bit-reproducible, so building it twice would store the weights twice).
    engines = cache or EngineCache(f"memory://pipeline-run-{uuid.uuid4().hex}", max_bytes=None)
    try:
        timings = _compile_methods(cfg, model, out_dir, engines, read)
    finally:
        if cache is None:
            engines.clear()
    timings["total"] = round(time.perf_counter() - start, 2)
    if cache is not None:  # here, not in report.json: a cached output must not differ between a hit and a miss
        timings["engine_cache"] = {"hits": sum(e.hit for e in cache.events), "misses": sum(not e.hit for e in cache.events),
                                   "engines": {e.label: "hit" if e.hit else "miss" for e in cache.events}}
    return timings


def weight_digests(cfg: Mapping[str, Any]) -> list[dict[str, Any]] | None:
    """The digests of the files `model.weights` names (`checkpoint.digests`), None without any."""
    return checkpoint.digests(cfg["model"]["weights"]) if cfg["model"].get("weights") else None


def _compile_methods(cfg: Mapping[str, Any], model: Any, out_dir: str | Path, cache: EngineCache,
                     weights: list[dict[str, Any]] | None) -> dict[str, Any]:
    timings: dict[str, Any] = {}
    methods = cfg["model"]["methods"]
    inputs = {m: objects.example_inputs(spec, cfg["model"]["seed"]) for m, spec in methods.items()}
    exported = {}
    for method, spec in methods.items():  # first all, for the buffers any method writes (the program's state)
        with step(f"compile: exporting method {method!r} of {cfg['model']['name']}") as seconds:
            try:
                exported[method] = export_method(objects.method_module(model, spec), inputs[method],
                                                 objects.dynamic_shapes(spec, objects.function_of(spec)))
            except ExportError as exc:
                raise ExportError(f"compile: method {method!r} of {cfg['model']['name']}: {exc}") from exc
        timings[method] = seconds()
    state = written_state(exported.values())
    with atomic_dir(out_dir) as tmp:
        save_constants(objects.program_constants(cfg, model, weights), tmp)  # values the program carries
        for method in methods:
            with step(f"compile: method {method!r} of {cfg['model']['name']}") as seconds:
                spec = objects.compile_spec(cfg, method, exported[method])
                program = compile_program(exported[method], inputs[method], spec, method, cache, state,
                                          objects.declared_values(methods[method]))
                save_exported(program, tmp / f"{method}.pt2")
            timings[method] = round(timings[method] + seconds(), 2)
    return timings


@contextmanager
def step(what: str) -> Iterator[Callable[[], float]]:
    """Log when `what` starts and when it ends, with its seconds (also handed to the block)."""
    start = time.perf_counter()
    log.info("%s ...", what)
    elapsed = [0.0]
    yield lambda: elapsed[0]
    elapsed[0] = time.perf_counter() - start
    log.info("%s done in %.1f s", what, elapsed[0])


def run_export(cfg: Mapping[str, Any], compiled: str | Path, out_dir: str | Path, report: str | Path) -> None:
    """Lower the compiled methods (TensorRT first, then the configured chain) into Edge programs."""
    methods = list(cfg["model"]["methods"])
    programs = {m: load_exported(Path(compiled) / f"{m}.pt2") for m in methods}
    with step(f"export: lowering {', '.join(methods)}"):
        manager = export(programs, partitioners={m: objects.partitioners(cfg, m) for m in methods},
                         compile_specs={m: objects.compile_spec(cfg, m) for m in methods},
                         constant_methods=load_constants(compiled))
    with atomic_dir(out_dir) as tmp:
        save_edge(manager, methods, tmp)
    write_json(report, manager.tensorrt_report)  # type: ignore[attr-defined]


def run_transform(cfg: Mapping[str, Any], in_dir: str | Path, out_dir: str | Path) -> None:
    """Apply the configured Edge passes per method."""
    methods = list(cfg["model"]["methods"])
    manager = load_edge(methods, in_dir)
    passes = {m: objects.transform_passes(cfg, m) for m in methods}
    if any(passes.values()):
        with step(f"transform: {sum(map(len, passes.values()))} pass(es)"):
            manager = manager.transform(passes)
    else:
        log.info("transform: no passes configured; the programs pass through")
    with atomic_dir(out_dir) as tmp:
        save_edge(manager, methods, tmp)


def run_serialize(cfg: Mapping[str, Any], in_dir: str | Path, program_dir: str | Path,
                  manifest_path: str | Path) -> dict[str, Path]:
    """Write `<name>.pte` (+ `.ptd`, ETRecord) into `program_dir`, one directory that appears
    complete or not at all (so DVC caches every file of the program), and `manifest_path`."""
    methods = list(cfg["model"]["methods"])
    manager = load_edge(methods, in_dir)
    name = cfg["serialize"].get("output_name") or cfg["model"]["name"]
    with step(f"serialize: {name}.pte"), atomic_dir(program_dir) as tmp:
        written = write_program(manager, tmp / f"{name}.pte", external_data=bool(cfg["serialize"].get("external_data")),
                                etrecord=bool(cfg["serialize"].get("etrecord")))
        record = manifest(cfg, written, load_constants(in_dir) or {})
        check_kernels(cfg, record["runtime_kernels"])
    files = {kind: Path(program_dir) / path.name for kind, path in written.items()}
    write_json(manifest_path, record)
    return files


def check_kernels(cfg: Mapping[str, Any], found: Mapping[str, Any]) -> None:
    """Warn when the program calls kernels ExecuTorch's runtime library lacks (`runtime_kernels`).

    Raises:
        ExportError: it does, or that could not be checked, under `serialize.runtime_kernels=error`.
    """
    line = runtime_kernels.summary(found)
    if line is None:
        return
    if cfg["serialize"].get("runtime_kernels") == "error":
        raise ExportError(f"{line} (serialize.runtime_kernels=error; =warn writes the program anyway)")
    log.warning("%s", line)


def manifest(cfg: Mapping[str, Any], files: Mapping[str, Path], constants: Mapping[str, Any]) -> dict[str, Any]:
    """Content hashes of the outputs and of every named entry in them (engines, external tensors: key,
    file, bytes, SHA-256), of the weight files the program was built from (`weights`, null for
    seeded weights), the composed config and the toolchain: what the build is, and nothing about
    when or from which commit (dvc.lock in git says that), so it caches like the program."""
    import json

    program = pte.read(files["pte"], files.get("ptd"))
    return {
        "weights": json.loads(constants[objects.WEIGHTS]) if objects.WEIGHTS in constants else None,
        "files": {kind: {"name": p.name, "sha256": _sha256(p), "bytes": p.stat().st_size} for kind, p in files.items()},
        "named_data": pte.named_entries(program),
        "runtime_kernels": runtime_kernels.report(program.program),
        "config": dict(cfg),
        "toolchain": toolchain.record(cfg["compile"].get("target_compute_capabilities") or ()),
    }


def run_validate(cfg: Mapping[str, Any], build_dir: str | Path, timings: str | Path, metrics: str | Path,
                 plot: str | Path) -> dict[str, Any]:
    """Run the built program (in `<build_dir>/program`) against eager PyTorch; write the details
    (`<build_dir>/validation.json`, reasons included), the flat `metrics` and the `plot` row, from
    `<build_dir>/report.json` and the compile step's `timings`."""
    import json

    from pipeline.metrics import plot_row, summary
    from pipeline.validate import validate_program

    build = Path(build_dir)
    name = cfg["serialize"].get("output_name") or cfg["model"]["name"]
    pte = build / "program" / f"{name}.pte"
    ptd = pte.with_suffix(".ptd")
    with step("validate"):
        details = validate_program(cfg, pte, ptd if ptd.exists() else None)
    for method, row in details["methods"].items():  # said where the user looks, not only in validation.json
        if row.get("runtime") is None:
            log.warning("validate: method %r was not run, so not checked against eager PyTorch: %s", method, row.get("reason"))
    write_json(build / "validation.json", details)
    report = json.loads((build / "report.json").read_text())
    result = summary(cfg, build / "program", report, json.loads(Path(timings).read_text()), details)
    write_json(metrics, result)
    write_json(plot, plot_row(cfg, result))
    return result


def run_all(cfg: Mapping[str, Any], build_dir: str | Path, validate: bool = False) -> dict[str, Path]:
    """The steps in-process into `build_dir` (what `python -m pipeline` runs), validate optionally."""
    build = Path(build_dir)
    write_json(build / "timings.json", run_compile(cfg, build / "compiled"))
    run_export(cfg, build / "compiled", build / "exported", build / "report.json")
    run_transform(cfg, build / "exported", build / "transformed")
    files = run_serialize(cfg, build / "transformed", build / "program", build / "manifest.json")
    if validate:
        run_validate(cfg, build, build / "timings.json", build / "metrics.json", build / "plot.json")
        files["metrics"] = build / "metrics.json"
    return files


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()
