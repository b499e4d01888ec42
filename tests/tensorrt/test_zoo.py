"""Real models: MobileNetV3-Small and ResNet-18 lower with every compute node in one TensorRT
engine and serialize to .pte; the decoder's methods keep their engines; on a GPU they match eager."""

import pytest
import torch
from torch.export import Dim

from pipeline.delegate import pte
from pipeline.engine.compile_spec import TensorRTCompileSpec
from pipeline.models.decoder import MethodView, tiny_decoder
from pipeline.models.vision import mobilenet_v3_small, resnet18
from tests.helpers import (
    MODEL_TOLERANCE,
    assert_close,
    assert_not_degenerate,
    gpu,
    leftover_ops,
    lower,
    run_engines,
    run_reference,
    tensorrt_blobs,
)

ZOO = {"mobilenet_v3_small": mobilenet_v3_small, "resnet18": resnet18}


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("name", sorted(ZOO))
def test_vision_model_is_one_engine(name: str, precision: str, tmp_path) -> None:  # type: ignore[no-untyped-def]
    model = ZOO[name]()
    x = torch.randn(1, 3, 224, 224, generator=torch.Generator().manual_seed(1))
    edge, part = lower(model, (x,), TensorRTCompileSpec(precision=precision))
    assert leftover_ops(edge) == [] and part.record.refused == {}
    assert len(tensorrt_blobs(edge)) == 1
    path = tmp_path / f"{name}.pte"
    path.write_bytes(edge.to_executorch().buffer)
    assert pte.check_tensorrt_io(pte.load_program(path)) == 1
    with torch.no_grad():
        ref = model(x)
    assert_not_degenerate(ref)
    assert_close(run_reference(edge, [x], TensorRTCompileSpec(precision=precision))[0], ref, precision, MODEL_TOLERANCE)


@gpu
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("name", sorted(ZOO))
def test_vision_model_matches_eager_on_the_gpu(name: str, precision: str) -> None:
    model = ZOO[name]()
    x = torch.randn(1, 3, 224, 224, generator=torch.Generator().manual_seed(1))
    edge, _ = lower(model, (x,), TensorRTCompileSpec(precision=precision))
    with torch.no_grad():
        ref = model(x)
    assert_close(run_engines(edge, [x])[0], ref, precision, MODEL_TOLERANCE)


def test_decoder_methods_keep_their_engines() -> None:
    model = tiny_decoder()
    tokens = torch.randint(0, 256, (1, 8), generator=torch.Generator().manual_seed(0))
    logits, keys, values = model.prefill(tokens)
    edge, _ = lower(MethodView(model, "prefill"), (tokens,))
    assert leftover_ops(edge) == [] and len(tensorrt_blobs(edge)) == 1
    cache = Dim("cache", min=1, max=120)
    step = (tokens[:, :1], torch.tensor([8]), keys, values)
    edge, _ = lower(MethodView(model, "decode"), step, dynamic_shapes=(({}, {}, {3: cache}, {3: cache}),))
    assert leftover_ops(edge) == [] and len(tensorrt_blobs(edge)) == 1
    with torch.no_grad():
        refs = model.decode(*step)
    for out, ref in zip(run_reference(edge, step, TensorRTCompileSpec()), refs):
        assert_not_degenerate(ref)
        assert_close(out, ref, "fp32")


@gpu
def test_decoder_decode_matches_eager_on_the_gpu() -> None:
    model = tiny_decoder()
    tokens = torch.randint(0, 256, (1, 8), generator=torch.Generator().manual_seed(0))
    _, keys, values = model.prefill(tokens)
    cache = Dim("cache", min=1, max=120)
    step = (tokens[:, :1], torch.tensor([8]), keys, values)
    edge, _ = lower(MethodView(model, "decode"), step, dynamic_shapes=(({}, {}, {3: cache}, {3: cache}),))
    with torch.no_grad():
        refs = model.decode(*step)
    for out, ref in zip(run_engines(edge, step), refs):
        assert_close(out, ref, "fp32")
