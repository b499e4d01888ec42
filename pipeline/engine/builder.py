"""Build a serialized TensorRT engine from an `ExportedProgram`: builder configuration from the
compile spec (every field applied), optimization profile, timing cache, build, and timing; or take
it from an engine cache (`engine_cache.py`)."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

from torch.export import ExportedProgram

from pipeline.delegate.blob import BlobMetadata
from pipeline.engine import build_env, cache_files
from pipeline.engine.cache import EngineCache, Entry
from pipeline.engine.compile_spec import TensorRTCompileSpec
from pipeline.engine.network import GraphSource, NetworkDefinition, define_network, graph_source
from pipeline.engine.trt_api import flavour, trt
from pipeline.errors import CompileSpecError, EngineBuildError

log = logging.getLogger("pipeline.engine")


class _Logger:
    """TensorRT logger that forwards to Python logging and keeps errors for the exception text."""

    def __init__(self) -> None:
        t = trt()
        self._impl = _make_logger(t, self)
        self.errors: list[str] = []

    def log(self, severity: Any, msg: str) -> None:
        t = trt()
        if severity in (t.Logger.INTERNAL_ERROR, t.Logger.ERROR):
            self.errors.append(msg)
            log.error("TensorRT: %s", msg)
        elif severity == t.Logger.WARNING:
            log.debug("TensorRT: %s", msg)

    @property
    def trt_logger(self) -> Any:
        return self._impl


def _make_logger(t: Any, sink: _Logger) -> Any:
    class Forward(t.ILogger):  # type: ignore[name-defined,misc]
        def __init__(self) -> None:
            t.ILogger.__init__(self)

        def log(self, severity: Any, msg: str) -> None:
            sink.log(severity, msg)

    return Forward()


@dataclass(frozen=True)
class BuiltEngine:
    """A serialized engine, its metadata, and what the build cost."""

    engine: bytes
    metadata: BlobMetadata
    build_seconds: float
    num_layers: int


def builder_config(builder: Any, spec: TensorRTCompileSpec, definition: NetworkDefinition | None = None) -> Any:
    """A TensorRT builder configuration with every compile-spec field applied (and the optimization
    profiles of `definition`'s dynamic inputs; a network of static shapes needs none).

    Raises:
        CompileSpecError: a field this TensorRT flavour cannot honour (e.g. compute capabilities
            on standard TensorRT, or one TensorRT-RTX does not know; allow_tf32=false on TensorRT-RTX
            where NVIDIA_TF32_OVERRIDE is not 0).
    """
    t = trt()
    config = builder.create_builder_config()
    if not spec.allow_tf32:
        if flavour().is_rtx:
            build_env.require_tf32_off("compile.allow_tf32=false")
        config.clear_flag(t.BuilderFlag.TF32)
    else:
        config.set_flag(t.BuilderFlag.TF32)
    config.builder_optimization_level = spec.optimization_level
    if spec.workspace_bytes is not None:
        config.set_memory_pool_limit(t.MemoryPoolType.WORKSPACE, spec.workspace_bytes)
    if spec.max_aux_streams is not None:
        config.max_aux_streams = spec.max_aux_streams
    _apply_compute_capabilities(config, spec)
    if spec.timing_cache_path:
        data = cache_files.check(spec.timing_cache_path)
        config.set_timing_cache(config.create_timing_cache(data), ignore_mismatch=False)
    for profile in optimization_profiles(builder, definition) if definition is not None else []:
        config.add_optimization_profile(profile)
    return config


def optimization_profiles(builder: Any, definition: NetworkDefinition) -> list[Any]:
    """The optimization profiles holding every dynamic input's [min, opt, max] shapes (none for a
    network of static shapes), in `definition.profiles` order: the engine's profile indices."""
    out = []
    for ranges in definition.profiles:
        profile = builder.create_optimization_profile()
        for name, (lo, opt, hi) in ranges.items():
            profile.set_shape(name, lo, opt, hi)
        out.append(profile)
    return out


