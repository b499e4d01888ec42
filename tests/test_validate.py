"""The validate step says when its comparison cannot show a wrong engine."""

import json
import logging
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from pipeline.config.compose import compose
from pipeline.config.targets import ENV
from pipeline.steps import run_all

ZERO_HEAD = """import torch
def make():
    head = torch.nn.Linear(32, 10)
    torch.nn.init.zeros_(head.weight)
    torch.nn.init.zeros_(head.bias)
    return torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), head)
"""


def test_a_constant_reference_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                       caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "zerohead.py").write_text(ZERO_HEAD)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv(ENV, "zerohead")
    notes = {}
    for init in ("factory", "every_layer"):
        cfg = OmegaConf.to_container(compose(["model._target_=zerohead.make", f"model.init={init}"]), resolve=True)
        with caplog.at_level(logging.WARNING, logger="pipeline.validate"):
            run_all(cfg, tmp_path / init, validate=True)  # type: ignore[arg-type]
        notes[init] = json.loads((tmp_path / init / "validation.json").read_text())["methods"]["forward"].get("note")
    assert notes["every_layer"] is None
    assert notes["factory"].startswith("every output of eager forward is one constant")
    assert "model.init=every_layer" in notes["factory"] and caplog.text.count("is one constant") == 1


EXPORT_DIFFERS = """import torch
class Scaled(torch.nn.Module):
    def __init__(self, exported):
        super().__init__()
        self.exported = exported
    def forward(self, x):  # `differs`: exported, another model than it is eagerly
        return x * (self.exported if torch.compiler.is_exporting() else 2.0)
def differs():
    return Scaled(3.0)
def same():
    return Scaled(2.0)
"""


def test_a_program_beyond_the_tolerance_is_marked_and_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                           caplog: pytest.LogCaptureFixture) -> None:
    """On the CPU: the multiplication is kept out of TensorRT, so the program has no engine and runs."""
    (tmp_path / "scaled.py").write_text(EXPORT_DIFFERS)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv(ENV, "scaled")
    found = {}
    for factory in ("differs", "same"):
        cfg = OmegaConf.to_container(compose([f"model._target_=scaled.{factory}", "compile.torch_executed_ops=[aten.mul]"]),
                                     resolve=True)
        with caplog.at_level(logging.WARNING, logger="pipeline.validate"):
            files = run_all(cfg, tmp_path / factory, validate=True)  # type: ignore[arg-type]
        method = json.loads((tmp_path / factory / "validation.json").read_text())["methods"]["forward"]
        found[factory] = (method["runtime"], method["within_tolerance"], json.loads(files["metrics"].read_text())["rel_err_ok"])
    assert found == {"differs": ("pipeline.runtime (cpu)", False, 0), "same": ("pipeline.runtime (cpu)", True, 1)}, found
    said = [r.getMessage() for r in caplog.records if "max_rel_error" in r.getMessage()]
    assert said == ["validate: method 'forward' is 0.5 from eager PyTorch (relative to its largest output), above "
                    "runtime.max_rel_error=0.02"], said
