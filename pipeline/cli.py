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
# The only Hydra settings a command line may change: where runs write, and the launcher's and
# sweeper's plain options. Everything else (search path, job environment, job name, output subdir,
# callbacks, logging handlers) stays as conf/ sets it: each can run code, set the environment the
# trusted modules come from, or write outside the run directory.
_HYDRA_KEYS = re.compile(r"^hydra\.(run\.dir|sweep\.dir|sweep\.subdir|verbose|mode|job\.chdir|launcher\.\S+|sweeper\.\S+)$")
_HYDRA_GROUPS = ("hydra/launcher", "hydra/sweeper", "hydra/job_logging", "hydra/hydra_logging")
_LOGGING_OPTIONS = ("default", "disabled", "none", "stdout", "hydra_debug")  # Hydra's own logging configs
# Hydra flags followed by a value.
_VALUE_FLAGS = ("-cn", "--config-name", "-p", "--package", "-c", "--cfg", "--info")
# Launcher and sweeper options that name code or shell commands (submitit's setup, Ray's runtime
# environment and hooks, Optuna's custom search space) or pick classes (`_target_`).
_CODE_OPTIONS = re.compile(r"_target_|\(\)|\bclass\b|setup|runtime_env|hook|callback|custom_search_space|\benv\b")
# Interpolations a run or sweep directory may use (`${now:...}`, `${hydra.job.num}`); no other
# override takes one: an interpolation can pull a `_target_` into a node Hydra instantiates.
_DIR_INTERPOLATION = re.compile(r"\$\{(now:[^}]*|hydra\.job\.[a-z_]+|hydra\.runtime\.choices\.[^}]*)\}")


@contextmanager
def reported() -> Iterator[None]:
    """Turn our errors (and Hydra's, OmegaConf's, YAML's and the OS's) into one line and exit 2."""
    try:
        yield
    except (PipelineError, yaml.YAMLError, OSError) as exc:
        if os.environ.get(DEBUG_ENV):
            raise
        fail(exc)
    except Exception as exc:
        if os.environ.get(DEBUG_ENV) or not isinstance(exc, _config_errors()):
            raise
        fail(exc)


def _config_errors() -> tuple[type[BaseException], ...]:
    """Hydra's and OmegaConf's error bases, of those loaded: only a loaded library raises its errors, and
    a stage that never composes (`names`, `toolchain`) starts without importing them."""
    bases = (("hydra.errors", "HydraException"), ("omegaconf.errors", "OmegaConfBaseException"))
    return tuple(getattr(sys.modules[m], name) for m, name in bases if m in sys.modules)


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
    """Refuse command-line arguments that would name code, change the environment or write outside
    the run directory, or read configs from outside `conf/`.

    Raises:
        ConfigError: naming the argument and what to do instead.
    """
    for i, arg in enumerate(args):
        flag = arg.split("=", 1)[0]
        if flag in _FOREIGN_FLAGS:
            raise ConfigError(f"{flag} is not supported: the pipeline composes only its own conf/ "
                              "(select options and experiments with overrides such as +experiment=NAME)")
        if flag in ("-cn", "--config-name"):
            name = arg.partition("=")[2] if "=" in arg else (args[i + 1] if i + 1 < len(args) else "")
            _check_option(arg, name)
        if arg.startswith("-"):
            continue
        key, _, value = arg.lstrip("+~").partition("=")
        if key.startswith("allowed_target_prefixes"):
            raise ConfigError("allowed_target_prefixes is not a config key: trusted modules come from "
                              "$PIPELINE_TRUSTED_MODULES, which configs and overrides cannot set")
        if "." not in key.partition("@")[0]:  # a config group's option (model=..., +experiment=...)
            _check_option(arg, value)
        if key.startswith("hydra"):
            _check_hydra(arg, key, value)
        elif "${" in value:
            raise ConfigError(f"override {arg!r} holds an interpolation; give the value itself (interpolations "
                              "come from conf/ only)")


def _check_option(arg: str, value: str) -> None:
    """A config option is named, never a path: `model=../../elsewhere/x` would compose a file from
    outside `conf/`."""
    for name in re.split(r"[,()\[\]\s]+", value):
        if name and (name.startswith(".") or "/" in name or "\\" in name):
            raise ConfigError(f"override {arg!r} names the config {name!r} by a path; options are the names of "
                              "files in conf/<group>/ (e.g. model=resnet18), and the pipeline composes only conf/")


def _check_hydra(arg: str, key: str, value: str) -> None:
    if key.startswith("hydra/"):
        if key not in _HYDRA_GROUPS:
            raise ConfigError(f"override {arg!r}: the command line chooses only {', '.join(_HYDRA_GROUPS)} among "
                              "Hydra's groups; the others stay as conf/ sets them")
        if key.endswith("_logging") and value not in _LOGGING_OPTIONS:
            raise ConfigError(f"override {arg!r}: logging configs are Hydra's own ({', '.join(_LOGGING_OPTIONS)})")
        return
    if not _HYDRA_KEYS.match(key):
        raise ConfigError(f"override {arg!r} would change Hydra's own settings (search path, job environment, job "
                          "name, output subdir, callbacks, logging), which conf/ fixes; the command line sets only "
                          "hydra.run.dir, hydra.sweep.dir/subdir, hydra.verbose, hydra.job.chdir and hydra.launcher.* "
                          "or hydra.sweeper.* options")
    if _CODE_OPTIONS.search(key) or re.search(r"_target_|\(\)|\bclass\b", value):
        raise ConfigError(f"override {arg!r} would make Hydra run code named on the command line; "
                          "configure callbacks, launchers and logging in conf/ instead")
    if "${" in _DIR_INTERPOLATION.sub("", value):
        raise ConfigError(f"override {arg!r} holds an interpolation; Hydra settings from the command line take "
                          "plain values (run and sweep directories also ${now:...} and ${hydra.job.*})")


def job_overrides(args: Sequence[str]) -> list[list[str]] | None:
    """The pipeline overrides (Hydra's own left out) of jobs that together take every value of every
    enumerable sweep (`a,b`, `range(...)`, `choice(...)`; other sweeps keep their defaults), so that
    a multirun's values are checked before any job runs; None when another primary config is named.
    """
    from hydra.core.override_parser.overrides_parser import OverridesParser

    plain, skip = [], False
    for arg in args:
        if arg in ("-cn", "--config-name") or arg.startswith("--config-name="):
            return None
        if not skip and not arg.startswith("-") and not arg.lstrip("+~").startswith("hydra"):
            plain.append(arg)
        skip = arg in _VALUE_FLAGS
    parsed = OverridesParser.create().parse_overrides(plain)
    fixed = [str(o.input_line) for o in parsed if not o.is_sweep_override()]
    sweeps = [o for o in parsed if o.is_sweep_override() and o.is_discrete_sweep()
              and getattr(o.value_type, "name", "") != "GLOB_CHOICE_SWEEP"]
    choices = [[f"{str(o.input_line).split('=', 1)[0]}={v}" for v in o.sweep_string_iterator()] for o in sweeps]
    first = [c[0] for c in choices if c]
    jobs = [fixed + first]
    for i, values in enumerate(choices):
        jobs += [fixed + first[:i] + [v] + first[i + 1:] for v in values[1:]]
    return jobs
