"""Model factories a config may name: functions marked `@model_factory` here, and torchvision's own
registered model builders. (An `nn.Module` class needs no mark: its kind is plain.)"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])
_FACTORIES: set[Callable[..., Any]] = set()


def model_factory(fn: F) -> F:
    """Mark `fn` as a function that builds a model, so a config's `model._target_` may name it."""
    _FACTORIES.add(fn)
    return fn


def is_model_factory(obj: Any) -> bool:
    """Whether `obj` is a marked factory or one of torchvision's registered model builders."""
    if obj in _FACTORIES:
        return True
    if not getattr(obj, "__module__", "").startswith("torchvision.models"):
        return False
    from torchvision.models import get_model_builder, list_models

    return any(obj is get_model_builder(name) for name in list_models())


def is_torchvision_builder(obj: Any) -> bool:
    return obj not in _FACTORIES and is_model_factory(obj)
