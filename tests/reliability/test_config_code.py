"""Configs name code only in the slots that take code, only of the kind each slot expects, and only
from trusted modules that no override or composed config can widen."""

import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

from pipeline.cli import check_arguments
from pipeline.config import objects
from pipeline.config.compose import compose, read_params, typed, write_params
from pipeline.config.schema import MethodSpec
from pipeline.config.targets import ENV
from pipeline.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
XNNPACK = "executorch.backends.xnnpack.partition.xnnpack_partitioner.XnnpackPartitioner"


def _chain(target: str) -> str:
    return f"partitioners.chain=[{{name: tensorrt}}, {{name: x, _target_: {target}}}]"


@pytest.mark.parametrize("args", [
    ["allowed_target_prefixes=[pipeline.,os.]"],
    ["++allowed_target_prefixes=[os.]"],
    ["+hydra.callbacks.x._target_=os.getpid"],
    ["hydra.callbacks=null"],
    ["hydra.launcher._target_=os.system"],
    ["+hydra.job_logging.handlers.x.class=os.system"],
    ["--config-dir=/tmp"],
    ["-cd", "/tmp"],
    ["--experimental-rerun", "/tmp/config.pickle"],
    ["+hydra.job.env_set.PIPELINE_TRUSTED_MODULES=subprocess"],
    ["hydra.job.env_copy=[HOME]"],
    ["+hydra.sweeper.evil=${x}", "+x={_target_: pipeline.files.write_json}"],
    ["hydra.launcher.n_jobs=${oc.env:N}"],
    ["hydra.searchpath=[file:///elsewhere]"],
    ["hydra/job_logging=evil"],
    ["hydra/hydra_logging=../../elsewhere"],
    ["hydra/help=mine"],
    ["hydra.job.name=../../x"],
    ["hydra.output_subdir=/elsewhere"],
    ["hydra.run.dir=${oc.env:HOME}"],
    ["hydra.launcher.setup=[touch MARK]"],
    ["+hydra.launcher.ray.init.runtime_env.worker_process_setup_hook=os.system"],
    ["hydra.sweeper.custom_search_space=os.system"],
    ["hydra.sweeper.sampler._target_=os.system"],
    ["model.name=${oc.env:HOME}"],
    ["+model.kwargs.x=${model._target_}"],
    ["+experiment=../../../tmp/evil"],
    ["model=mlp,../x"],
    ["+model@targets.r.model=/tmp/x"],
    ["--config-name=../../tmp/evil"],
    ["-cn", "../evil"],
])
def test_arguments_that_name_code_are_refused(args: list[str]) -> None:
    with pytest.raises(ConfigError):
        check_arguments(args)


@pytest.mark.parametrize("args", [
    ["hydra.run.dir=/tmp/x"], ["hydra.sweep.dir=multirun/${now:%Y-%m-%d}"], ["hydra.sweep.subdir=${hydra.job.num}"],
    ["hydra/launcher=joblib", "hydra.launcher.n_jobs=2"], ["hydra.sweeper.n_trials=3"], ["~hydra.sweeper.params.partitioners"],
    ["hydra.launcher.ray.init.address=auto"], ["hydra/job_logging=disabled"], ["hydra.verbose=true"],
    ["-m", "compile.precision=fp32,fp16"], ["--cfg", "job"],
])
def test_what_a_sweep_needs_stays_allowed(args: list[str]) -> None:
    check_arguments(args)


