"""Model factories a config may name: functions marked `@model_factory`, torchvision's registered model
builders, `timm.create_model` and timm's registered models, and any function of a module the person
running the command trusts through `$PIPELINE_TRUSTED_MODULES` (their own code). An `nn.Module` class
needs no mark. The pipeline seeds every factory's weights; factories need no `seed` argument."""

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
    """Whether `obj` is a model factory the project knows: marked `@model_factory`, or a torchvision or
    timm builder (`config.targets` also takes functions of the modules a user trusts)."""
    return obj in _FACTORIES or is_torchvision_builder(obj) or is_timm_builder(obj)


def is_torchvision_builder(obj: Any) -> bool:
    if not getattr(obj, "__module__", "").startswith("torchvision.models"):
        return False
    from torchvision.models import get_model_builder, list_models

    return any(obj is get_model_builder(name) for name in list_models())


def is_timm_builder(obj: Any) -> bool:
    if not getattr(obj, "__module__", "").startswith("timm."):
        return False
    import timm

    return obj is timm.create_model or (timm.is_model(obj.__name__) and timm.models.model_entrypoint(obj.__name__) is obj)


# Keyword arguments through which timm, torchvision or transformers load weights or configs from a
# file or the network.
_LOADING_KWARGS = frozenset({"pretrained", "pretrained_cfg", "pretrained_cfg_overlay", "checkpoint_path", "cache_dir",
                             "weights", "weights_backbone", "pretrained_backbone", "pretrained_model_name_or_path"})
_WEIGHT_SUFFIXES = (".pth", ".pt", ".pt2", ".bin", ".safetensors", ".ckpt", ".npz", ".h5", ".pkl", ".json")


def download_reason(obj: Any, kwargs: dict[str, Any]) -> str | None:
    """Why these kwargs would make factory `obj` read weights from a file or the network, or None:
    a loading argument that is set (`pretrained`, `checkpoint_path`, torchvision's `weights`, ...), or
    any value, however nested, that names a URL, a path or a weight file."""
    if is_torchvision_builder(obj) and any(kwargs.get(k) is not None for k in ("weights", "weights_backbone")):
        return "names pretrained torchvision weights"
    if is_timm_builder(obj) and (kwargs.get("pretrained") or kwargs.get("pretrained_cfg_overlay")):
        return "asks timm for pretrained weights"
    for key, value in kwargs.items():
        if key in _LOADING_KWARGS and value not in (None, False, "", {}, []):
            return f"sets {key}={value!r}, which loads weights or configs from a file or the network"
        where = _names_a_file(value)
        if where is not None:
            return f"names a file or URL in {key} ({where!r})"
    return None


def _names_a_file(value: Any) -> str | None:
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (list, tuple)):
        return next((found for v in value if (found := _names_a_file(v)) is not None), None)
    if isinstance(value, str) and ("://" in value or "/" in value or "\\" in value or value.lower().endswith(_WEIGHT_SUFFIXES)):
        return value
    return None

