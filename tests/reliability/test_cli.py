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
    ("runtime.max_rel_error=nan", "runtime.max_rel_error = nan must be a positive, finite relative error"),
    ("runtime.max_rel_error=-1", "runtime.max_rel_error = -1.0 must be a positive, finite relative error"),
    ("runtime.max_rel_error=0", "runtime.max_rel_error = 0.0 must be a positive"),
    ("runtime.kernels=fast", "runtime.kernels = 'fast' is not a kernel specialization strategy; use one of ['lazy', "
                             "'eager', 'none']"),
    ("compile.torch_executed_ops=[aten.cumsumm]", "'aten.cumsumm' is not an ATen op; did you mean 'aten.cumsum'?"),
    ("compile.torch_executed_ops=[aten.cumsum.bogus]", "aten.cumsum has no overload 'bogus'"),
    ("+model._partial_=true", "model._partial_ is a Hydra instantiate key, which the pipeline does not use"),
    ("+model._args_=[1]", "model._args_ is a Hydra instantiate key"),
    ("+model.kwargs._convert_=all", "model.kwargs._convert_ is a Hydra instantiate key"),
    ("cache.max_gb=nan", "cache.max_gb = nan must be a positive, finite number of GB"),
    ("cache.max_gb=inf", "cache.max_gb = inf must be a positive, finite number of GB"),
    ("cache.max_gb=1e400", "cache.max_gb = inf must be a positive, finite number of GB"),
    ("cache.max_gb=-2", "cache.max_gb = -2.0 must be a positive"),
    ("model.methods.forward.inputs.0.shape=[1,64]", "shape[0] = 1 on dynamic dim 'batch': torch.export makes a dim of "
                                                    "example size 1 static"),
    ("model.methods.forward.inputs.0.shape=[4,0]", "shape = [4, 0] has a size below 1"),
    ("model.seed=100000000000000000000", "model.seed = 100000000000000000000 must be an integer in 0..2**63-1"),
    ("model.seed=-1", "model.seed = -1 must be an integer in 0..2**63-1"),
    ("runtime.validation_seed=-3", "runtime.validation_seed = -3 must be an integer in 0..2**63-1"),
    ("model.methods.forward.inputs.0.shape=[100000,100000]", "has 10000000000 elements, more than an example input may"),
    ("model.methods.forward.dims.batch.max=100000000000", "needs 0 <= min <= max < 2**31"),
    ("+model.methods.forward.dims.rows={max:8}", "model.methods.forward.dims.rows = {'max': 8} is not a dim; give its "
                                                 "range as {min: 1, max: 16}"),
    ("model.methods.forward.inputs=[{shape: [4, 64], dtype: int32, high: 3000000000}]", "needs low < high, both in int32's"),
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


@pytest.mark.parametrize("override, message", [("compile.precision=fp64", "compile:"),
                                               ("compile.optimization_level=9", "compile:"),
                                               ("compile.optimization_level=abc", "could not be converted to Integer"),
                                               ("model.seed=[1,2]", "Error merging override model.seed=[1,2]"),
                                               ("runtime.max_rel_error=nan", "runtime.max_rel_error")])
def test_app_refuses_before_any_work(tmp_path: Path, override: str, message: str) -> None:
    result = _run("pipeline", override, f"hydra.run.dir={tmp_path}/run")
    assert result.returncode == 2 and result.stderr.count("\n") == 1 and message in result.stderr, result.stderr
    assert not (tmp_path / "run").exists()


def test_a_sweep_refuses_a_bad_value_before_any_job_runs(tmp_path: Path) -> None:
    result = _run("pipeline", "-m", "compile.precision=fp32,fp64", "model=mlp,resnet18", f"hydra.sweep.dir={tmp_path}/sw")
    assert result.returncode == 2 and result.stderr.count("\n") == 1 and "precision='fp64'" in result.stderr
    assert not (tmp_path / "sw").exists()


def test_params_yaml_values_are_checked_again_by_every_stage(tmp_path: Path) -> None:
    from pipeline.config.compose import read_params, write_params

    write_params(compose([]), tmp_path / "params.yaml")
    text = (tmp_path / "params.yaml").read_text().replace("max_gb: 20.0", "max_gb: .nan")
    (tmp_path / "params.yaml").write_text(text)
    with pytest.raises(ConfigError, match="cache.max_gb = nan"):
        read_params(tmp_path / "params.yaml")


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
