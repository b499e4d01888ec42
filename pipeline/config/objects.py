"""Turn the typed config (`schema.PipelineConfig`) into the objects the library takes: the model, example
inputs, dynamic shapes, compile specs, partitioner chains and passes. Every `_target_` is checked
(trusted module, kind of its slot: `targets.py`) before it is imported or called."""

from __future__ import annotations

import inspect
import logging
from dataclasses import asdict
from typing import Any

import torch
from torch.export import Dim

from pipeline import dtypes
from pipeline.config.schema import MethodSpec, ModelConfig, PartitionerEntry, PassEntry, PipelineConfig
from pipeline.config.targets import locate
from pipeline.engine.cache import EngineCache
from pipeline.engine.compile_spec import TensorRTCompileSpec
from pipeline.errors import ConfigError, PipelineError
from pipeline.models import checkpoint, weight_files
from pipeline.models.decoder import MethodView
from pipeline.models.registry import download_reason
from pipeline.models.weights import calibrate_batch_norms, show_every_layer

log = logging.getLogger("pipeline")
# The constant method naming a program's weight files: JSON {"path": model.weights, "files":
# [{"file", "bytes", "sha256"}]} (`weight_files.digests`).
WEIGHTS = "pipeline_weights"
# Input dtypes a config may name.
DTYPES = {name: dtypes.BY_NAME[name].torch for name in ("float32", "float16", "bfloat16", "int64", "int32", "bool")}


def instantiate(entry: PartitionerEntry | PassEntry, slot: str, where: str) -> Any:
    """Call `entry._target_`, checked to be of `slot`'s kind, with `entry.kwargs`."""
    return build(locate(str(entry._target_), slot, where), dict(entry.kwargs), where)


def build(factory: Any, kwargs: dict[str, Any], where: str) -> Any:
    """`factory(**kwargs)`, after `check_kwargs`."""
    check_kwargs(factory, kwargs, where)
    return factory(**kwargs)


def check_kwargs(factory: Any, kwargs: dict[str, Any], where: str) -> None:
    """Raise `ConfigError` naming `where` unless `factory` takes exactly these keyword arguments."""
    try:
        inspect.signature(factory).bind(**kwargs)
    except TypeError as exc:
        raise ConfigError(f"{where} = {getattr(factory, '__qualname__', factory)!r} does not take the kwargs "
                          f"{sorted(kwargs)}: {exc}") from exc


def check_no_download(factory: Any, kwargs: dict[str, Any]) -> None:
    """Raise `ConfigError` where the kwargs would make the factory read weights from a file or the
    network (`registry.download_reason`): builds use seeded random weights."""
    reason = download_reason(factory, dict(kwargs))
    if reason:
        raise ConfigError(f"model.kwargs {reason}; builds use seeded random weights, nothing is read or downloaded "
                          "(leave weights null and pretrained false, and name no files)")


def model_kwargs(factory: Any, kwargs: dict[str, Any], seed: int) -> dict[str, Any]:
    """The keyword arguments the model factory gets from the config's `model` section: its kwargs,
    plus `seed=` when the factory takes one."""
    return {"seed": seed, **kwargs} if "seed" in inspect.signature(factory).parameters else kwargs


def model(cfg: PipelineConfig) -> torch.nn.Module:
    """The model of the config: built by its factory, then its weights read from `model.weights`
    (`checkpoint.py`; a model folder's by transformers itself, held to the same rules) or, without a
    file, drawn from its seed (passed as `seed=` to factories that
    take it, else set as PyTorch's seed for the call) and initialised as `model.init` says. Nothing
    is downloaded: no pretrained weights. A Hugging Face model folder also tells its factory what
    to build (passed as `folder=`)."""
    section = cfg.model
    factory = locate(section._target_, "model", "model._target_")
    kwargs = model_kwargs(factory, dict(section.kwargs), section.seed)
    check_no_download(factory, kwargs)
    weights = section.weights
    if weights and weight_files.is_model_folder(weights):
        if "folder" not in inspect.signature(factory).parameters:
            raise ConfigError(f"model.weights = {weights!r} is a Hugging Face model folder, which only a factory that takes "
                              "`folder` builds from (pipeline.models.hf.decoder, pipeline.models.hf.encoder); set "
                              "model._target_ to one, or name a weight file")
        kwargs["folder"] = str(weights)
    try:
        if "seed" in kwargs:
            built = build(factory, kwargs, "model._target_")
        else:
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(section.seed)
                built = build(factory, kwargs, "model._target_")
    except PipelineError:
        raise
    except Exception as exc:  # the model's own code: any error it raises for kwargs it cannot take
        reason = (str(exc).strip().splitlines() or [""])[0][:300]
        raise ConfigError(f"model._target_ = {section._target_!r} failed to build the model from model.kwargs "
                          f"{kwargs} ({type(exc).__name__}: {reason}); fix the kwargs it names") from exc
    if not isinstance(built, torch.nn.Module):
        raise ConfigError(f"model._target_ = {section._target_!r} returned a {type(built).__name__}, not an nn.Module")
    empty = next((name for name, p in built.named_parameters() if p.numel() == 0), None)
    if empty is not None:
        raise ConfigError(f"model.kwargs {section.kwargs} build a model whose parameter {empty!r} has no "
                          f"elements (shape {list(built.get_parameter(empty).shape)}); give every size at least 1")
    if weights:
        _load_weights(built, section)
    elif section.init == "every_layer":
        _every_layer(built, section)
    return built.eval()


