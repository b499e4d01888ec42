"""Models that cannot become programs, as a newcomer writes them: kwargs the model cannot take, a
forward that raises, branches on tensor values or returns no tensor, inputs eager PyTorch refuses.
Each is one line naming the model, the method and the fix; outputs in a dict or with ints build."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from pipeline.config import objects
from pipeline.config.compose import compose, typed
from pipeline.errors import ConfigError, ExportError
from pipeline.lowering.compile import compile_method, export_method
from pipeline.lowering.serialize import save
from pipeline.runtime import load

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("overrides, message", [
    (["+model.kwargs.hidden=abc"], r"failed to build the model from model.kwargs \{'seed': 0, 'hidden': 'abc'\} \(TypeError"),
    (["+model.kwargs.hidden=0"], r"parameter 'inp.weight' has no elements \(shape \[0, 64\]\)"),
    (["model=resnet18", "+model.kwargs.num_classes=-1"], "negative dimension -1"),
    (["model=llama_tiny", "model.kwargs.num_attention_heads=3"], "failed to build the model"),
])
def test_kwargs_the_model_cannot_take_are_one_line(overrides: list[str], message: str) -> None:
    cfg = typed(compose(overrides))
    with pytest.raises(ConfigError, match=message) as caught:
        objects.model(cfg)  # type: ignore[arg-type]
    assert "\n" not in str(caught.value)


class Raises(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise ValueError("boom")


class Branches(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2 if x.sum() > 0 else x


class ReturnsNone(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> None:
        return None


class ReturnsInt(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> int:
        return 3


@pytest.mark.parametrize("model, message", [
    (Raises(), r"cannot trace the model with its example inputs \(ValueError: boom at .*test_models.py:\d+ in forward; "
               "check the model"),
    (Branches(), r"at .*test_models.py:\d+ in forward; the model branches on tensor values there, which a program "
                 "cannot: use torch.cond"),
    (ReturnsNone(), "the model's method returns None, no tensor"),
    (ReturnsInt(), "the model's method returns int, no tensor"),
])
def test_models_that_cannot_be_exported_are_one_line(model: torch.nn.Module, message: str) -> None:
    with pytest.raises(ExportError, match=message) as caught:
        export_method(model, (torch.randn(2, 4),))
    assert "\n" not in str(caught.value)


class Mixed(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> dict[str, object]:
        return {"twice": x * 2, "plus": (x + 1, 3)}


def test_outputs_in_a_dict_with_an_int_build_and_load(tmp_path: Path) -> None:
    files = save(compile_method(Mixed().eval(), (torch.randn(2, 4),)), tmp_path / "mixed.pte")
    plan = load(files["pte"], device="cpu").raw.execution_plan[0]
    assert plan.name == "forward" and len(plan.outputs) == 3  # the flat outputs: two tensors and the int


def test_an_input_eager_pytorch_refuses_is_named_by_the_app(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "pipeline", "model.methods.forward.inputs.0.dtype=int64",
                             f"hydra.run.dir={tmp_path}/run"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert result.returncode == 2 and len(lines) == 1 and "Traceback" not in result.stderr
    assert "validate: eager PyTorch cannot run method 'forward' on its example inputs (RuntimeError: mat1 and mat2" \
        in lines[0]
    assert not (tmp_path / "run" / "program").exists()  # outputs appear complete or not at all


def test_a_detector_is_one_line_naming_where_it_branches(tmp_path: Path) -> None:
    """A torchvision detector (its NMS keeps as many boxes as the scores allow): torch.export prints
    the partial graph, thousands of lines, where the app says one naming the function and the fix."""
    result = subprocess.run([sys.executable, "-m", "pipeline", "model=resnet18", "model.name=detector",
                             "model._target_=torchvision.models.detection.fasterrcnn_mobilenet_v3_large_320_fpn",
                             "+model.kwargs={weights_backbone:null}", "model.methods.forward.inputs.0.shape=[1,3,320,320]",
                             f"hydra.run.dir={tmp_path}/run"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr[:3000]
    assert result.stderr.startswith("error: compile: method 'forward' of detector: torch.export cannot trace the model")
    assert "at torchvision/ops/boxes.py:" in result.stderr and "(a detector's backbone and heads)" in result.stderr
    assert not (tmp_path / "run" / "program").exists()


def test_coverage_refuses_no_jobs() -> None:
    result = subprocess.run([sys.executable, "-m", "pipeline.coverage", "--jobs", "0"], cwd=ROOT, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 2 and "give at least one job" in result.stderr
