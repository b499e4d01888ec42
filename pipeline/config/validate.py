"""The pipeline's own config rules, checked before anything is built or written: TensorRT first in
the chain, known methods in per-method maps, every value as the library itself would check it
(compile specs, input dtypes, shapes and dim ranges, file names), and every `_target_` trusted and
of its slot's kind (`targets.py`). Each failure is one `ConfigError` naming the key, the value and
what is allowed."""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
from collections.abc import Iterator, Mapping
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from pipeline.config.params_file import NAME, check_plain_names
from pipeline.config.targets import check_prefix, locate
from pipeline.errors import CompileSpecError, ConfigError
from pipeline.runtime import library_kernels as runtime_kernels
from pipeline.runtime.options import EXECUTORS, KERNELS

# Hydra's instantiate keys: the pipeline never hands a config to `hydra.utils.instantiate`, so a
# config that sets one would mean something it does not do.
_INSTANTIATE_KEYS = ("_partial_", "_args_", "_convert_", "_recursive_")
_SEED_MAX = 2**63
_DIM_MAX = 2**31 - 1
_EXAMPLE_MAX = 1 << 28  # elements of one example input (1 GiB in fp32)
# Where code may be named, and which kind of code each place takes.
_SLOTS = {r"model\._target_": "model", r"partitioners\.chain\[\d+\]\._target_": "partitioner",
          r"transforms\.passes\.[^.\[]+\[\d+\]\._target_": "pass"}


def validate(cfg: DictConfig, resolve_code: bool = True) -> None:
    """Raise `ConfigError` naming the first broken rule and how to fix it (`resolve_code`: also import
    every `_target_` to check its kind; without it only the trusted prefix is checked)."""
    _check_known_keys(cfg, "")
    _check_targets(cfg, resolve_code)
    methods = list(cfg.model.methods)
    _check_chain(cfg, methods)
    _known([m for m in cfg.transforms.passes if m != "*"], methods, "transforms.passes")
    _known(list(cfg.compile.per_method), methods, "compile.per_method")
    check_plain_names(cfg, None)
    _check_init(cfg)
    _check_numbers(cfg)
    for name, m in cfg.model.methods.items():
        _check_method(f"model.methods.{name}", m)
    _check_cache(cfg)
    _check_instantiate_keys(cfg, "")
    slots = []
    for where, entry in _targets(OmegaConf.masked_copy(cfg, [str(k) for k in cfg if k != "targets"]), "cfg"):
        # (each matrix target was checked as a whole config above, its code slots included)
        where = f"{where.removeprefix('cfg.')}._target_"
        slot = next((s for pattern, s in _SLOTS.items() if re.fullmatch(pattern, where)), None)
        if slot is None:
            raise ConfigError(f"{where} = {entry._target_!r}: only model, partitioners and transforms entries name code")
        slots.append((where, entry, slot))
    for where, entry, slot in slots:  # nothing is imported before every place is known to take code
        if resolve_code:
            _check_code(entry, slot, where)
        else:
            check_prefix(str(entry._target_), where)
    _check_compile(cfg, methods)  # last: it reads the config as the schema's objects


def _check_known_keys(node: Any, where: str) -> None:
    """Every key of a node the schema types is one of its schema's fields. A key added with `+`
    (`+compile.precison=fp16`, the form Hydra's own hint suggests) would be carried and ignored."""
    if isinstance(node, ListConfig):
        for i in range(len(node)):
            _check_known_keys(node._get_node(i), f"{where.removesuffix('.')}[{i}].")
        return
    if not isinstance(node, DictConfig) or node._is_none() or node._is_missing():
        return
    schema = OmegaConf.get_type(node)
    if dataclasses.is_dataclass(schema):
        fields = [f.name for f in dataclasses.fields(schema)]
        for name in map(str, node):
            if name not in fields and name not in _INSTANTIATE_KEYS:  # those get their own line
                group = where.removesuffix(".") or "the config"
                near = difflib.get_close_matches(name, fields, 1)
                raise ConfigError(f"{where}{name} is not an option of {group}: "
                                  + (f"did you mean {where}{near[0]}?" if near else f"its options are {', '.join(fields)}"))
    for key in node:
        _check_known_keys(node._get_node(key), f"{where}{key!s}.")


def _check_targets(cfg: DictConfig, resolve_code: bool) -> None:
    """Each build-matrix target is a whole config: its model and compile variant with the shared groups."""
    plain: Any = OmegaConf.to_container(cfg, resolve=True)
    for name, target in (plain.get("targets") or {}).items():
        if not NAME.fullmatch(str(name)):
            raise ConfigError(f"targets.{name} is not a plain name; name targets with letters, digits, '_', '-' and '.'")
        try:
            validate(OmegaConf.create({**plain, **target, "targets": {}}), resolve_code)
        except ConfigError as exc:
            raise ConfigError(f"build target {name!r}: {exc}") from exc


