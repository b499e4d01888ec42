"""`params.yaml` read as plain data, for the DVC stages that run on every `dvc repro` before any other
(`names`, `toolchain`): no Hydra, OmegaConf or torch, so they start in a fraction of a second. The
names that become paths are checked here; everything else is validated by `compose.read_params`."""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from pipeline.errors import ConfigError

PARAMS = "params.yaml"
WRITE_IT = "write it with `python -m pipeline.config.compose [OVERRIDES]`"
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


def check_params_file(path: str | Path = PARAMS) -> None:
    """Refuse a `params.yaml` that is a pipe, a device or a folder (reading one would block or fail).

    Raises:
        ConfigError: naming the path and the command that writes it.
    """
    if Path(path).exists() and not Path(path).is_file():
        raise ConfigError(f"{path} is not a regular file (a pipe, device or folder); {WRITE_IT}")


def read_plain(path: str | Path = PARAMS) -> dict[str, Any]:
    """`params.yaml` as plain data (a mapping; not yet validated).

    Raises:
        ConfigError: the file is missing, not a regular file, not YAML or not a mapping.
    """
    check_params_file(path)
    try:
        data = yaml.safe_load(Path(path).read_text())
    except FileNotFoundError as exc:
        raise ConfigError(f"{path} does not exist; {WRITE_IT}") from exc
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path} is not YAML ({type(exc).__name__}); {WRITE_IT}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{path} is not a mapping; {WRITE_IT}")
    return data


def target_names(params: Mapping[str, Any]) -> list[str]:
    """The build-matrix targets params.yaml holds."""
    return [str(k) for k in params.get("targets") or {}]


def plain_target(params: Mapping[str, Any], target: str | None) -> dict[str, Any]:
    """The plain config of one build-matrix target (its model and compile variant with the shared
    groups); `params` itself for None.

    Raises:
        ConfigError: there is no target of that name.
    """
    if target is None:
        return dict(params)
    targets = params.get("targets") or {}
    check_target(target, targets)
    return {**params, "model": targets[target]["model"], "compile": targets[target]["compile"], "targets": {}}


def check_target(target: str, targets: Mapping[str, Any]) -> None:
    """Raise `ConfigError` when `targets` has no `target`, naming those it has."""
    if target not in targets:
        raise ConfigError(f"params.yaml has no build target {target!r} (it has {sorted(targets)}); compose the "
                          "matrix that holds it, e.g. `python -m pipeline.config.compose matrix=zoo`")


def check_plain_names(cfg: Mapping[str, Any], target: str | None) -> None:
    """Names that become file and directory names (a build target's too): plain names, never paths.

    Raises:
        ConfigError: naming the key and what a plain name is.
    """
    model, serialize = cfg.get("model") or {}, cfg.get("serialize") or {}
    for key, value in (("model.name", model.get("name")), ("serialize.output_name", serialize.get("output_name")),
                       ("the build target", target)):
        if (value is not None or key == "model.name") and not NAME.fullmatch(str(value)):
            raise ConfigError(f"{key} = {value!r} is not a plain file name; use letters, digits, '_', '-' and '.' "
                              "(no paths), starting with a letter or digit")
