"""The validate step says when its comparison cannot show a wrong engine, and when a program is
further from eager PyTorch than the build allows."""

import json
import logging
from pathlib import Path

import pytest

from pipeline.config.compose import compose, typed
from pipeline.config.targets import ENV
from pipeline.steps import run_all

ZERO_HEAD = """import torch
def make():
    head = torch.nn.Linear(32, 10)
    torch.nn.init.zeros_(head.weight)
    torch.nn.init.zeros_(head.bias)
    return torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), head)
"""


def _build(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, module: str, source: str, run: str, *overrides: str) -> Path:
    """Write `source` as `module`, build `run` from it with validation; its build folder."""
    (tmp_path / f"{module}.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv(ENV, module)
    cfg = typed(compose(list(overrides)))
    run_all(cfg, tmp_path / run, validate=True)  # type: ignore[arg-type]
    return tmp_path / run


def _forward(build: Path) -> dict:
    return json.loads((build / "validation.json").read_text())["methods"]["forward"]


def test_a_constant_reference_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                       caplog: pytest.LogCaptureFixture) -> None:
    notes = {}
    with caplog.at_level(logging.WARNING, logger="pipeline.steps.validate"):
        for init in ("factory", "every_layer"):
            build = _build(tmp_path, monkeypatch, "zerohead", ZERO_HEAD, init, "model._target_=zerohead.make",
                           f"model.init={init}")
            notes[init] = _forward(build).get("note")
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
def nan():
    return Scaled(float("nan"))
"""


def test_a_program_beyond_the_tolerance_is_marked_and_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                           caplog: pytest.LogCaptureFixture) -> None:
    """On the CPU: the multiplication is kept out of TensorRT, so the program has no engine and runs."""
    found = {}
    with caplog.at_level(logging.WARNING, logger="pipeline.steps.validate"):
        for factory in ("differs", "same", "nan"):
            build = _build(tmp_path, monkeypatch, "scaled", EXPORT_DIFFERS, factory, f"model._target_=scaled.{factory}",
                           "compile.torch_executed_ops=[aten.mul]")
            method = _forward(build)
            found[factory] = (method["runtime"], method["within_tolerance"],
                              json.loads((build / "metrics.json").read_text())["rel_err_ok"])
    cpu = "pipeline.runtime (cpu)"
    assert found == {"differs": (cpu, False, 0), "same": (cpu, True, 1), "nan": (cpu, False, 0)}, found
    said = [r.getMessage() for r in caplog.records if "max_rel_error" in r.getMessage()]
    assert said == [f"validate: method 'forward' is {error} from eager PyTorch (relative to its largest output), above "
                    "runtime.max_rel_error=0.02" for error in ("0.5", "nan")], said
