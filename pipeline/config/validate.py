"""The pipeline's own config rules, checked before any build: TensorRT first in the chain, known
methods in per-method maps, `_target_`s only from allowed module prefixes."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from omegaconf import DictConfig, ListConfig

from pipeline.errors import ConfigError


def validate(cfg: DictConfig) -> None:
    """Raise `ConfigError` naming the first broken rule and how to fix it."""
    methods = list(cfg.model.methods)
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
    _known([m for m in cfg.transforms.passes if m != "*"], methods, "transforms.passes")
    _known(list(cfg.compile.per_method), methods, "compile.per_method")
    for name, m in cfg.model.methods.items():
        for index, dims in m.dynamic.items():
            if int(index) >= len(m.inputs):
                raise ConfigError(f"model.methods.{name}.dynamic names input {index}, but the method has {len(m.inputs)} inputs")
            for dim, dim_name in dims.items():
                if dim_name not in m.dims:
                    raise ConfigError(f"model.methods.{name}.dynamic[{index}][{dim}] = {dim_name!r} is not in its dims {list(m.dims)}")
    allowed = tuple(cfg.allowed_target_prefixes)
    for where, target in _targets(cfg, "cfg"):
        if not str(target).startswith(allowed):
            raise ConfigError(
                f"{where}._target_ = {target!r} is outside the allowed module prefixes {list(allowed)}; "
                "add its prefix to allowed_target_prefixes if you trust that code"
            )


def _known(keys: list[str], methods: list[str], where: str) -> None:
    unknown = sorted(set(keys) - set(methods))
    if unknown:
        raise ConfigError(f"{where} names unknown method(s) {unknown}; the model's methods are {methods}")


def _targets(node: Any, where: str) -> Iterator[tuple[str, Any]]:
    if isinstance(node, DictConfig):
        for key, value in node.items():
            if key == "_target_" and value is not None:
                yield where, value
            else:
                yield from _targets(value, f"{where}.{key!s}")
    elif isinstance(node, ListConfig):
        for i, value in enumerate(node):
            yield from _targets(value, f"{where}[{i}]")