def test_a_multirun_cannot_widen_the_trusted_modules(tmp_path: Path) -> None:
    """The job's environment is Hydra's to set only as conf/ says: an override that sets the trusted
    modules for the jobs, then names a command as the model, runs nothing."""
    marker = tmp_path / "MARK"
    result = subprocess.run(
        [sys.executable, "-m", "pipeline", "-m", "+hydra.job.env_set.PIPELINE_TRUSTED_MODULES=subprocess",
         "model._target_=subprocess.getoutput", f"+model.kwargs.cmd='touch {marker}'", f"hydra.sweep.dir={tmp_path}/sw"],
        cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and not marker.exists() and not (tmp_path / "sw").exists()
    assert result.stderr.strip().count("\n") == 0 and "hydra.job.env_set" in result.stderr


@pytest.mark.parametrize("kwargs, message", [
    ({"checkpoint_path": "/tmp/weights.pth"}, "sets checkpoint_path='/tmp/weights.pth', which loads weights"),
    ({"pretrained_cfg_overlay": {"file": "/tmp/w.safetensors"}}, "asks timm for pretrained weights"),
    ({"pretrained_cfg": {"url": "https://example.com/w.pth"}}, "sets pretrained_cfg"),
    ({"cache_dir": "/tmp/hub"}, "sets cache_dir"),
    ({"drop_rate": 0.0, "extra": {"path": "weights.bin"}}, r"names a file or URL in extra \('weights.bin'\)"),
    ({"extra": ["https://example.com/x"]}, "names a file or URL in extra"),
])
def test_model_kwargs_never_load_files_or_reach_the_network(kwargs: dict[str, object], message: str) -> None:
    import timm

    from pipeline.config.objects import check_no_download

    with pytest.raises(ConfigError, match=message):
        check_no_download(timm.create_model, {"model_name": "lcnet_050", **kwargs})


def test_a_timm_checkpoint_override_is_refused_at_composition() -> None:
    with pytest.raises(ConfigError, match="sets checkpoint_path"):
        compose(["model._target_=timm.create_model", "+model.kwargs.model_name=lcnet_050",
                 "+model.kwargs.checkpoint_path=/etc/passwd", "model.methods.forward.inputs=[{shape: [2, 3, 64, 64]}]"])


def test_allowlist_override_never_runs_code(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    result = subprocess.run(
        [sys.executable, "-m", "pipeline", "allowed_target_prefixes=[pipeline.,os.]",
         _chain("os.system"), f"+partitioners.chain.1.kwargs.command='touch {marker}'", f"hydra.run.dir={tmp_path}/run"],
        cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and not marker.exists() and not (tmp_path / "run").exists()
    assert result.stderr.strip().splitlines() == [result.stderr.strip()] and "allowed_target_prefixes" in result.stderr


def test_composed_params_cannot_widen_the_trusted_modules(tmp_path: Path) -> None:
    cfg = OmegaConf.to_container(compose([]), resolve=True)
    cfg["allowed_target_prefixes"] = ["pipeline.", "os."]  # a hand-edited params.yaml
    cfg["partitioners"]["chain"].append({"name": "x", "_target_": "os.system", "kwargs": {}, "methods": None})
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(cfg))
    with pytest.raises(ConfigError, match=r"'os.system' is outside the trusted modules"):
        read_params(tmp_path / "params.yaml")


@pytest.mark.parametrize("override, message", [
    (_chain("pipeline.files.write_json"), r"partitioners.chain\[1\]._target_ = 'pipeline.files.write_json' is a function, but this slot takes an ExecuTorch Partitioner class"),
    (_chain("pipeline.steps.run_all"), "is a function, but this slot takes an ExecuTorch Partitioner"),
    ("++transforms.passes={forward: [{_target_: pipeline.models.mlp.MLP}]}", "is a class MLP, but this slot takes a graph pass class"),
    ("++transforms.passes={forward: [{_target_: " + XNNPACK + "}]}", "this slot takes a graph pass class"),
    ("model._target_=pipeline.steps.serialize.manifest", "is a function, but this slot takes an nn.Module class, a model factory"),
    ("model._target_=pipeline.lowering.transforms.RemoveDeadCode", "this slot takes an nn.Module class"),
    ("model._target_=os.system", "outside the trusted modules"),
    ("+model.kwargs.inner={_target_: pipeline.files.write_json}", "only model, partitioners and transforms entries name code"),
    ("+model.kwargs.bogus=1", r"model._target_ = 'mlp' does not take the kwargs \['bogus', 'seed'\]"),
    ("++transforms.passes={forward: [{_target_: pipeline.lowering.transforms.RemoveDeadCode, kwargs: {x: 1}}]}", "does not take the kwargs"),
])
def test_each_slot_takes_only_its_kind(override: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        compose([override])


def test_trusted_modules_come_from_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "mymodels.py").write_text("import torch\nclass Tiny(torch.nn.Linear):\n"
                                          "    def __init__(self):\n        super().__init__(64, 3)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError, match="outside the trusted modules"):
        compose(["model._target_=mymodels.Tiny"])
    monkeypatch.setenv(ENV, "mymodels")
    cfg = typed(compose(["model._target_=mymodels.Tiny"]))
    assert objects.model(cfg).out_features == 3


def test_torchvision_builders_take_a_seed_and_never_download() -> None:
    cfg = typed(compose(["model._target_=torchvision.models.resnet18", "+model.kwargs.num_classes=7"]))
    first, second = objects.model(cfg), objects.model(cfg)
    assert first.fc.out_features == 7 and bool((first.fc.weight == second.fc.weight).all())
    cfg.model.kwargs["weights"] = "DEFAULT"
    with pytest.raises(ConfigError, match="nothing is read or downloaded"):
        objects.model(cfg)


def test_plain_factories_timm_and_the_users_own(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = typed(compose(["model._target_=timm.create_model", "+model.kwargs.model_name=lcnet_050",
                                          "+model.kwargs.num_classes=5", "model.methods.forward.inputs=[{shape: [2, 3, 64, 64]}]"]))
    first, second = objects.model(cfg), objects.model(cfg)  # seeded by the pipeline: the same weights twice
    assert all(bool((a == b).all()) for a, b in zip(first.state_dict().values(), second.state_dict().values()))
    cfg.model.kwargs["pretrained"] = True
    with pytest.raises(ConfigError, match="pretrained weights; builds use seeded random weights"):
        objects.model(cfg)
    (tmp_path / "userzoo.py").write_text("import torch\ndef make(width):\n    return torch.nn.Linear(64, width)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError, match="outside the trusted modules"):
        compose(["model._target_=userzoo.make", "+model.kwargs.width=3"])
    monkeypatch.setenv(ENV, "userzoo")
    cfg = typed(compose(["model._target_=userzoo.make", "+model.kwargs.width=3"]))
    assert objects.model(cfg).out_features == 3


@pytest.mark.parametrize("function", ["load_state_dict", "_apply", "__reduce__", "state_dict", "nothing_here"])
def test_method_functions_are_the_models_own_public_methods(function: str) -> None:
    cfg = typed(compose(["model=tiny_decoder"]))
    with pytest.raises(ConfigError, match="is not a public method of TinyDecoder"):
        objects.method_module(objects.model(cfg), MethodSpec(function=function))


def test_write_params_is_not_reached_by_a_bad_config(tmp_path: Path) -> None:
    write_params(compose([]), tmp_path / "params.yaml")
    before = (tmp_path / "params.yaml").read_bytes()
    result = subprocess.run([sys.executable, "-m", "pipeline.config.compose", _chain("pipeline.files.write_json")],
                            cwd=tmp_path, capture_output=True, text=True, env=_env())
    assert result.returncode == 2 and (tmp_path / "params.yaml").read_bytes() == before
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("error: partitioners.chain[1]._target_")


def _env() -> dict[str, str]:
    import os

    return {**os.environ, "PYTHONPATH": str(ROOT)}
