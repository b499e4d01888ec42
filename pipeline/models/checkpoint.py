"""Trained weights from files (`model.weights`): what a checkpoint path names, reading it without
running code, and loading it strictly into the module a config builds.

What a path names and which files it reads: `weight_files.py`. Loading is strict (`load_strictly`):
every key of the module's state dict set once, no key left over, shapes and dtypes equal; a key the file lacks is an error unless the module ties
it to one the file sets (a language model's output head and its embedding).
"""

from __future__ import annotations

import pickle
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from pipeline.errors import ConfigError
from pipeline.models.weight_files import HF_CONFIG, INDEX, SAFETENSORS, weight_files

# Dicts that hold a state dict in the checkpoints of timm, Lightning and common training scripts.
_NESTED = ("state_dict", "model", "module")
_SHOWN = 3  # keys named in an error line


def read_state_dict(path: str | Path) -> dict[str, torch.Tensor]:
    """Every tensor `path` holds, by key (a model folder's weights; the shards of an index merged).

    Raises:
        ConfigError: a file that is truncated or not of its format, a pickle that needs code, a key
            in two shards, or a checkpoint that holds no state dict.
    """
    files = [f for f in weight_files(path) if f.name != HF_CONFIG and not f.name.lower().endswith(INDEX)]
    state: dict[str, torch.Tensor] = {}
    for file in files:
        part = _read_safetensors(file) if file.name.lower().endswith(SAFETENSORS) else _read_pickled(file)
        twice = sorted(set(part) & set(state))
        if twice:
            raise ConfigError(f"{file} sets {_keys(twice)}, which another shard of {path} sets too; rewrite the checkpoint")
        state.update(part)
    return state


def _read_safetensors(file: Path) -> dict[str, torch.Tensor]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        return load_file(str(file))
    except (SafetensorError, OSError, ValueError) as exc:
        raise ConfigError(f"{file} is not a readable safetensors file (truncated, or another format: {exc}); "
                          "copy it again or save it with safetensors") from exc


