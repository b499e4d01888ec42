"""compile.quantize: engines store quantized weights (their size, on the CPU), and modes that computed
wrong results on the GPU are refused with one line."""

import pytest
import torch

from pipeline.errors import CompileSpecError
from pipeline.tensorrt.compile_spec import TensorRTCompileSpec
from tests.helpers import leftover_ops, lower, tensorrt_engines


def _engine_bytes(module: torch.nn.Module, x: torch.Tensor, **quantize: object) -> int:
    edge, _ = lower(module.eval(), [x], TensorRTCompileSpec(precision="fp16", quantize=quantize or None))
    assert leftover_ops(edge) == []
    return sum(len(engine) for _, engine in tensorrt_engines(edge))


def test_int8_weight_only_engines_store_int8_weights() -> None:
    torch.manual_seed(0)
    lin = torch.nn.Linear(512, 1024)
    x = torch.randn(4, 512)
    assert _engine_bytes(lin, x, mode="int8_weight_only") < 0.75 * _engine_bytes(lin, x)
    emb = torch.nn.Embedding(4096, 256)
    ids = torch.randint(0, 4096, (1, 8))
    assert _engine_bytes(emb, ids, mode="int8_weight_only") < 0.75 * _engine_bytes(emb, ids)


def test_kept_weights_stay_float() -> None:
    torch.manual_seed(0)
    lin = torch.nn.Linear(512, 1024)
    x = torch.randn(4, 512)
    assert _engine_bytes(lin, x, mode="int8_weight_only", keep=["weight", "p_weight"]) > 0.9 * _engine_bytes(lin, x)


@pytest.mark.parametrize("quantize, words", [
    ({"mode": "int4_weight_only"}, "wrong results on the H200"),
    ({"mode": "fp8"}, "wrong results on the H200"),
    ({"mode": "int2"}, "is not a mode"),
    ({"mode": "int8_weight_only", "layers": ["convolution"]}, "back into float"),
    ({"mode": "int8_weight_only", "colour": 1}, "unknown quantize field"),
])
def test_bad_quantize_options_are_one_line(quantize: dict, words: str) -> None:
    with pytest.raises(CompileSpecError, match=words) as info:
        TensorRTCompileSpec(precision="fp16", quantize=quantize)
    assert "\n" not in str(info.value)
