"""Turn a composed config (plain data) into the objects the library takes: the model, example
inputs, dynamic shapes, compile specs, partitioner chains and passes. Every `_target_` is checked
against the allowed prefixes before it is imported."""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

import torch
from torch.export import Dim

from pipeline.errors import ConfigError
from pipeline.models.decoder import MethodView
from pipeline.tensorrt.compile_spec import TensorRTCompileSpec

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16, "int64": torch.int64,
           "int32": torch.int32, "bool": torch.bool}


def locate(target: str, allowed: list[str]) -> Any:
    """Import `module.attr` named by a `_target_`, refusing modules outside `allowed` prefixes."""
    if not target.startswith(tuple(allowed)):
        raise ConfigError(f"_target_ {target!r} is outside the allowed module prefixes {allowed}")
    module, _, attr = target.rpartition(".")
    try:
        return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"_target_ {target!r} cannot be imported: {exc}") from exc


def instantiate(entry: Mapping[str, Any], allowed: list[str]) -> Any:
    """Call `entry["_target_"]` with `entry["kwargs"]`."""
    return locate(str(entry["_target_"]), allowed)(**dict(entry.get("kwargs") or {}))


def model(cfg: Mapping[str, Any]) -> torch.nn.Module:
    """The model of the config, with weights from its seed."""
    kwargs = dict(cfg["model"].get("kwargs") or {})
    return instantiate({"_target_": cfg["model"]["_target_"], "kwargs": {"seed": cfg["model"]["seed"], **kwargs}},
                       cfg["allowed_target_prefixes"]).eval()


def method_module(module: torch.nn.Module, spec: Mapping[str, Any]) -> torch.nn.Module:
    """`module` with the method's function exposed as `forward`."""
    return module if spec.get("function", "forward") == "forward" else MethodView(module, spec["function"])


def example_inputs(spec: Mapping[str, Any], seed: int) -> tuple[torch.Tensor, ...]:
    """Fixed-seed example inputs of one method."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for item in spec["inputs"]:
        dtype = _DTYPES[item.get("dtype", "float32")]
        if dtype.is_floating_point:
            out.append(torch.randn(*item["shape"], generator=gen).to(dtype))
        else:
            out.append(torch.randint(item.get("low", 0), item.get("high", 2), tuple(item["shape"]), generator=gen).to(dtype))
    return tuple(out)


def dynamic_shapes(spec: Mapping[str, Any], function: str) -> Any:
    """torch.export dynamic shapes of one method; a dim name used twice is one shared `Dim`."""
    if not spec.get("dynamic"):
        return None
    dims = {name: Dim(name, min=d["min"], max=d["max"]) for name, d in spec["dims"].items()}
    shapes = [{int(dim): dims[name] for dim, name in spec["dynamic"].get(i, spec["dynamic"].get(str(i), {})).items()}
              for i in range(len(spec["inputs"]))]
    # A MethodView takes *args, so its shapes nest one level deeper.
    return (tuple(shapes),) if function != "forward" else tuple(shapes)


def compile_spec(cfg: Mapping[str, Any], method: str) -> TensorRTCompileSpec:
    """The TensorRT compile spec of one method (global fields, then its per_method overrides)."""
    fields = {k: v for k, v in cfg["compile"].items() if k != "per_method"}
    fields.update((cfg["compile"].get("per_method") or {}).get(method, {}))
    return TensorRTCompileSpec.from_mapping(fields).for_method(method)


def partitioners(cfg: Mapping[str, Any], method: str) -> list[Any]:
    """The partitioners after TensorRT for one method, fresh instances."""
    chain = cfg["partitioners"]["chain"][1:]
    return [instantiate(e, cfg["allowed_target_prefixes"]) for e in chain if not e.get("methods") or method in e["methods"]]


def transform_passes(cfg: Mapping[str, Any], method: str) -> list[Any]:
    """Edge passes for one method ("*" entries first)."""
    passes = cfg["transforms"]["passes"]
    entries = list(passes.get("*", [])) + list(passes.get(method, []))
    return [instantiate(e, cfg["allowed_target_prefixes"]) for e in entries]
