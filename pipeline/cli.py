"""Command-line plumbing shared by `python -m pipeline`, `python -m pipeline.config.compose` and the
stage scripts: every error we raise on purpose, every config error and every failed write is one
line on stderr and exit status 2 (`PIPELINE_DEBUG=1` shows the full traceback instead); malformed
YAML is named by file, line and column; command-line arguments that would name code are refused."""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import NoReturn

import yaml

from pipeline.errors import ConfigError, PipelineError

DEBUG_ENV = "PIPELINE_DEBUG"
# Hydra flags that would compose configs from outside `conf/`, or unpickle a file (--experimental-rerun).
_FOREIGN_FLAGS = ("-cp", "--config-path", "-cd", "--config-dir", "--experimental-rerun")
# Hydra keys whose values Hydra itself turns into code (callbacks, launchers, logging handlers).
# (Choosing one of Hydra's own option files, such as hydra/job_logging=disabled, stays allowed.)
_CODE_KEYS = re.compile(r"^hydra\.(callbacks|job_logging|hydra_logging)\b|^hydra/callbacks\b|^hydra\..*(_target_|\(\)|\bclass\b)")


@contextmanager
def reported() -> Iterator[None]:
    """Turn our errors (and Hydra's, OmegaConf's, YAML's and the OS's) into one line and exit 2."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    try:
        yield
    except (PipelineError, HydraException, OmegaConfBaseException, yaml.YAMLError, OSError) as exc:
        if os.environ.get(DEBUG_ENV):
            raise
        fail(exc)


def fail(exc: BaseException) -> NoReturn:
    """Print `exc` as one line (`error: ...`) and exit with status 2."""
    text = " ".join(line.strip() for line in str(exc).splitlines() if line.strip()) or type(exc).__name__
    cause = (str(exc.__cause__).strip().splitlines() or [""])[0] if exc.__cause__ is not None else ""
    if cause and cause not in text:  # e.g. Hydra's "Error merging override x=y" says why only in its cause
        text = f"{text}: {cause}"
    if isinstance(exc, OSError) and not isinstance(exc, PipelineError):
        text = f"{exc.strerror or exc}: {exc.filename}" if exc.filename else text
    print(f"error: {text}" + ("" if os.environ.get(DEBUG_ENV) else f"  (set {DEBUG_ENV}=1 for the traceback)"),
          file=sys.stderr)
    raise SystemExit(2)


def check_yaml(conf_dir: str | Path) -> None:
    """Raise `ConfigError` naming file, line and column of the first malformed YAML file in `conf_dir`."""
    for path in sorted(Path(conf_dir).rglob("*.yaml")):
        try:
            yaml.safe_load(path.read_text())
        except yaml.MarkedYAMLError as exc:
            mark = exc.problem_mark or exc.context_mark
            at = f":{mark.line + 1}:{mark.column + 1}" if mark else ""
            raise ConfigError(f"{path}{at}: malformed YAML: {exc.problem or exc.context}") from exc
        except yaml.YAMLError as exc:
            raise ConfigError(f"{path}: malformed YAML: {exc}") from exc


def check_arguments(args: Sequence[str]) -> None:
    """Refuse command-line arguments that would name code or read configs from outside `conf/`."""
    for arg in args:
        if arg.split("=", 1)[0] in _FOREIGN_FLAGS:
            raise ConfigError(f"{arg.split('=', 1)[0]} is not supported: the pipeline composes only its own conf/ "
                              "(select options and experiments with overrides such as +experiment=NAME)")
        key = arg.lstrip("+~").split("=", 1)[0]
        if key.startswith("allowed_target_prefixes"):
            raise ConfigError("allowed_target_prefixes is not a config key: trusted modules come from "
                              "$PIPELINE_TRUSTED_MODULES, which configs and overrides cannot set")
        if _CODE_KEYS.search(key) or (key.startswith("hydra.") and re.search(r"_target_|\(\)|\bclass\b", arg)):
            raise ConfigError(f"override {arg!r} would make Hydra run code named on the command line; "
                              "configure callbacks, launchers and logging in conf/ instead")