def _read_pickled(file: Path) -> dict[str, torch.Tensor]:
    try:
        try:
            loaded = torch.load(file, map_location="cpu", weights_only=True, mmap=True)
        except RuntimeError as exc:  # mapped only when saved as a zip archive (torch.save's format since 1.6)
            if "mmap" not in str(exc):
                raise
            loaded = torch.load(file, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        first = (str(exc).strip().splitlines() or [""])[0][:200]
        if "weights_only" in str(exc) or "global" in str(exc).lower():
            raise ConfigError(f"{file} would run code to load ({first}); only tensors are read from a checkpoint: save "
                              "its state_dict() (torch.save(model.state_dict(), ...)) or save it as safetensors") from exc
        raise ConfigError(f"{file} is not a PyTorch checkpoint (truncated or another format: {first}); copy it again "
                          "or save it with torch.save(model.state_dict(), ...)") from exc
    except (RuntimeError, OSError, EOFError, ValueError) as exc:
        first = (str(exc).strip().splitlines() or [""])[0][:200]
        raise ConfigError(f"{file} is not a PyTorch checkpoint (truncated or another format: {first}); copy it again "
                          "or save it with torch.save(model.state_dict(), ...)") from exc
    return _state_dict_of(loaded, file)


def _state_dict_of(loaded: Any, file: Path) -> dict[str, torch.Tensor]:
    if isinstance(loaded, Mapping) and loaded and all(isinstance(v, torch.Tensor) for v in loaded.values()):
        return {str(k): v for k, v in loaded.items()}
    if isinstance(loaded, Mapping):
        for key in _NESTED:
            if key in loaded and isinstance(loaded[key], Mapping):
                return _state_dict_of(loaded[key], file)
    what = f"a dict with keys {_keys(sorted(map(str, loaded)))}" if isinstance(loaded, Mapping) else type(loaded).__name__
    raise ConfigError(f"{file} holds {what}, not a state dict (key -> tensor, or one under "
                      f"{' / '.join(repr(k) for k in _NESTED)}); save model.state_dict()")


def rename(state: Mapping[str, torch.Tensor], prefixes: Mapping[str, str]) -> dict[str, torch.Tensor]:
    """`state` with each key's longest matching prefix in `prefixes` (file prefix -> module prefix)
    replaced: {"module.": ""} strips a wrapper's prefix, {"": "backbone."} adds one."""
    order = sorted(prefixes, key=len, reverse=True)
    out: dict[str, torch.Tensor] = {}
    source: dict[str, str] = {}
    for key, value in state.items():
        old = next((p for p in order if key.startswith(p)), None)
        new = key if old is None else prefixes[old] + key[len(old):]
        if new in source:  # two of the file's keys would load into one parameter: neither is taken silently
            raise ConfigError(f"model.weight_prefixes maps the file's keys {source[new]!r} and {key!r} both to {new!r}; "
                              "map prefixes so that each key of the file names its own parameter")
        out[new], source[new] = value, key
    return out


def check_loaded(loaded: Mapping[str, list[str]], source: str, keep_missing: bool, prefixes: bool) -> list[str]:
    """What `load_strictly` holds a file to, for a model folder transformers loaded itself (its
    `missing_keys`, `unexpected_keys`, `mismatched_keys`); returns the keys kept as built.

    Raises:
        ConfigError: a key the folder sets that the model does not have, one of another shape, one it
            lacks (unless `keep_missing`), or prefixes given (transformers maps a folder's keys itself).
    """
    if prefixes:
        raise ConfigError(f"{source} is a model folder, whose keys transformers maps to the model itself; drop "
                          "model.weight_prefixes (it maps the keys of a weight file)")
    if loaded["unexpected_keys"]:
        raise ConfigError(f"{source} sets {len(loaded['unexpected_keys'])} key(s) the model does not have: "
                          f"{_keys(loaded['unexpected_keys'])}; check that its config.json and model.kwargs build the model "
                          "its weights were saved from")
    if loaded["mismatched_keys"]:
        raise ConfigError(f"{source}: {len(loaded['mismatched_keys'])} key(s) differ in shape from the model's: "
                          f"{_keys(loaded['mismatched_keys'])}; build the model with the sizes the folder was saved with")
    if loaded["missing_keys"] and not keep_missing:
        raise ConfigError(f"{source} lacks {len(loaded['missing_keys'])} key(s) of the model: {_keys(loaded['missing_keys'])}; "
                          "check that its config.json and model.kwargs build the model it was saved from, or set "
                          "model.weights_partial=true to keep the seeded values of what it lacks")
    return list(loaded["missing_keys"])


def load_strictly(module: torch.nn.Module, state: Mapping[str, torch.Tensor], source: str, keep_missing: bool = False) -> list[str]:
    """Copy `state` into `module` in place; return the keys the file did not set (none unless
    `keep_missing`: those keep the values they were built with).

    Raises:
        ConfigError: a key of the module the file lacks (unless tied to one it sets, or
            `keep_missing`), a key the module does not have, or a shape or dtype that differs.
    """
    own = module.state_dict(keep_vars=True)
    unexpected = sorted(set(state) - set(own))
    if unexpected:
        close = _close_prefix(unexpected[0], own)
        raise ConfigError(f"{source} sets {len(unexpected)} key(s) the model does not have: {_keys(unexpected)}; "
                          + (f"map the prefix with model.weight_prefixes={{{close[0]!r}: {close[1]!r}}} " if close else
                             "check that model._target_ and model.kwargs build the model this file was saved from ")
                          + "(model.weight_prefixes maps a file's key prefixes to the model's)")
    set_storage = {own[k].data_ptr() for k in state if own[k].numel()}
    missing = sorted(k for k in own if k not in state and not (own[k].numel() and own[k].data_ptr() in set_storage))
    if missing and not keep_missing:
        raise ConfigError(f"{source} lacks {len(missing)} key(s) of the model: {_keys(missing)}; check that model._target_ "
                          "and model.kwargs build the model it was saved from, or set model.weights_partial=true to keep "
                          "the seeded values of what it lacks")
    for what, differs in (("shape", lambda a, b: a.shape != b.shape), ("dtype", lambda a, b: a.dtype != b.dtype)):
        bad = [k for k in sorted(state) if differs(own[k], state[k])]
        if bad:
            k = bad[0]
            got, want = (list(state[k].shape), list(own[k].shape)) if what == "shape" else (state[k].dtype, own[k].dtype)
            fix = ("build the model with the sizes the file was saved with (model.kwargs)" if what == "shape" else
                   "build the model in the file's dtype (model.kwargs.dtype, where the factory takes one) or convert the file")
            raise ConfigError(f"{source}: {len(bad)} key(s) differ in {what} from the model's, first {k!r}: {got} in the file, "
                              f"{want} in the model ({_keys(bad)}); {fix}")
    with torch.no_grad():
        module.load_state_dict(dict(state), strict=False)
    return missing


def _close_prefix(key: str, own: Mapping[str, Any]) -> tuple[str, str] | None:
    """A prefix mapping under which `key` becomes one of the module's keys, if one exists."""
    parts = key.split(".")
    for cut in range(1, len(parts)):  # the file has a wrapper's prefix
        if ".".join(parts[cut:]) in own:
            return ".".join(parts[:cut]) + ".", ""
    for name in own:  # the module has one
        if name.endswith("." + key):
            return "", name[: -len(key)]
    return None


def _keys(keys: list[str]) -> str:
    shown = ", ".join(repr(k) for k in keys[:_SHOWN])
    return shown + (f" and {len(keys) - _SHOWN} more" if len(keys) > _SHOWN else "")