def _check_code(entry: DictConfig, slot: str, where: str) -> None:
    """The target is trusted, of its slot's kind, and takes the entry's kwargs (the model also its seed)."""
    from pipeline.config.objects import check_kwargs, check_no_download, model_kwargs

    target = locate(str(entry._target_), slot, where)
    section: Any = OmegaConf.to_container(entry, resolve=True)
    kwargs = model_kwargs(target, dict(section.get("kwargs") or {}), int(section["seed"])) if slot == "model" else dict(section.get("kwargs") or {})
    check_kwargs(target, kwargs, where)
    if slot == "model":
        check_no_download(target, kwargs)


def _check_chain(cfg: DictConfig, methods: list[str]) -> None:
    chain = list(cfg.partitioners.chain)
    if not chain or chain[0].name != "tensorrt" or chain[0].get("_target_"):
        first = chain[0].name if chain else "nothing"
        raise ConfigError(f"partitioners.chain must start with `- name: tensorrt`, found {first!r}; put TensorRT first")
    if any(entry.name == "tensorrt" for entry in chain[1:]):
        raise ConfigError("partitioners.chain names tensorrt more than once; keep only the first entry")
    for i, entry in enumerate(chain[1:], start=1):
        if not entry.get("_target_"):
            raise ConfigError(f"partitioners.chain[{i}] ({entry.name!r}) needs a _target_ naming its partitioner class")
        _known(entry.get("methods") or [], methods, f"partitioners.chain[{i}].methods")


def _check_numbers(cfg: DictConfig) -> None:
    for key, seed in (("model.seed", cfg.model.get("seed", 0)),
                      ("runtime.validation_seed", cfg.get("runtime", {}).get("validation_seed", 1))):
        if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < _SEED_MAX:
            raise ConfigError(f"{key} = {seed!r} must be an integer in 0..2**63-1")
    executor = cfg.get("runtime", {}).get("executor", "pipeline")
    if executor not in EXECUTORS:
        raise ConfigError(f"runtime.executor = {executor!r} is not a runtime; use one of {list(EXECUTORS)}")
    kernels = cfg.get("runtime", {}).get("kernels", "lazy")
    if kernels not in KERNELS:
        raise ConfigError(f"runtime.kernels = {kernels!r} is not a kernel specialization strategy; use one of {list(KERNELS)}")
    missing = cfg.get("serialize", {}).get("runtime_kernels", "warn")
    if missing not in runtime_kernels.CHOICES:
        raise ConfigError(f"serialize.runtime_kernels = {missing!r} is not one of {list(runtime_kernels.CHOICES)}")
    bound = cfg.get("runtime", {}).get("max_rel_error", 0.02)
    if not _positive(bound):
        raise ConfigError(f"runtime.max_rel_error = {bound!r} must be a positive, finite relative error (e.g. 0.02)")


