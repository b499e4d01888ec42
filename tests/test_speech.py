"""Speech programs. Whisper as `{encoder, text_decoder}` (`pipeline.models.whisper`): its methods compute
what transformers' Whisper computes, both lower whole into TensorRT with the caches in the program's
state, and on a GPU `transcribe` gives transformers' greedy `generate` token for token. A Conformer
transducer as `{encoder, decoder_step, joint}` (`pipeline.models.transducer`): all three lower whole,
and on a GPU the program's greedy transcript is the eager model's."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from pipeline import steps
from pipeline.config import objects
from pipeline.config.compose import compose, typed
from pipeline.errors import ConfigError, InputError
from pipeline.models.whisper import whisper
from pipeline.runtime import load
from pipeline.runtime.speech import SUPPRESS_METHOD, transcribe, transcribe_transducer
from tests.helpers import GPU, MODEL_TOLERANCE, assert_close


def _build(model: str, tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path]:
    cfg = typed(compose([f"model={model}", "cache=off"]))
    out = tmp_path_factory.mktemp(model)
    steps.run_all(cfg, out)
    return cfg, out


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path]:
    return _build("whisper_tiny", tmp_path_factory)


def _features(cfg: Any, seed: int = 3) -> torch.Tensor:
    (shape,) = (item.shape for item in cfg.model.methods["encoder"].inputs)
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def test_methods_compute_what_transformers_computes(built: tuple[Any, Path]) -> None:
    """The encoder writes the cross-attention keys and values once; decoder steps of 4, 1 and 1 tokens
    give transformers' logits for the whole sequence (teacher-forced, no cache)."""
    cfg, _ = built
    model = objects.model(cfg)
    features, tokens = _features(cfg), torch.tensor([[1, 5, 9, 17, 3, 4]])
    with torch.no_grad():
        want = model.checkpoint_module(input_features=features, decoder_input_ids=tokens).logits
        model.encoder(features)
        got = torch.cat([model.text_decoder(tokens[:, :4], torch.tensor([0])),
                         model.text_decoder(tokens[:, 4:5], torch.tensor([4])),
                         model.text_decoder(tokens[:, 5:6], torch.tensor([5]))], 1)
    assert float((got - want).abs().max() / want.abs().max()) < 1e-5


def test_both_methods_lower_whole_with_their_caches_as_state(built: tuple[Any, Path]) -> None:
    cfg, out = built
    report = json.loads((out / "report.json").read_text())
    assert {m: (r["num_engines"], r["left_over"]) for m, r in report.items()} == {"encoder": (1, []), "text_decoder": (1, [])}
    program = load(out / "program" / "whisper_tiny.pte", device="cpu")
    kwargs = cfg.model.kwargs
    head_dim = kwargs["d_model"] // kwargs["decoder_attention_heads"]
    positions = kwargs["max_cache_len"] + 1500  # the self-attention cache and the encoder's frames
    caches = 2 * kwargs["decoder_layers"] * kwargs["decoder_attention_heads"] * positions * head_dim * 4
    (state,) = program.state.values()  # one arena for both methods: the caches, written where they live
    assert state.numel() * state.element_size() >= caches
    assert {"max_cache_len", "decoder_start_token_id", "eos_token_id", SUPPRESS_METHOD} <= set(program.constant_names)


def test_transcribe_refuses_what_does_not_fit_before_running(built: tuple[Any, Path]) -> None:
    cfg, out = built
    program = load(out / "program" / "whisper_tiny.pte", device="cpu")
    with pytest.raises(InputError, match="do not fit the program's cache of 32 positions"):
        transcribe(program, _features(cfg), max_new_tokens=100)


def test_bad_whisper_kwargs_are_one_line() -> None:
    with pytest.raises(ConfigError, match="max_cache_len = 0 must be within"):
        whisper(max_cache_len=0, d_model=64)
    with pytest.raises(ConfigError, match="not a field of WhisperConfig"):
        whisper(max_cache_len=8, d_modle=64)


@pytest.mark.gpu
@pytest.mark.skipif(not GPU, reason="needs CUDA and TensorRT")
def test_transcribe_matches_transformers_generate_on_the_gpu(built: tuple[Any, Path]) -> None:
    from transformers import GenerationConfig

    cfg, out = built
    model = objects.model(cfg)
    program = load(out / "program" / "whisper_tiny.pte")
    for seed in (3, 4):
        features = _features(cfg, seed)
        got = transcribe(program, features.cuda(), max_new_tokens=24)
        generation = GenerationConfig.from_model_config(model.checkpoint_module.config)
        generation.update(max_new_tokens=24, do_sample=False, num_beams=1)
        with torch.no_grad():
            want = model.checkpoint_module.generate(input_features=features, generation_config=generation)[0].tolist()
        assert got == want[:len(got)] and len(got) == len(want), (seed, got, want)


class _Eager:
    """The eager model behind the program interface `transcribe_transducer` takes."""

    def __init__(self, model: Any) -> None:
        self.model, self.constant_names = model, list(model.program_constants)

    def constant(self, name: str) -> Any:
        return self.model.program_constants[name]

    def method(self, name: str) -> Any:
        run = getattr(self.model, name)
        return type("Method", (), {"execute": staticmethod(lambda inputs: [run(*inputs)])})()


@pytest.fixture(scope="module")
def transducer_built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path]:
    return _build("transducer_tiny", tmp_path_factory)


def test_transducer_methods_lower_whole_with_the_predictor_state(transducer_built: tuple[Any, Path]) -> None:
    cfg, out = transducer_built
    report = json.loads((out / "report.json").read_text())
    assert {m: (r["num_engines"], r["left_over"]) for m, r in report.items()} == {
        "encoder": (1, []), "decoder_step": (1, []), "joint": (1, [])}
    program = load(out / "program" / "transducer_tiny.pte", device="cpu")
    assert program.constant("blank_id") == cfg.model.kwargs["vocab"]
    (state,) = program.state.values()  # the LSTM's hidden and cell state, shared by encoder and decoder_step
    assert state.numel() * state.element_size() >= 2 * cfg.model.kwargs["predictor"] * 4
    with pytest.raises(InputError, match="not a transducer program"):
        transcribe_transducer(_Eager(whisper(max_cache_len=8, d_model=64, encoder_attention_heads=4, decoder_attention_heads=4)),
                              torch.zeros(1, 80, 3000))


@pytest.mark.gpu
@pytest.mark.skipif(not GPU, reason="needs CUDA and TensorRT")
def test_transducer_methods_match_the_eager_model_on_the_gpu(transducer_built: tuple[Any, Path]) -> None:
    """Each method against eager PyTorch on the same inputs, the prediction network's state carried
    across steps (random weights put many logits within TF32's error of each other, so greedy
    transcripts of the two part at the first near tie: compared here is what each step computes)."""
    cfg, out = transducer_built
    program, model = load(out / "program" / "transducer_tiny.pte"), objects.model(cfg)
    features = _features(cfg)
    with torch.no_grad():
        frames = model.encoder(features)
        assert_close(program.method("encoder").execute([features.cuda()])[0].cpu(), frames, "fp32", MODEL_TOLERANCE)
        for token in (64, 5, 12, 12, 40):
            want = model.decoder_step(torch.tensor([token]))
            got = program.method("decoder_step").execute([torch.tensor([token], device="cuda")])[0].cpu()
            assert_close(got, want, "fp32", MODEL_TOLERANCE)
            logits = program.method("joint").execute([frames[:, 7].cuda(), want.cuda()])[0].cpu()
            assert_close(logits, model.joint(frames[:, 7], want), "fp32", MODEL_TOLERANCE)
