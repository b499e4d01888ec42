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
