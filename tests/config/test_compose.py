"""Config composition: every group option and experiment composes and instantiates; bad configs
fail before any build with a clear message; params.yaml is the composition of the defaults."""


from pathlib import Path

import pytest
import yaml
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf

from pipeline.config import objects
from pipeline.config.compose import CONF_DIR, check_experiment, compose, main, target_config, typed, write_params
from pipeline.errors import ConfigError

GROUPS = {g: sorted(p.stem for p in (CONF_DIR / g).glob("*.yaml")) for g in
          ("model", "compile", "partitioners", "transforms", "serialize", "cache", "matrix")}


@pytest.mark.parametrize("group, option", [(g, o) for g, opts in GROUPS.items() for o in opts])
def test_every_option_composes_and_instantiates(group: str, option: str) -> None:
    cfg = typed(compose([f"{group}={option}"]))
    if group == "model" and (option.startswith("hf_") or option in ("whisper", "parakeet", "parakeet_transducer",
                                                                   "image_text_decoder", "audio_text_decoder")):
        # from the user's folder (tests/models/test_checkpoints.py, test_transformers_folders.py, test_parakeet.py,
        # test_multimodal.py)
        with pytest.raises(ConfigError, match=r"builds from a Hugging Face model folder \(model.weights=<folder>\)"):
            objects.model(cfg)
        return
    for method, spec in cfg.model.methods.items():
        assert objects.compile_spec(cfg, method).method == method
        objects.partitioners(cfg, method)
        objects.transform_passes(cfg, method)
        assert len(objects.example_inputs(spec, 0)) == len(spec.inputs)
    if group == "model":
        assert objects.model(cfg) is not None


@pytest.mark.parametrize("experiment", sorted(p.stem for p in (CONF_DIR / "experiment").glob("*.yaml")))
def test_every_experiment_composes(experiment: str) -> None:
    cfg = compose([f"+experiment={experiment}"])
    assert cfg.model.name and cfg.partitioners.chain[0].name == "tensorrt"


def test_every_matrix_target_is_a_whole_config() -> None:
    cfg = typed(compose(["matrix=zoo", "compile.precision=bf16"]))
    assert sorted(cfg.targets) == ["mlp_fp16", "mobilenet_v3_small_fp16", "resnet18_fp16", "tiny_decoder_fp16"]
    for name in cfg.targets:
        target = target_config(cfg, name)
        assert target.compile.precision == "fp16" and target.targets == {}
        assert target.partitioners == cfg.partitioners and f"{target.model.name}_fp16" == name
        for method in target.model.methods:
            assert objects.compile_spec(target, method).precision == "fp16"
    with pytest.raises(ConfigError, match="no build target 'nope'"):
        target_config(cfg, "nope")


@pytest.mark.parametrize("overrides, message", [
    (["matrix=zoo", "targets.resnet18_fp16.compile.optimization_level=9"], "build target 'resnet18_fp16': .*optimization_level=9"),
    (["+model@targets._a.model=mlp", "+compile@targets._a.compile=fp16"], "targets._a is not a plain name"),
])
def test_bad_targets_fail_at_composition(overrides: list[str], message: str) -> None:
    with pytest.raises((ConfigError, ConfigCompositionException), match=message):
        compose(overrides)


def test_a_dynamic_dim_is_added_or_removed_in_one_line() -> None:
    cfg = compose(["model=resnet18", "+model.methods.forward.dims.batch={min:1,max:16}",
                   "+model.methods.forward.dynamic={0:{0:batch}}", "model.methods.forward.inputs.0.shape=[2,3,224,224]"])
    assert OmegaConf.to_container(cfg.model.methods.forward.dims) == {"batch": {"min": 1, "max": 16}}
    plain = typed(compose(["model.methods.forward.dynamic=null"]))
    assert objects.dynamic_shapes(plain.model.methods["forward"]) is None  # the mlp, every dim static


def test_shared_dims_are_one_dim() -> None:
    cfg = typed(compose(["model=tiny_decoder"]))
    (shapes,) = objects.dynamic_shapes(cfg.model.methods["decode"])
    assert shapes[2][3] is shapes[3][3]


def test_committed_params_equal_default_composition() -> None:
    committed = yaml.safe_load((CONF_DIR.parent / "params.yaml").read_text())
    assert committed == OmegaConf.to_container(compose([]), resolve=True), "run `python -m pipeline.config.compose`"