def _positive(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0


def _check_cache(cfg: DictConfig) -> None:
    cache = cfg.get("cache")
    if cache is None:
        return
    if not _positive(cache.max_gb) or cache.max_gb > 1e9:
        raise ConfigError(f"cache.max_gb = {cache.max_gb!r} must be a positive, finite number of GB (or cache=off)")
    if cache.url is not None:
        import fsspec

        try:
            fsspec.core.url_to_fs(str(cache.url))
        except (ValueError, ImportError) as exc:
            raise ConfigError(f"cache.url = {cache.url!r} is not a folder or fsspec URL this machine can open ({exc})") from exc


def _check_init(cfg: DictConfig) -> None:
    from pipeline.models.weights import INITS

    if cfg.model.get("init", "factory") not in INITS:
        raise ConfigError(f"model.init = {cfg.model.init!r} is not one of {list(INITS)}")
    weights = cfg.model.get("weights")
    if weights is not None and (not isinstance(weights, str) or not weights.strip()):
        raise ConfigError(f"model.weights = {weights!r} must name a weight file or model folder (or be null: seeded weights)")
    if weights and cfg.model.get("init", "factory") != "factory":
        raise ConfigError(f"model.init = {cfg.model.init!r} sets up random weights, but model.weights = {weights!r} gives "
                          "them; leave model.init=factory")
    if not weights and (cfg.model.get("weight_prefixes") or cfg.model.get("weights_partial")):
        raise ConfigError("model.weight_prefixes and model.weights_partial apply to model.weights, which is null; "
                          "name the weight file")


def _check_method(where: str, m: DictConfig) -> None:
    from pipeline.config.objects import DTYPES

    if not m.inputs:
        raise ConfigError(f"{where}.inputs is empty; a method takes at least one input")
    for dim_name, dim in m.dims.items():
        if not isinstance(dim, Mapping) or sorted(dim) != ["max", "min"] or not all(
                isinstance(v, int) and not isinstance(v, bool) for v in dim.values()):
            raise ConfigError(f"{where}.dims.{dim_name} = {dim!r} is not a dim; give its range as {{min: 1, max: 16}} "
                              "(two integers)")
        if not 0 <= dim["min"] <= dim["max"] <= _DIM_MAX:
            raise ConfigError(f"{where}.dims.{dim_name} = {{min: {dim['min']}, max: {dim['max']}}}; needs 0 <= min <= max "
                              "< 2**31 (TensorRT's dims are 32-bit)")
    for i, item in enumerate(m.inputs):
        if item.dtype not in DTYPES:
            raise ConfigError(f"{where}.inputs[{i}].dtype = {item.dtype!r} is not supported; use one of {list(DTYPES)}")
        if any(size < 1 for size in item.shape):
            raise ConfigError(f"{where}.inputs[{i}].shape = {list(item.shape)} has a size below 1; an example "
                              "input has at least one element along every dim")
        if math.prod(item.shape) > _EXAMPLE_MAX:
            raise ConfigError(f"{where}.inputs[{i}].shape = {list(item.shape)} has {math.prod(item.shape)} elements, "
                              f"more than an example input may ({_EXAMPLE_MAX}); a dynamic dim's range, not its "
                              "example size, says how large the program's inputs may be")
        if item.dtype not in ("float32", "float16", "bfloat16", "bool"):
            info = _iinfo(item.dtype)
            if not info.min <= item.low < item.high <= info.max:
                raise ConfigError(f"{where}.inputs[{i}]: low = {item.low}, high = {item.high}; needs low < high, both "
                                  f"in {item.dtype}'s range {info.min}..{info.max}")
    _check_dynamic(where, m)


def _iinfo(dtype: str) -> Any:
    import torch

    return torch.iinfo(getattr(torch, dtype))


def _check_dynamic(where: str, m: DictConfig) -> None:
    for index, dims in (m.dynamic or {}).items():
        if not 0 <= int(index) < len(m.inputs):
            raise ConfigError(f"{where}.dynamic names input {index}, but the method has {len(m.inputs)} inputs")
        shape = list(m.inputs[int(index)].shape)
        for dim, dim_name in dims.items():
            if dim_name not in m.dims:
                raise ConfigError(f"{where}.dynamic[{index}][{dim}] = {dim_name!r} is not in its dims {list(m.dims)}")
            if not 0 <= int(dim) < len(shape):
                raise ConfigError(f"{where}.dynamic[{index}] names dim {dim}, but input {index} has shape {shape}")
            lo, hi = m.dims[dim_name].min, m.dims[dim_name].max
            if not lo <= shape[int(dim)] <= hi:
                raise ConfigError(f"{where}.inputs[{index}].shape[{dim}] = {shape[int(dim)]} lies outside its dim "
                                  f"{dim_name!r} range {lo}..{hi}; make the example size fit the range")
            if shape[int(dim)] == 1 and hi > 1:
                raise ConfigError(f"{where}.inputs[{index}].shape[{dim}] = 1 on dynamic dim {dim_name!r}: torch.export "
                                  "makes a dim of example size 1 static; give the example 2 or more there (the program "
                                  f"still takes {lo}..{hi}), or drop the dim from {where}.dynamic")


def _check_compile(cfg: DictConfig, methods: list[str]) -> None:
    from pipeline.config.objects import compile_spec
    from pipeline.config.schema import typed

    config = typed(cfg)
    for method in methods:
        try:
            compile_spec(config, method)
        except (CompileSpecError, TypeError) as exc:
            where = f"compile.per_method.{method}" if method in cfg.compile.per_method else "compile"
            raise ConfigError(f"{where}: {exc}") from exc


def _known(keys: list[str], methods: list[str], where: str) -> None:
    unknown = sorted(set(keys) - set(methods))
    if unknown:
        raise ConfigError(f"{where} names unknown method(s) {unknown}; the model's methods are {methods}")


def _check_instantiate_keys(node: Any, where: str) -> None:
    if isinstance(node, DictConfig):
        for key, value in node.items():
            here = f"{where}.{key!s}" if where else str(key)
            if key in _INSTANTIATE_KEYS:
                raise ConfigError(f"{here} is a Hydra instantiate key, which the pipeline does not use (it builds each "
                                  "`_target_` with its `kwargs` alone); remove it")
            _check_instantiate_keys(value, here)
    elif isinstance(node, ListConfig):
        for i, value in enumerate(node):
            _check_instantiate_keys(value, f"{where}[{i}]")


def _targets(node: Any, where: str) -> Iterator[tuple[str, Any]]:
    if isinstance(node, DictConfig):
        for key, value in node.items():
            if key == "_target_" and value is not None:
                yield where, node
            else:
                yield from _targets(value, f"{where}.{key!s}")
    elif isinstance(node, ListConfig):
        for i, value in enumerate(node):
            yield from _targets(value, f"{where}[{i}]")
