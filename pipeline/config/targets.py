"""Code that configs name. Only three slots take code, each of one kind: `model._target_` (an
`nn.Module` class or a registered model factory), a partitioner entry (an ExecuTorch `Partitioner`
class) and a transform pass (a `PassBase` class, such as an `ExportPass`). A `_target_` is imported
only from a trusted module prefix, and only used when it is of its slot's kind.

The trusted prefixes are not config: no override, composed config or `params.yaml` can widen them.
They are `TRUSTED_MODULES` plus the comma-separated prefixes in `$PIPELINE_TRUSTED_MODULES`, which
only the person running the command sets (e.g. `PIPELINE_TRUSTED_MODULES=mymodels.`).
"""

from __future__ import annotations

import importlib
import inspect
import os
from typing import Any

from pipeline.errors import ConfigError

TRUSTED_MODULES = ("pipeline.", "torchvision.models.", "timm.", "executorch.backends.", "executorch.exir.passes.")
ENV = "PIPELINE_TRUSTED_MODULES"
SLOTS = {
    "model": "an nn.Module class, a model factory (torchvision's or timm's builders, timm.create_model, "
             "@pipeline.models.registry.model_factory) or a function of a module you trust via $PIPELINE_TRUSTED_MODULES",
    "partitioner": "an ExecuTorch Partitioner class",
    "pass": "a graph pass class (a subclass of torch.fx PassBase, e.g. executorch's ExportPass)",
}


def trusted_prefixes() -> tuple[str, ...]:
    """`TRUSTED_MODULES` and the prefixes the environment adds (each ends with a dot)."""
    extra = [p.strip() for p in os.environ.get(ENV, "").split(",") if p.strip()]
    return TRUSTED_MODULES + tuple(p if p.endswith(".") else f"{p}." for p in extra)


def check_prefix(target: str, where: str) -> None:
    """Refuse a `_target_` outside the trusted prefixes (a string check: nothing is imported)."""
    trusted = trusted_prefixes()
    if not isinstance(target, str) or not target.startswith(trusted):
        raise ConfigError(f"{where} = {target!r} is outside the trusted modules {list(trusted)}; if you trust that "
                          f"code, add its prefix to ${ENV} (configs cannot)")


def locate(target: str, slot: str, where: str) -> Any:
    """Import the `module.attr` named by a `_target_` and check that it is what `slot` takes.

    Raises:
        ConfigError: untrusted module, import failure, or an object of another kind.
    """
    check_prefix(target, where)
    module, _, attr = target.rpartition(".")
    try:
        obj = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError, ValueError) as exc:
        raise ConfigError(f"{where} = {target!r} cannot be imported: {exc}") from exc
    if not _is_kind(obj, slot):
        kind = f"class {obj.__name__}" if inspect.isclass(obj) else type(obj).__name__
        raise ConfigError(f"{where} = {target!r} is a {kind}, but this slot takes {SLOTS[slot]}")
    return obj


def _is_kind(obj: Any, slot: str) -> bool:
    if slot == "model":
        import torch

        from pipeline.models.registry import is_model_factory

        return (inspect.isclass(obj) and issubclass(obj, torch.nn.Module)) or is_model_factory(obj) or _user_function(obj)
    if slot == "partitioner":
        from executorch.exir.backend.partitioner import Partitioner

        return inspect.isclass(obj) and issubclass(obj, Partitioner)
    if slot == "pass":
        from torch.fx.passes.infra.pass_base import PassBase

        return inspect.isclass(obj) and issubclass(obj, PassBase)
    raise AssertionError(f"unknown slot {slot!r}")


def _user_function(obj: Any) -> bool:
    """Whether `obj` is a function of a module the user trusts (`$PIPELINE_TRUSTED_MODULES`)."""
    module = getattr(obj, "__module__", None) or ""
    own = [p for p in trusted_prefixes() if p not in TRUSTED_MODULES]
    return inspect.isfunction(obj) and f"{module}.".startswith(tuple(own))
