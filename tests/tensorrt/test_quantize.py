"""compile.quantize: engines store int4, int8 or fp8 weights (their size, on the CPU), compute what the
rounded weights give (on a GPU), keep in float what they cannot quantize, and bad options are one line."""

import re

import pytest
import torch

from pipeline.engine import quantize
from pipeline.engine.compile_spec import QuantizeSpec, TensorRTCompileSpec
from pipeline.errors import CompileSpecError
from tests.helpers import GPU, leftover_ops, lower, run_engines, tensorrt_engines

AMAX = 5.0  # the fp8 input scale's magnitude, as calibration would give it for randn inputs


def _edge(module: torch.nn.Module, x: torch.Tensor, **options: object):  # noqa: ANN202 - an EdgeProgramManager
    edge, _ = lower(module.eval(), [x], TensorRTCompileSpec(precision="fp16", quantize=options or None))
    assert leftover_ops(edge) == []
    return edge


def _engine_bytes(module: torch.nn.Module, x: torch.Tensor, **options: object) -> int:
    return sum(len(engine) for _, engine in tensorrt_engines(_edge(module, x, **options)))


def _linear() -> tuple[torch.nn.Linear, torch.Tensor]:
    torch.manual_seed(0)
    return torch.nn.Linear(512, 1024), torch.randn(4, 512)


@pytest.mark.parametrize("options, ratio", [
    ({"mode": "int4_weight_only"}, 0.5),  # engine overhead aside, a quarter
    ({"mode": "int8_weight_only"}, 0.75),
    ({"mode": "fp8", "activation_amax": {"weight": AMAX}}, 0.75),
])
def test_engines_store_narrow_weights(options: dict, ratio: float) -> None:
    lin, x = _linear()
    assert _engine_bytes(lin, x, **options) < ratio * _engine_bytes(lin, x)


@pytest.mark.parametrize("mode, ratio", [("int4_weight_only", 0.5), ("int8_weight_only", 0.75)])
def test_embedding_tables_store_narrow_rows(mode: str, ratio: float) -> None:
    emb = torch.nn.Embedding(4096, 256)
    ids = torch.randint(0, 4096, (1, 8))
    assert _engine_bytes(emb, ids, mode=mode) < ratio * _engine_bytes(emb, ids)


@pytest.mark.parametrize("options", [
    {"mode": "int8_weight_only", "keep": ["weight"]},
    {"mode": "fp8"},  # no calibrated input scale: a partitioner used alone does not calibrate
])
def test_weights_it_cannot_or_may_not_quantize_stay_float(options: dict) -> None:
    lin, x = _linear()
    assert _engine_bytes(lin, x, **options) > 0.9 * _engine_bytes(lin, x)


@pytest.mark.skipif(not GPU, reason="needs a CUDA GPU")
@pytest.mark.parametrize("options", [
    {"mode": "int4_weight_only"}, {"mode": "int8_weight_only"}, {"mode": "fp8", "activation_amax": {"weight": AMAX}},
])
def test_engines_compute_what_their_rounded_weights_give(options: dict) -> None:
    """The engine's error against the float layer is the rounding's (int4 on random weights is far from
    float), so it is checked against the layer with the weights (and fp8's input) rounded as stored."""
    lin, x = _linear()
    spec = QuantizeSpec(**options)
    scheme = quantize.scheme(spec, quantize.SLOTS_BY_LAYER["linear"], "weight")
    rounded = quantize.simulated(lin.weight, scheme)
    if spec.mode == "fp8":
        scale = AMAX / quantize.FP8_MAX
        x = (x / scale).clamp(-quantize.FP8_MAX, quantize.FP8_MAX).to(torch.float8_e4m3fn).float() * scale
    with torch.no_grad():
        want = torch.nn.functional.linear(x, rounded, lin.bias)
    (got,) = run_engines(_edge(lin, x, **options), [x.cuda()])
    assert float((got.float().cpu() - want).abs().max() / want.abs().max()) < 5e-3


@pytest.mark.parametrize("options, words", [
    ({"mode": "int2"}, "is not a mode"),
    ({"mode": "fp8", "layers": ["linear", "convolution"]}, "convolutions stay float: .* 8.2x slower"),
    ({"mode": "int4_weight_only", "group_size": 3}, "must be an even integer"),
    ({"mode": "int8_weight_only", "colour": 1}, "unknown quantize field"),
])
def test_bad_quantize_options_are_one_line(options: dict, words: str) -> None:
    with pytest.raises(CompileSpecError, match=words) as info:
        TensorRTCompileSpec(precision="fp16", quantize=options)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("pattern, kept", [("lm_head.*", True), ("*lm_head*", True), ("head.*", False),
                                           ("model.model.lm_head.weight", True), ("lm_head", False)])
def test_keep_patterns_match_a_name_whole_or_from_a_dot_on(pattern: str, kept: bool) -> None:
    spec = QuantizeSpec(mode="int8_weight_only", keep=[pattern])
    assert quantize.kept("model.model.lm_head.weight", spec) is kept


@pytest.mark.parametrize("features, said", [
    (64, r"int4_weight_only quantized 0 of 1 weight\(s\), so the program is barely smaller .* input dim \(64\) is not a "
         r"multiple of quantize.group_size \(128\)"),
    (256, r"int4_weight_only quantized 1 of 1 weight\(s\)$"),
])
def test_the_console_says_how_many_weights_a_mode_quantized(features: int, said: str, caplog: pytest.LogCaptureFixture) -> None:
    """A mode that quantizes (almost) nothing says so where the user looks, not only in report.json."""
    from pipeline.lowering.compile import compile_method

    torch.manual_seed(0)
    spec = TensorRTCompileSpec(precision="fp16", quantize={"mode": "int4_weight_only"})
    with caplog.at_level("INFO", logger="pipeline"):
        compile_method(torch.nn.Linear(features, 32).eval(), [torch.randn(2, features)], spec)
    assert any(re.search(said, r.getMessage()) for r in caplog.records), [r.getMessage() for r in caplog.records]