def _load_weights(built: torch.nn.Module, section: ModelConfig) -> None:
    """`model.weights` into the built model: a weight file read and loaded strictly, or a model folder
    transformers loaded, held to the same rules."""
    weights = str(section.weights)
    loaded = getattr(built, "folder_loading", None)  # a model folder transformers loaded itself (hf.from_folder)
    if loaded is not None:
        kept = checkpoint.check_loaded(loaded, f"model.weights = {weights!r}", section.weights_partial,
                                       bool(section.weight_prefixes))
        if kept:
            log.warning("model.weights = %r sets all but %d of the model's keys, which keep their seeded values "
                        "(model.weights_partial): %s", weights, len(kept), ", ".join(kept))
    else:
        target = getattr(built, "checkpoint_module", built)
        state = checkpoint.rename(checkpoint.read_state_dict(weights), dict(section.weight_prefixes))
        kept = checkpoint.load_strictly(target, state, f"model.weights = {weights!r}", section.weights_partial)
        if kept:
            log.warning("model.weights = %r sets %d of the model's keys; %d keep their seeded values (model.weights_partial): "
                        "%s", weights, len(state), len(kept), ", ".join(kept))


def program_constants(cfg: PipelineConfig, module: torch.nn.Module, weights: list[dict[str, Any]] | None) -> dict[str, Any]:
    """The constant methods the program of `module` carries: what the model asks for
    (`program_constants`), and the digests of the weight files it was built from (`WEIGHTS`)."""
    import json

    out = dict(getattr(module, "program_constants", None) or {})
    if weights is not None:
        out[WEIGHTS] = json.dumps({"path": str(cfg.model.weights), "files": weights}, separators=(",", ":"))
    return out


def _every_layer(module: torch.nn.Module, section: ModelConfig, draws: int = 8) -> None:
    """`model.init=every_layer`: what hides layers set, batch norms calibrated on `draws` seeded draws
    of the first method's example inputs, stacked on dim 0 (its batch)."""
    name, spec = next(iter(section.methods.items()))
    seed = section.seed
    batch = [torch.cat(xs) for xs in zip(*(example_inputs(spec, seed + i) for i in range(draws)))]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        show_every_layer(module)
        try:
            calibrate_batch_norms(module, spec.function, batch)
        except (RuntimeError, ValueError, TypeError, IndexError) as exc:
            reason = (str(exc).strip().splitlines() or [""])[0]  # one line
            raise ConfigError(f"model.init=every_layer calibrates batch norms on {draws} example inputs of method "
                              f"{name!r} stacked on dim 0, which the model cannot take ({type(exc).__name__}: "
                              f"{reason}); use model.init=factory") from exc


def method_module(module: torch.nn.Module, spec: MethodSpec) -> torch.nn.Module:
    """`module` with the method's function exposed as `forward`.

    Raises:
        ConfigError: `function` is not a public method the model's own class defines.
    """
    name = spec.function
    if name == "forward":
        return module
    own = inspect.getattr_static(type(module), name, None) is not None and not hasattr(torch.nn.Module, name)
    if name.startswith("_") or not own or not callable(getattr(module, name, None)):
        raise ConfigError(f"function = {name!r} is not a public method of {type(module).__name__} (nn.Module's own "
                          "methods and private names are not methods of a program)")
    return MethodView(module, name)


