"""Partitioning a model with an op TensorRT cannot take: TensorRT takes the parts around it, the
rest lowers to portable ops, or to XNNPACK when XNNPACK follows TensorRT in the chain."""

import pytest
import torch
from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

from pipeline.delegate import pte
from pipeline.engine.compile_spec import TensorRTCompileSpec
from pipeline.executorch_api import edge_programs
from pipeline.lowering.report import lowering_report
from tests.helpers import MIXED_INPUT, MIXED_SPEC, Mixed, leftover_ops, lower, tensorrt_blobs

X = MIXED_INPUT


def _counts(edge) -> dict:  # type: ignore[no-untyped-def]
    program = pte.load_program(edge.to_executorch().buffer)
    out: dict = {}
    for call in pte.delegate_calls(program):
        out[call.backend] = out.get(call.backend, 0) + 1
    return out


def test_split_with_portable_fallback() -> None:
    edge, part = lower(Mixed(), (X,), MIXED_SPEC)
    left = " ".join(leftover_ops(edge))
    assert "convolution" in left and "cumsum" in left
    assert len(tensorrt_blobs(edge)) >= 2
    assert any("torch_executed_ops (aten.convolution.default)" in r["reason"] for r in part.record.refused.values())
    assert _counts(edge) == {"TensorRTBackend": len(tensorrt_blobs(edge))}


def test_split_with_xnnpack_after_tensorrt() -> None:
    edge, part = lower(Mixed(), (X,), MIXED_SPEC, after=[XnnpackPartitioner()])
    left = " ".join(leftover_ops(edge))
    assert "cumsum" in left and "convolution" not in left
    report = lowering_report(edge_programs(edge), {"forward": part.record})["forward"]
    counts = _counts(edge)
    assert counts.get("XnnpackBackend", 0) >= 1 and counts["TensorRTBackend"] >= 2
    assert report["num_engines"] == counts["TensorRTBackend"]
    assert [d["backend"] for d in report["other_delegates"]] == ["XnnpackBackend"] * counts["XnnpackBackend"]
    assert any(item["op"] == "aten.cumsum.default" and "torch_executed_ops" in item["reason"] for item in report["left_over"])
    assert report["engine_bytes"] > 0 and report["build_seconds"] > 0


def test_report_counts_claimed_nodes() -> None:
    edge, part = lower(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU()), (torch.randn(2, 4),),
                       TensorRTCompileSpec())
    report = lowering_report(edge_programs(edge), {"forward": part.record})["forward"]
    assert report["claimed_by_tensorrt"] == 2 and report["left_over"] == [] and report["num_engines"] == 1
    engine = report["engines"][0]
    assert engine["inputs"][0]["shape"] == [2, 4] and engine["num_layers"] > 0


def test_which_ops_stay_whole_is_a_fact_of_their_converter_record() -> None:
    """Decomposition may break up data movement, creation and attention (their records say so); ops
    whose converters take them whole, such as linear and softmax, are kept from it."""
    from executorch.exir.tracer import _default_decomposition_table

    from pipeline.engine.converters.registry import lookup
    from pipeline.lowering.partitioning import preserved_ops

    aten = torch.ops.aten
    kept = set(preserved_ops(_default_decomposition_table()))
    assert {aten.linear.default, aten.softmax.int, aten.layer_norm.default} <= kept
    for op in (aten.scaled_dot_product_attention.default, aten.flip.default, aten.full_like.default):
        assert lookup(op).decomposes and op not in kept  # type: ignore[union-attr]


def test_an_executed_op_no_method_has_is_refused_before_any_engine(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """An entry naming an op the graph lacks (the graph's op under another name) would keep nothing
    out of TensorRT; the compile step refuses it, in one line naming the graph's close ops."""
    from pipeline.config.compose import compose
    from pipeline.config.schema import typed
    from pipeline.errors import CompileSpecError
    from pipeline.steps.compile import run_compile

    cfg = typed(compose(["model=mlp", "compile.torch_executed_ops=[aten.gelu,aten.gelu_backward]"]))
    with pytest.raises(CompileSpecError) as caught:
        run_compile(cfg, tmp_path / "compiled")
    assert str(caught.value) == ("torch_executed_ops entry 'aten.gelu_backward' names no op of the exported graph of "
                                 "method(s) ['forward'], so it would keep nothing out of TensorRT (the graph has "
                                 "['aten.gelu']); name an op the graph has, or drop the entry")
    assert not (tmp_path / "compiled").exists()
