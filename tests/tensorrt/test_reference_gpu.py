"""The CPU reference executor against TensorRT's own kernels (issue 57): on a GPU, the compile step
runs every engine it builds on the same inputs as the reference executor and records the difference
(`reference.tensorrt_rel_error`); over the zoo and a sample of the coverage suite, each engine agrees
at the whole-model tolerance (TensorRT-RTX's fp32 convolutions and products run at TF32-level error,
`MODEL_TOLERANCE`). Without a GPU these tests skip visibly."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pipeline.config.compose import compose, typed
from pipeline.coverage.run import build_row
from pipeline.coverage.suite import select
from pipeline.steps import run_all
from tests.helpers import MODEL_TOLERANCE, gpu

ZOO = ["mlp", "mobilenet_v3_small", "resnet18", "tiny_decoder", "llama_tiny", "whisper_tiny", "transducer_tiny"]
SUITE_SAMPLE = ["torchvision/squeezenet1_1", "torchvision/shufflenet_v2_x0_5", "timm/lcnet_050",
                "timm/vit_tiny_patch16_224", "hf/bert_tiny", "hf-decoder/qwen3", "hf-decoder/gemma3_text",
                "hf-decoder/phi3", "hf-decoder/gpt2", "hf-decoder/qwen3_moe"]


def _engines(report: dict[str, Any]) -> list[dict[str, Any]]:
    return [e.get("reference") or {} for method in report.values() for e in method["engines"]]


@gpu
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("model", ZOO)
def test_tensorrt_agrees_with_the_reference_executor_on_the_zoo(model: str, precision: str, tmp_path: Path) -> None:
    run_all(typed(compose([f"model={model}", f"compile.precision={precision}", "cache=off"])), tmp_path)
    checks = _engines(json.loads((tmp_path / "report.json").read_text()))
    assert checks and all("tensorrt_rel_error" in c for c in checks), checks
    assert max(c["tensorrt_rel_error"] for c in checks) <= MODEL_TOLERANCE[precision], checks


@gpu
@pytest.mark.parametrize("name", SUITE_SAMPLE)
def test_tensorrt_agrees_with_the_reference_executor_on_the_suite(name: str) -> None:
    (entry,) = select([name])
    row = build_row(entry, "fp32")
    assert row["reference_unchecked"] == 0 and row["tensorrt_error"] is not None, row
    assert row["tensorrt_error"] <= MODEL_TOLERANCE["fp32"] and row["reference_error"] <= 1e-3, row