def example_inputs(spec: MethodSpec, seed: int) -> tuple[torch.Tensor, ...]:
    """Fixed-seed example inputs of one method."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for item in spec.inputs:
        dtype = DTYPES[item.dtype]
        if dtype.is_floating_point:
            out.append(torch.randn(*item.shape, generator=gen).to(dtype))
        else:
            out.append(torch.randint(item.low, item.high, tuple(item.shape), generator=gen).to(dtype))
    return tuple(out)


def declared_values(spec: MethodSpec) -> list[tuple[int, int] | None]:
    """Per input of one method: the inclusive range of values its config gives an integer input
    ([low, high - 1], where its examples are drawn), which bounds the input where no indexing op does."""
    return [None if DTYPES[item.dtype].is_floating_point or item.dtype == "bool" else (item.low, item.high - 1)
            for item in spec.inputs]


def dynamic_shapes(spec: MethodSpec) -> Any:
    """torch.export dynamic shapes of one method; a dim name used twice is one shared `Dim`."""
    if not spec.dynamic:
        return None
    dims = {name: Dim(name, min=d["min"], max=d["max"]) for name, d in spec.dims.items()}
    shapes = [{dim: dims[name] for dim, name in spec.dynamic.get(i, {}).items()} for i in range(len(spec.inputs))]
    # A MethodView takes *args, so its shapes nest one level deeper.
    return (tuple(shapes),) if spec.function != "forward" else tuple(shapes)


def compile_spec(cfg: PipelineConfig, method: str, program: torch.export.ExportedProgram | None = None) -> TensorRTCompileSpec:
    """The TensorRT compile spec of one method (global fields, then its per_method overrides); with
    the method's exported `program`, its `profiles` name the program's symbols instead of the
    method's dim names.

    Raises:
        ConfigError: a profile names a dim the method does not have, or a range outside the dim's.
    """
    fields = {k: v for k, v in asdict(cfg.compile).items() if k != "per_method"}
    fields.update(cfg.compile.per_method.get(method, {}))
    spec = TensorRTCompileSpec.from_mapping(fields).for_method(method)
    if not spec.profiles:
        return spec
    dims = cfg.model.methods[method].dims
    symbols = dim_symbols(cfg.model.methods[method], program) if program is not None else None
    for i, profile in enumerate(spec.profiles):
        for dim, (lo, opt, hi) in profile.items():
            if dim not in dims:
                raise ConfigError(f"compile.profiles[{i}] names dim {dim!r}, which method {method!r} does not have "
                                  f"(its dims: {sorted(dims)}); name a dim of model.methods.{method}.dims, or give "
                                  f"the method its own profiles in compile.per_method.{method}")
            if symbols is not None and dim not in symbols:
                raise ConfigError(f"compile.profiles[{i}] names dim {dim!r}, which no input of method {method!r} uses "
                                  f"dynamically (model.methods.{method}.dynamic)")
            if lo < dims[dim]["min"] or hi > dims[dim]["max"]:
                raise ConfigError(f"compile.profiles[{i}].{dim} = {[lo, opt, hi]} is not inside model.methods.{method}."
                                  f"dims.{dim} ({dims[dim]['min']}..{dims[dim]['max']}); a profile narrows a dim's range")
    if symbols is None:
        return spec
    return spec.with_profiles([{symbols[d]: r for d, r in p.items()} for p in spec.profiles])


def dim_symbols(spec: MethodSpec, program: torch.export.ExportedProgram) -> dict[str, str]:
    """Each dim name of a method -> the symbol its program sizes that dim with (a dim the export
    kept static has none)."""
    nodes = {n.name: n for n in program.graph.nodes if n.op == "placeholder"}
    names = program.graph_signature.user_inputs
    out = {}
    for i, by_dim in (spec.dynamic or {}).items():
        shape = nodes[names[i]].meta["val"].shape
        for dim, name in by_dim.items():
            size = shape[dim]
            if not isinstance(size, int):
                out[name] = str(size.node.expr)
    return out


def engine_cache(cfg: PipelineConfig) -> EngineCache | None:
    """The configured engine cache, or None when it is off."""
    if not cfg.cache.enabled:
        return None
    return EngineCache(cfg.cache.url, int(cfg.cache.max_gb * (1 << 30)))


def partitioners(cfg: PipelineConfig, method: str) -> list[Any]:
    """The partitioners after TensorRT for one method, fresh instances."""
    chain = cfg.partitioners.chain[1:]
    return [instantiate(e, "partitioner", f"partitioners.chain[{i}]._target_")
            for i, e in enumerate(chain, start=1) if not e.methods or method in e.methods]


def transform_passes(cfg: PipelineConfig, method: str) -> list[Any]:
    """Edge passes for one method ("*" entries first)."""
    passes = cfg.transforms.passes
    entries = [(f"transforms.passes.*[{i}]", e) for i, e in enumerate(passes.get("*", []))]
    entries += [(f"transforms.passes.{method}[{i}]", e) for i, e in enumerate(passes.get(method, []))]
    return [instantiate(e, "pass", f"{where}._target_") for where, e in entries]
