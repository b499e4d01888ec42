"""Whisper as a two-method program (`pipeline.models.whisper`): its methods compute what transformers'
Whisper computes, both lower whole into TensorRT with the caches in the program's state, and on a
GPU `transcribe` gives transformers' greedy `generate` token for token."""

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
from pipeline.runtime.speech import SUPPRESS_METHOD, transcribe
from tests.helpers import GPU


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path]:
    cfg = typed(compose(["model=whisper_tiny", "cache=off"]))
    out = tmp_path_factory.mktemp("whisper")
    steps.run_all(cfg, out)
    return cfg, out


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
