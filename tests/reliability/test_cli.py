"""Bad values fail before work starts, in one line: compose and `python -m pipeline` validate every
value before writing params.yaml or building anything; malformed YAML names file, line and column;
a failed write names its path; `PIPELINE_DEBUG=1` shows the traceback."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.cli import check_yaml
from pipeline.config.compose import CONF_DIR, compose
from pipeline.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]


def _run(module: str, *args: str, cwd: Path = ROOT, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", module, *args], cwd=cwd, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT), **env})


BAD_VALUES = [
    ("compile.precision=fp64", "compile: precision='fp64' is not supported; use one of ['fp32', 'fp16', 'bf16']"),
    ("compile.optimization_level=9", "compile: optimization_level=9 is outside 0..5"),
    ("compile.min_block_size=0", "compile: min_block_size=0 must be an integer >= 1"),
    ("model.methods.forward.inputs.0.dtype=float64", "model.methods.forward.inputs[0].dtype = 'float64' is not supported"),
    ("model.methods.forward.dims.batch.max=2", "model.methods.forward.inputs[0].shape[0] = 4 lies outside its dim 'batch' range 1..2"),
    ("model.name=../../etc", "model.name = '../../etc' is not a plain file name"),
    ("+serialize.output_name=/tmp/x", "serialize.output_name = '/tmp/x' is not a plain file name"),
]


@pytest.mark.parametrize("override, message", BAD_VALUES)
def test_bad_values_fail_composition(override: str, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        compose([override])
    assert message in str(caught.value) and "\n" not in str(caught.value)


@pytest.mark.parametrize("override, message", BAD_VALUES[::3])
def test_compose_refuses_bad_values_in_one_line(tmp_path: Path, override: str, message: str) -> None:
    result = _run("pipeline.config.compose", override, cwd=tmp_path)
    assert result.returncode == 2 and not (tmp_path / "params.yaml").exists()
    assert result.stderr.count("\n") == 1 and message in result.stderr, result.stderr
    assert "Traceback" not in result.stderr and "PIPELINE_DEBUG=1" in result.stderr


@pytest.mark.parametrize("override", ["compile.precision=fp64", "compile.optimization_level=9"])
def test_app_refuses_before_any_work(tmp_path: Path, override: str) -> None:
    result = _run("pipeline", override, f"hydra.run.dir={tmp_path}/run")
    assert result.returncode == 2 and result.stderr.count("\n") == 1 and "compile:" in result.stderr
    assert not (tmp_path / "run").exists()


def test_malformed_yaml_names_file_line_and_column(tmp_path: Path) -> None:
    conf = tmp_path / "conf"
    shutil.copytree(CONF_DIR, conf)
    (conf / "compile" / "default.yaml").write_text("defaults:\n  - compile_schema\nprecision: [fp32\n")
    with pytest.raises(ConfigError, match=r"compile/default.yaml:4:1: malformed YAML"):
        check_yaml(conf)
    with pytest.raises(ConfigError, match=r"compile/default.yaml:4:1: malformed YAML"):
        compose([], conf_dir=conf)


def test_debug_switch_shows_the_traceback(tmp_path: Path) -> None:
    loud = _run("pipeline.config.compose", "compile.precision=fp64", cwd=tmp_path, PIPELINE_DEBUG="1")
    assert loud.returncode != 0 and "Traceback" in loud.stderr and "ConfigError" in loud.stderr
