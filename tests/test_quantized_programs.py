"""Quantized programs built on the CPU through the configs: a decoder with int4 weights (prefill and
decode) and a CNN with an int8 classifier lower whole, their engines hold the weights in the stored
width (their size against the float program's), and the report says per engine what it quantized."""

import json
from pathlib import Path

import pytest

from pipeline.config.compose import compose, typed
from pipeline.errors import CompileSpecError
from pipeline.steps import run_all

DECODER = ["model=llama_tiny", "compile=fp16", "cache=off", "model.kwargs.hidden_size=256",
           "model.kwargs.intermediate_size=512", "model.kwargs.vocab_size=1024",
           "compile.quantize.mode=int4_weight_only", "compile.quantize.group_size=64"]
CNN = ["model=mobilenet_v3_small", "compile=fp16", "cache=off", "compile.quantize.mode=int8_weight_only",
       "compile.quantize.layers=[linear]"]


def _engine(overrides: list[str], out: Path) -> dict:
    """The one engine of the program `overrides` build, checked to have left nothing outside it."""
    run_all(typed(compose(overrides)), out)  # type: ignore[arg-type]
    report = json.loads((out / "report.json").read_text())
    assert all(m["left_over"] == [] and m["num_engines"] == 1 for m in report.values()), report
    (engine,) = {e["engine_key"]: e for m in report.values() for e in m["engines"]}.values()  # prefill and decode share it
    return engine


@pytest.mark.parametrize("overrides, saved, layers", [
    (DECODER, 0.5, {"linear": 15, "embedding": 1}),  # 7 products a layer, 2 layers, the head; 4 bits: 0.73 saved
    (CNN, 0.4, {"linear": 2}),  # the classifier; 8 bits: 0.5 saved
], ids=["int4-decoder", "int8-cnn"])
def test_quantized_programs_lower_whole_and_store_narrow_weights(overrides: list[str], saved: float,
                                                                 layers: dict[str, int], tmp_path: Path) -> None:
    """The engine is smaller than the float program's by most of what its quantized weights took in 16 bits
    (a tiny model's engine is mostly TensorRT's own bytes, so sizes are compared by difference)."""
    quantized = _engine(overrides, tmp_path / "quantized")
    plain = _engine([*overrides, "compile.quantize.mode=none"], tmp_path / "float")
    summary = quantized["quantized"]
    assert summary["layers"] == layers and plain["quantized"] is None
    assert plain["engine_bytes"] - quantized["engine_bytes"] > saved * summary["weight_bytes_16bit"]


def test_a_keep_pattern_that_names_nothing_is_refused(tmp_path: Path) -> None:
    """A misspelt pattern would quantize the layer it meant to keep."""
    cfg = typed(compose([*DECODER, "compile.quantize.keep=[lm_haed.*]"]))
    with pytest.raises(CompileSpecError, match=r"^compile.quantize.keep pattern 'lm_haed.\*' names no parameter of "
                                               r"method 'prefill' \(its names look like '.*\.weight'\)"):
        run_all(cfg, tmp_path)  # type: ignore[arg-type]
    assert not (tmp_path / "program").exists()


def test_the_docs_int4_example_quantizes_every_layer(tmp_path: Path) -> None:
    """docs/quantization.md's sweep over llama_tiny, at its int4 value: no weight stays float (at the
    default group_size its 64-wide layers would, and the console would say so)."""
    docs = Path(__file__).resolve().parents[1] / "docs" / "quantization.md"
    line = next(ln for ln in docs.read_text().splitlines() if "model=llama_tiny" in ln and "int4_weight_only" in ln)
    overrides = [a if not a.startswith("compile.quantize.mode=") else "compile.quantize.mode=int4_weight_only"
                 for a in line.split() if "=" in a]
    summary = _engine([*overrides, "cache=off"], tmp_path)["quantized"]
    assert summary["kept_float"] == {} and summary["layers"] == {"linear": 15, "embedding": 1}