@pytest.mark.parametrize("overrides, error, message", [
    (["compile.precison=fp16"], ConfigCompositionException, "precison"),
    (["compile.optimization_level=high"], ConfigCompositionException, "optimization_level=high"),
    (["partitioners.chain=[{name: xnnpack, _target_: executorch.backends.xnnpack.partition.xnnpack_partitioner.XnnpackPartitioner}, {name: tensorrt}]"],
     ConfigError, "must start with `- name: tensorrt`"),
    (["+compile.per_method={decode: {precision: fp16}}"], ConfigError, r"unknown method\(s\) \['decode'\]"),
    (["transforms=dead_code", "++transforms.passes={prefill: [{_target_: pipeline.lowering.transforms.RemoveDeadCode}]}"],
     ConfigError, r"unknown method\(s\) \['prefill'\]"),
    (["++transforms.passes={forward: [{_target_: os.system}]}"], ConfigError, "'os.system' is outside the trusted modules"),
    (["model.init=zeros"], ConfigError, r"model.init = 'zeros' is not one of \['factory', 'every_layer'\]"),
])
def test_bad_configs_fail_at_composition(overrides: list[str], error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        compose(overrides)


def test_bad_compile_values_fail_at_composition() -> None:
    with pytest.raises(ConfigError, match="compile: precision='int4' is not supported"):
        compose(["compile.precision=int4"])


def test_experiments_keep_composed_overrides(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    main(["compile.precision=fp16"])
    write_params(compose(["compile.precision=fp16", "compile.optimization_level=2"]))  # what `-S` both gave
    check_experiment()
    write_params(compose(["compile.optimization_level=2"]))  # what `dvc exp run -S` alone composes
    with pytest.raises(ConfigError, match=r"dropping what .* set \(compile.precision\); run `dvc exp run -S 'compile.precision=fp16'"):
        check_experiment()
    main([])
    check_experiment()  # composed defaults: nothing to keep


def _refused(args: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err, err
    return err


def test_compose_refuses_files_a_build_could_not_read_and_writes_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """What `python -m pipeline` refuses before it runs, compose refuses before it writes params.yaml
    (the same line): a missing weight file, a folder that is no model folder, a pipe, a missing
    calibration file; a build target's weights too."""
    import os

    monkeypatch.chdir(tmp_path)
    (tmp_path / "folder").mkdir()
    os.mkfifo(tmp_path / "pipe.safetensors")
    (tmp_path / "calibration.pt").mkdir()
    for args, words in [
        (["model.weights=missing.safetensors"], "model.weights = 'missing.safetensors' does not exist"),
        (["model.weights=folder"], "model.weights = 'folder' is a folder without config.json"),
        (["model.weights=pipe.safetensors"], "is not a regular file (a pipe, socket or device)"),
        (["compile.quantize.mode=fp8", "compile.quantize.calibration=none.pt"],
         "compile.quantize.calibration = 'none.pt' does not exist"),
        (["compile.quantize.mode=fp8", "compile.quantize.calibration=calibration.pt"],
         "compile.quantize.calibration = 'calibration.pt' is not a regular file"),
        (["+model@targets.t.model=mlp", "+compile@targets.t.compile=fp16", "targets.t.model.weights=gone.pt"],
         "model.weights = 'gone.pt' does not exist"),
    ]:
        assert words in _refused(args, capsys)
        assert not (tmp_path / "params.yaml").exists()


def test_a_config_option_that_does_not_exist_is_one_line_naming_those_that_do(capsys: pytest.CaptureFixture[str]) -> None:
    err = _refused(["model=resnet_18"], capsys)
    assert "model=resnet_18: conf/model/ has no resnet_18.yaml; use one of " in err
    assert "resnet18" in err and "schema" not in err and "search path" not in err.lower()


def test_an_experiment_checks_the_params_it_runs_not_an_earlier_compose(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An earlier compose's overrides are composed only (never validated or imported: a model whose
    module was trusted then need not be now), and the params.yaml the experiment runs is validated."""
    monkeypatch.chdir(tmp_path)
    write_params(compose([]))
    (tmp_path / "build").mkdir()
    (tmp_path / "build" / "composed.json").write_text('{"overrides": ["compile.precision=int4"]}')
    with pytest.raises(ConfigError, match=r"dropping what .* set \(compile.precision\)"):
        check_experiment()
    write_params(compose(["compile.precision=int4"], checked=False))  # what `dvc exp run -S` composed unchecked
    with pytest.raises(ConfigError, match="compile: precision='int4' is not supported"):
        check_experiment()
