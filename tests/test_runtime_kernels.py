"""The serialize step names every operator a program leaves to kernels that ExecuTorch's runtime
library lacks (such a program runs in pipeline.runtime only), warns, and refuses it under
`serialize.runtime_kernels=error`, writing nothing."""

import json
import logging
from pathlib import Path

import pytest

from pipeline.config.compose import compose, typed
from pipeline.config.targets import ENV
from pipeline.errors import ConfigError, ExportError
from pipeline.steps import run_all

SORTS = """import torch
class Sorts(torch.nn.Module):
    def forward(self, x):
        return torch.sort(x, -1).values * 2
def make():
    return Sorts()
"""


def _build(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, *overrides: str) -> Path:
    (tmp_path / "sorts.py").write_text(SORTS)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv(ENV, "sorts")
    cfg = typed(compose(["model._target_=sorts.make", *overrides]))
    run_all(cfg, tmp_path / name)  # type: ignore[arg-type]
    return tmp_path / name


def test_a_kernel_the_runtime_lacks_is_named_and_can_be_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="pipeline.steps"):
        whole = _build(tmp_path, monkeypatch, "whole")  # TensorRT takes the sort: nothing missing
        outside = _build(tmp_path, monkeypatch, "outside", "compile.torch_executed_ops=[aten.sort]")
    assert json.loads((whole / "manifest.json").read_text())["runtime_kernels"]["missing"] == {}
    found = json.loads((outside / "manifest.json").read_text())["runtime_kernels"]
    assert found["missing"] == {"forward": ["aten::sort.values"]}, found
    assert "registers" in found["checked_against"]
    said = [r.getMessage() for r in caplog.records if "lacks" in r.getMessage()]
    assert len(said) == 1 and said[0].startswith("the program calls kernels ExecuTorch's runtime library lacks "
                                                 "(forward: aten::sort.values)"), said

    with pytest.raises(ExportError, match=r"lacks \(forward: aten::sort.values\).*serialize.runtime_kernels=error"):
        _build(tmp_path, monkeypatch, "refused", "compile.torch_executed_ops=[aten.sort]", "serialize.runtime_kernels=error")
    assert not (tmp_path / "refused" / "program").exists() and not (tmp_path / "refused" / "manifest.json").exists()


def test_an_unknown_choice_is_one_line() -> None:
    with pytest.raises(ConfigError, match=r"serialize.runtime_kernels = 'ignore' is not one of \['warn', 'error'\]"):
        compose(["serialize.runtime_kernels=ignore"])
