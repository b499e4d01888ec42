"""The compile step: every method of the model exported and compiled, its TensorRT subgraphs built into
engines (through the engine cache), each method one engine-bearing `.pt2`."""

from __future__ import annotations

import logging
import time
import uuid
from pathlib import Path
from typing import Any

from pipeline.config import objects
from pipeline.config.schema import PipelineConfig
from pipeline.engine.cache import EngineCache
from pipeline.engine.support import check_executed_ops
from pipeline.errors import ConfigError, ExportError
from pipeline.files import atomic_dir
from pipeline.kernels.calls import is_kernel_call
from pipeline.lowering.compile import compile_program, export_method, written_state
from pipeline.models import weight_files
from pipeline.steps.intermediates import save_constants, save_exported
from pipeline.steps.progress import step

log = logging.getLogger("pipeline")


def run_compile(cfg: PipelineConfig, out_dir: str | Path, weights: list[dict[str, Any]] | None = None) -> dict[str, Any]:
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
        raise ConfigError(f"model.weights = {cfg.model.weights!r} changed after its digests were recorded (a file "
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


def weight_digests(cfg: PipelineConfig) -> list[dict[str, Any]] | None:
    """The digests of the files `model.weights` names (`weight_files.digests`), None without any."""
    return weight_files.digests(cfg.model.weights) if cfg.model.weights else None


def _compile_methods(cfg: PipelineConfig, model: Any, out_dir: str | Path, cache: EngineCache,
                     weights: list[dict[str, Any]] | None) -> dict[str, Any]:
    timings: dict[str, Any] = {}
    methods = cfg.model.methods
    inputs = {m: objects.example_inputs(spec, cfg.model.seed) for m, spec in methods.items()}
    exported = {}
    for method, spec in methods.items():  # first all, for the buffers any method writes (the program's state)
        with step(f"compile: exporting method {method!r} of {cfg.model.name}") as seconds:
            try:
                exported[method] = export_method(objects.method_module(model, spec), inputs[method],
                                                 objects.dynamic_shapes(spec))
            except ExportError as exc:
                raise ExportError(f"compile: method {method!r} of {cfg.model.name}: {exc}") from exc
        timings[method] = seconds()
    state = written_state(exported.values())
    specs = {method: objects.compile_spec(cfg, method, exported[method]) for method in methods}
    check_executed_ops({m: (spec.torch_executed_ops, exported[m].graph) for m, spec in specs.items()})
    with atomic_dir(out_dir) as tmp:
        save_constants(objects.program_constants(cfg, model, weights), tmp)  # values the program carries
        kernel_calls = 0
        for method in methods:
            with step(f"compile: method {method!r} of {cfg.model.name}") as seconds:
                program = compile_program(exported[method], inputs[method], specs[method], method, cache, state,
                                          objects.declared_values(methods[method]))
                save_exported(program, tmp / f"{method}.pt2")
            timings[method] = round(timings[method] + seconds(), 2)
            kernel_calls += sum(is_kernel_call(n) for n in program.graph.nodes)
    if any(spec.decode_kernels for spec in specs.values()) and not kernel_calls:
        log.warning("compile.decode_kernels is on, but no method has a product the project's kernels take (1 to 8 "
                    "tokens of float16, a static shape: decode as a method of its own, model.kwargs.dtype=float16, as "
                    "+experiment=llm_decode_kernels has it), so every product runs in TensorRT")
    return timings
