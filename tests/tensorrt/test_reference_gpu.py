"""The CPU reference executor against TensorRT's own kernels (issue 57): on a GPU, the compile step
runs every engine it builds on the same inputs as the reference executor and records the difference
(`reference.tensorrt_rel_error`); over the zoo and a sample of the coverage suite, each engine agrees
with it: fp32 built and run with TF32 off at the reference's own fp32 tolerance (`TOLERANCE`), fp16 at
the whole-model tolerance. Without a GPU these tests skip visibly."""

from __future__ import annotations

import pytest

from bench.reference_gpu import SUITE_SAMPLE, ZOO, add_row, suite_row, zoo_row
from pipeline.engine.reference.check import TOLERANCE
from tests.helpers import MODEL_TOLERANCE, gpu

BOUND = {"fp32": TOLERANCE["fp32"], "fp16": MODEL_TOLERANCE["fp16"]}


@gpu
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("model", ZOO)
def test_tensorrt_agrees_with_the_reference_executor_on_the_zoo(model: str, precision: str) -> None:
    row = zoo_row(model, precision)
    add_row(row)
    assert row["engines"] and row["tensorrt_error"] is not None, row
    assert row["tensorrt_error"] <= BOUND[precision], row


@gpu
@pytest.mark.parametrize("name", SUITE_SAMPLE)
def test_tensorrt_agrees_with_the_reference_executor_on_the_suite(name: str) -> None:
    row = suite_row(name)
    add_row(row)
    assert row["reference_unchecked"] == 0 and row["tensorrt_error"] is not None, row
    assert row["tensorrt_error"] <= BOUND["fp32"] and row["reference_error"] <= 1e-3, row
