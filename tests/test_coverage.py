"""The coverage suite's command on its CI slice (real builds), its skip of unchanged models, a model
that fails without stopping the others, and the lowering report's reasons through the library."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from pipeline.coverage.run import entry_config, row_key, run_suite, suite_config
from pipeline.coverage.suite import DECODERS, FAST, TIMM, Entry, entries, select
from pipeline.engine.compile_spec import TensorRTCompileSpec
from pipeline.errors import ConfigError
from pipeline.lowering.compile import compile_method
from pipeline.lowering.export import export
from pipeline.lowering.serialize import save


def test_suite_has_every_family() -> None:
    suite = entries()
    sources = {e.source for e in suite}
    assert sources == {"torchvision", "torchvision-segmentation", "timm", "hf", "hf-decoder", "speech"}
    assert sum(e.source == "hf-decoder" for e in suite) >= 10
    assert {name: sorted(e.model["methods"]) for e in select(slice_="speech") for name in [e.name]} == {
        "speech/whisper_tiny": ["encoder", "text_decoder"], "speech/transducer_tiny": ["decoder_step", "encoder", "joint"]}
    assert sum(e.source == "timm" for e in suite) >= 40 and sum(e.source == "torchvision" for e in suite) >= 80
    assert {e.name for e in select(slice_="fast")} == set(FAST)
    with pytest.raises(ValueError, match="not in the suite"):
        select(["timm/no_such_net"])
    (held,) = select(["hf-decoder/bloom"])  # a causal-LM type outside the suite, at the suite's size
    assert "bloom" not in DECODERS and held.source == "hf-decoder" and held.model["kwargs"]["architecture"] == "bloom"
    with pytest.raises(ValueError, match="not in the suite"):
        select(["hf-decoder/no_such_type"])


def test_a_timm_architecture_outside_the_suite_lowers_whole_through_the_command(tmp_path: Path) -> None:
    """Held-out models run through the same command as the suite's; mobilenetv1_100 is in no list here."""
    assert "mobilenetv1_100" not in TIMM
    (held,) = select(["timm/mobilenetv1_100"])
    assert held.model["kwargs"] == {"model_name": "mobilenetv1_100"} and held.inputs[0]["shape"] == [1, 3, 224, 224]
    subprocess.run([sys.executable, "-m", "pipeline.coverage", "timm/mobilenetv1_100", "--out", str(tmp_path)],
                   capture_output=True, text=True, check=True)
    (row,) = json.loads((tmp_path / "coverage-fp32.json").read_text())["rows"]
    assert row["lowered_whole"] and row["engines"] == 1, row
    assert row["reference_unchecked"] == 0 and row["reference_error"] < 1e-3, row  # the network against eager, on the CPU


def test_fast_slice_lowers_whole_and_a_second_run_builds_nothing(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "pipeline.coverage", "--slice", "fast", "--out", str(tmp_path)]
    first = subprocess.run(command, capture_output=True, text=True, check=True)
    table = json.loads((tmp_path / "coverage-fp32.json").read_text())
    assert table["summary"] == {"models": len(FAST), "lowered_whole": len(FAST), "failed": 0, "lowered_whole_pct": 100.0}
    assert all(r["engines"] == 1 and r["pte_mb"] > 0 for r in table["rows"]), table["rows"]
    assert all(r["reference_unchecked"] == 0 and r["reference_error"] < 1e-3 for r in table["rows"]), table["rows"]
    markdown = (tmp_path / "coverage-fp32.md").read_text()
    assert "| model | precision | lowered whole |" in markdown and "timm/lcnet_050" in markdown
    again = subprocess.run(command, capture_output=True, text=True, check=True)
    assert f"0 model(s) to build, {len(FAST)} kept" in again.stderr + again.stdout, first.stderr[-2000:]


def test_overrides_apply_to_every_build_and_a_bad_one_is_one_line(tmp_path: Path) -> None:
    entry = select(["timm/lcnet_050"])[0]
    assert row_key(entry, "fp32") != row_key(entry, "fp32", ["compile.allow_tf32=false"])  # a row per configuration
    assert suite_config("fp32", ["compile.allow_tf32=false"]).compile.allow_tf32 is False
    run = subprocess.run([sys.executable, "-m", "pipeline.coverage", "timm/lcnet_050", "--set", "compile.allow_tf32=maybe",
                          "--out", str(tmp_path)], capture_output=True, text=True)
    assert run.returncode == 2 and run.stderr.startswith(
        "error: Error merging override compile.allow_tf32=maybe: Value 'maybe' is not a valid bool"), run.stderr
    assert not (tmp_path / "rows").exists()  # refused before anything was built


def test_model_overrides_apply_to_each_entrys_model() -> None:
    """Every suite model has its own model section: `model.` overrides go into each (a field the entry's
    kwargs lack included), not into the defaults' model; one without a value is one line."""
    (entry,) = select(["hf-decoder/roberta"])
    cfg = entry_config(entry, "fp32", ["model.kwargs.is_decoder=true", "+model.kwargs.max_cache_len=16"])
    assert cfg.model.kwargs["is_decoder"] is True and cfg.model.kwargs["max_cache_len"] == 16
    assert cfg.model.kwargs["architecture"] == "roberta"
    with pytest.raises(ConfigError, match="^--set model.kwargs: no value; write model.KEY=VALUE$"):
        suite_config("fp32", ["model.kwargs"])
    with pytest.raises(ConfigError, match="^--set model.kwarg.hidden_size=32: Key 'kwarg' not in 'ModelConfig'"):
        suite_config("fp32", ["model.kwarg.hidden_size=32"])  # refused before any build, not a failed row each


def test_a_failing_model_gets_a_row_and_the_others_go_on(tmp_path: Path) -> None:
    good = select(["timm/lcnet_050"])[0]
    broken = Entry("hf/broken", "hf", {**good.model, "name": "broken", "_target_": "pipeline.models.hf.encoder",
                                       "kwargs": {"architecture": "no-such-architecture"}})
    rows = run_suite([broken, good], "fp32", tmp_path, jobs=2)
    assert rows[1]["status"] == "ok" and rows[1]["lowered_whole"]
    assert rows[0]["status"].startswith("ConfigError: model.kwargs.architecture = 'no-such-architecture'")


class Split(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.c = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c(torch.relu(self.b(torch.relu(self.a(x)).cumsum(-1))))


def test_report_gives_the_compile_steps_reasons_and_min_block_size_works(tmp_path: Path) -> None:
    spec = TensorRTCompileSpec(min_block_size=3, torch_executed_ops=("aten.cumsum",))
    program = compile_method(Split(), (torch.randn(2, 8),), spec)
    report = export(program, compile_specs=spec).report["forward"]
    reasons = {item["op"]: item["reason"] for item in report["left_over"]}
    assert reasons["aten.cumsum.default"] == "kept out of TensorRT by compile spec torch_executed_ops (aten.cumsum.default)"
    assert "below min_block_size=3" in reasons["aten.addmm.default"] and "below min_block_size=3" in reasons["aten.relu.default"]
    assert report["num_engines"] == 1 and report["claimed_by_tensorrt"] == 3
    assert not any(r == "not part of any TensorRT engine" for r in reasons.values())
    files = save(program, tmp_path / "split.pte", compile_specs=spec)
    assert files["pte"].stat().st_size > 0
