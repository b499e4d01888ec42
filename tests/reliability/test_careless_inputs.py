"""What a careless or hostile user gives gets one clear line or a correct result, and no file of
theirs is lost (issue 56): a timing cache path that holds another file, a misspelled key added with
`+`, a config group option from outside `conf/` (through `dvc exp run`'s own composition), a prefix
map whose keys collide, fp8 calibration samples that are not finite, out of range or of another
shape, pipes and archives where a file is read, prompts that are not UTF-8."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from pipeline.config.compose import CONF_DIR, check_files, compose
from pipeline.engine import cache_files
from pipeline.engine.compile_spec import TensorRTCompileSpec
from pipeline.errors import CompileSpecError, ConfigError, InputError
from pipeline.files import read_regular
from pipeline.lowering.compile import compile_method
from pipeline.models.checkpoint import rename

ROOT = Path(__file__).resolve().parents[2]


def _pipeline(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pipeline", *args], cwd=cwd, capture_output=True, text=True, timeout=600)


def test_a_timing_cache_path_that_holds_another_file_is_refused_and_kept(tmp_path: Path) -> None:
    mine = tmp_path / "thesis.tex"
    mine.write_text("mine")
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "link").symlink_to(tmp_path / "nowhere")
    for path, words in ((mine, "holds a file that is not the cache the build writes there"),
                        (tmp_path / "fifo", "is not a regular file"), (tmp_path / "link", "is a symbolic link")):
        with pytest.raises(CompileSpecError, match=words):
            check_files(compose(["model=mlp", f"compile.timing_cache_path={path}"]))
    with pytest.raises(CompileSpecError, match="not the cache the build writes there"):  # a method's own too
        check_files(compose(["model=mlp", f"+compile.per_method.forward.timing_cache_path={mine}"]))
    done = _pipeline("model=mlp", f"compile.timing_cache_path={mine}", f"hydra.run.dir={tmp_path / 'run'}")
    assert done.returncode == 2 and "holds a file that is not the cache" in done.stderr and mine.read_text() == "mine"
    # TensorRT's own cache at a new path, then reused: only it is ever replaced.
    cache = tmp_path / "timing.cache"
    for run in ("a", "b"):
        done = _pipeline("model=mlp", f"compile.timing_cache_path={cache}", "cache.enabled=false",
                         f"hydra.run.dir={tmp_path / run}")
        assert done.returncode == 0, done.stderr
        assert cache_files.check(cache).startswith(cache_files.MAGIC)
    with pytest.raises(CompileSpecError, match="not the cache"):  # claimed again right before the write
        mine.write_text("mine")
        cache_files.write(mine, b"ptrt...")
    assert mine.read_text() == "mine"


@pytest.mark.parametrize("override, words", [
    ("+compile.precison=fp16", "compile.precison is not an option of compile: did you mean compile.precision?"),
    ("+model.methods.forward.inputs.0.dtyp=float16", "did you mean model.methods.forward.inputs[0].dtype?"),
    ("+serialize.external=true", "serialize.external is not an option of serialize"),
    ("+runtime.executer=executorch", "did you mean runtime.executor?"),
])
def test_a_key_added_with_plus_must_be_known(override: str, words: str) -> None:
    with pytest.raises(ConfigError, match=words.replace("[", r"\[").replace("]", r"\]").replace("?", r"\?")):
        compose(["model=mlp", override])


@pytest.mark.parametrize("option", ["../../../x", "../config", "../model/../../x"])
def test_dvc_exp_runs_own_composition_takes_group_options_only_from_conf(tmp_path: Path, option: str) -> None:
    """`dvc exp run -S model=../../../x` composes with DVC's Hydra (the pipeline's argument check never
    runs there): the project's Hydra plugin keeps every config file inside its group's folder."""
    from dvc.utils.hydra import compose_and_dump
    from hydra.errors import MissingConfigException

    outside = tmp_path / "x.yaml"
    outside.write_text((CONF_DIR / "model" / "mlp.yaml").read_text())
    params = tmp_path / "params.yaml"
    name = os.path.relpath(outside.with_suffix(""), CONF_DIR / "model") if option == "../../../x" else option
    with pytest.raises(MissingConfigException, match="Could not find"):
        compose_and_dump(str(params), str(CONF_DIR), None, "config", str(ROOT), [f"model={name}"])
    assert not params.exists()
    compose_and_dump(str(params), str(CONF_DIR), None, "config", str(ROOT), ["model=resnet18"])
    assert "name: resnet18" in params.read_text()


def test_a_prefix_map_whose_keys_collide_is_refused() -> None:
    state = {"module.fc.weight": torch.zeros(1), "fc.weight": torch.ones(1)}
    with pytest.raises(ConfigError, match=r"maps the file's keys 'module.fc.weight' and 'fc.weight' both to 'fc.weight'"):
        rename(state, {"module.": ""})
    assert set(rename(state, {"module.": "inner."})) == {"inner.fc.weight", "fc.weight"}


def _calibrated(path: Path, samples: object) -> None:
    torch.save(samples, path)
    torch.manual_seed(0)
    compile_method(torch.nn.Linear(16, 8).eval(), [torch.randn(4, 16)],
                   TensorRTCompileSpec(precision="fp16", quantize={"mode": "fp8", "calibration": str(path)}))


@pytest.mark.parametrize("sample, words", [
    (torch.full((4, 16), float("nan")), "sample 0 input 0 holds NaN, inf or a magnitude beyond 65504"),
    (torch.ones(4, 16).index_fill(1, torch.tensor([3]), float("inf")), "holds NaN, inf or a magnitude beyond"),
    (torch.full((4, 16), 1e30), "holds NaN, inf or a magnitude beyond"),
    (torch.randn(4, 32), r"sample 0 input 0 has shape \[4, 32\]; method 'forward' takes \[4, 16\]"),
    (torch.randn(16), r"has shape \[16\]"),
    (torch.randn(4, 16, dtype=torch.float64), "sample 0 has inputs"),
])
def test_fp8_calibration_refuses_samples_a_model_never_takes(tmp_path: Path, sample: torch.Tensor, words: str) -> None:
    with pytest.raises(CompileSpecError, match=words) as info:
        _calibrated(tmp_path / "cal.pt", [torch.randn(4, 16), sample] if "sample 0" not in words else [sample])
    assert "\n" not in str(info.value)


def test_fp8_calibration_of_finite_samples_builds(tmp_path: Path) -> None:
    _calibrated(tmp_path / "cal.pt", [torch.randn(4, 16) * 3, torch.randn(4, 16)])
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(CompileSpecError, match="is not a regular file"):  # opened without waiting on the pipe
        compile_method(torch.nn.Linear(16, 8).eval(), [torch.randn(4, 16)],
                       TensorRTCompileSpec(precision="fp16", quantize={"mode": "fp8", "calibration": str(tmp_path / "fifo")}))


def test_pipes_and_archives_where_files_are_read_are_one_line(tmp_path: Path) -> None:
    from pipeline.models.hf_folder import folder_config
    from pipeline.runtime import speech, tokenizer

    folder = tmp_path / "folder"
    folder.mkdir()
    os.mkfifo(folder / "config.json")
    with pytest.raises(ConfigError, match="config.json = .* is not a regular file"):
        folder_config(str(folder), None, {})
    os.mkfifo(folder / "tokenizer.json")
    with pytest.raises(ConfigError, match="is not a regular file"):
        tokenizer.from_folder(folder)
    features = tmp_path / "features.npz"
    np.savez(features, x=np.zeros((1, 80, 10), dtype=np.float32))
    done = subprocess.run([sys.executable, "-m", "pipeline.runtime.speech", str(ROOT / "tests" / "data" / "legacy_tr01.pte"),
                           "--features", str(features)], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 2 and done.stderr.strip().splitlines()[-1].startswith(
        f"error: {features} is not a .npy array of float log-mel features"), done.stderr[-2000:]
    for bad, words in (("/dev/zero", "is not a regular file"), (str(tmp_path / "missing.npy"), "cannot be read")):
        with pytest.raises(InputError, match=words):
            read_regular(bad, "--features", speech.FEATURES_LIMIT, InputError)


def test_a_prompt_that_is_not_utf8_is_one_line(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    program = str(ROOT / "tests" / "data" / "legacy_tr01.pte").encode()
    done = subprocess.run([sys.executable.encode(), b"-m", b"pipeline.runtime.generate", program, b"--prompt",
                           b"\xff\xfe caf\xe9"], capture_output=True, env=env, timeout=300)
    assert done.returncode == 2, done.stderr
    assert done.stderr.decode().strip().splitlines()[-1].startswith("error: --prompt is not UTF-8 text"), done.stderr[-2000:]