def profile_count(metadata: BlobMetadata, spec: TensorRTCompileSpec) -> int:
    """How many optimization profiles an engine of `metadata` built under `spec` has (0: static shapes)."""
    return 1 + len(spec.profiles) if any(b.min_shape for b in metadata.inputs) else 0


def compute_capability_enum(cap: str) -> Any:
    """The TensorRT `ComputeCapability` member for "major.minor"."""
    t = trt()
    enum = getattr(t, "ComputeCapability", None)
    if enum is None:
        raise CompileSpecError(
            f"target_compute_capabilities={cap!r} needs TensorRT-RTX; {flavour().module} builds for the GPU it runs on"
        )
    name = "SM" + cap.replace(".", "")
    allowed = sorted(n[2:-1] + "." + n[-1] for n in dir(enum) if n.startswith("SM"))
    if not hasattr(enum, name):
        raise CompileSpecError(f"target compute capability {cap!r} is not known to {flavour().module}; allowed: {allowed}")
    return getattr(enum, name)


def _apply_compute_capabilities(config: Any, spec: TensorRTCompileSpec) -> None:
    if not spec.target_compute_capabilities:
        return
    caps = [compute_capability_enum(c) for c in spec.target_compute_capabilities]
    config.num_compute_capabilities = len(caps)
    for i, cap in enumerate(caps):
        config.set_compute_capability(cap, i)


def build_engine(program: ExportedProgram | GraphSource, spec: TensorRTCompileSpec, label: str = "engine",
                 cache: EngineCache | None = None) -> BuiltEngine:
    """Convert `program` (or a graph with its constants) with the registry and build a serialized
    engine; with a `cache`, take the engine from it when it holds this one, else cache the new one.

    Raises:
        UnsupportedOperatorError: a node cannot be converted.
        EngineBuildError: TensorRT refused to build; the message carries TensorRT's errors.
    """
    source = program if isinstance(program, GraphSource) else graph_source(program)
    key = cache.key(source, spec) if cache is not None else None
    if cache is not None and key is not None:
        entry = cache.get(key, label)
        if entry is not None:
            log.info("TensorRT %s: from the engine cache (%s)", label, key[:12])
            return BuiltEngine(entry.engine, entry.metadata, 0.0, entry.num_layers)
    built = _build(source, spec, label)
    if cache is not None and key is not None:
        cache.put(key, Entry(built.engine, built.metadata, built.num_layers))
    return built


def _build(source: GraphSource, spec: TensorRTCompileSpec, label: str) -> BuiltEngine:
    logger = _Logger()
    builder = trt().Builder(logger.trt_logger)
    definition = define_network(builder, source, spec)
    config = builder_config(builder, spec, definition)
    layers = definition.network.num_layers
    log.info("building TensorRT %s: %d layers, %s, opt level %d", label, layers, spec.precision, spec.optimization_level)
    start = time.perf_counter()
    serialized = builder.build_serialized_network(definition.network, config)
    seconds = time.perf_counter() - start
    if serialized is None:
        raise EngineBuildError(
            f"TensorRT could not build {label} ({layers} layers): " + ("; ".join(logger.errors) or "no error reported")
        )
    log.info("built TensorRT %s in %.2f s (%d bytes)", label, seconds, serialized.nbytes)
    if spec.timing_cache_path:
        cache_files.write(spec.timing_cache_path, bytes(config.get_timing_cache().serialize()))
    meta = BlobMetadata(io_bindings=definition.bindings, hardware_compatible=False, target_platform=_platform(),
                        tf32_override=build_env.current() if flavour().is_rtx else None)
    return BuiltEngine(bytes(serialized), meta, seconds, layers)


def _platform() -> str:
    import platform

    return f"{platform.system().lower()}_{platform.machine().lower()}"
