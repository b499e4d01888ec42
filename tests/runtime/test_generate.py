"""Greedy generation with a decoder program through `pipeline.runtime`: the same tokens as eager
`transformers` (a program without TensorRT, so it runs on this machine), state carried from
prefill to decode, and prompts or generations that would not fit the cache refused before anything
runs."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.export import Dim

from pipeline.errors import InputError
from pipeline.lowering.compile import export_method
from pipeline.lowering.serialize import save
from pipeline.models.decoder import MethodView
from pipeline.models.hf import decoder
from pipeline.runtime import load
from pipeline.runtime.generate import generate

CONFIG = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
          "num_key_value_heads": 2, "vocab_size": 256, "max_position_embeddings": 128}


@pytest.fixture(scope="module")
def program(tmp_path_factory: pytest.TempPathFactory) -> tuple[torch.nn.Module, Path]:
    """A 24-position Llama decoder as a portable program (no engines: it runs on the CPU): prefill
    and decode are its `step`, for prompts of any length and single tokens."""
    torch.manual_seed(0)
    model = decoder("llama", 24, **CONFIG)
    tokens = Dim("tokens", min=1, max=24)  # any prompt length, or one token
    example = (torch.randint(0, 256, (1, 8)), torch.tensor([0]))
    methods = {m: export_method(MethodView(model, "step"), example, (({1: tokens}, {}),)) for m in ("prefill", "decode")}
    path = save(methods, tmp_path_factory.mktemp("gen") / "llama.pte", constant_methods=model.program_constants)["pte"]
    return model, path


def _eager_greedy(model: torch.nn.Module, prompt: torch.Tensor, new: int) -> torch.Tensor:
    tokens = prompt
    with torch.no_grad():
        logits = model.prefill(prompt)
        for i in range(new):
            token = logits[:, -1].argmax(-1, keepdim=True)
            tokens = torch.cat([tokens, token], dim=1)
            if i + 1 < new:
                logits = model.decode(token, torch.tensor([tokens.shape[1] - 1]))
    return tokens


def test_tokens_match_eager_transformers(program: tuple[torch.nn.Module, Path]) -> None:
    model, path = program
    loaded = load(path, device="cpu")
    prompt = torch.randint(0, 256, (1, 8), generator=torch.Generator().manual_seed(3))
    assert torch.equal(generate(loaded, prompt, 17), _eager_greedy(model, prompt, 17))  # 8 + 17 - 1 = 24 positions: full
    assert torch.equal(generate(loaded, prompt, 5), _eager_greedy(model, prompt, 5))  # prefill starts over
    short = prompt[:, :3]
    assert torch.equal(generate(loaded, short, 9), _eager_greedy(model, short, 9))  # another prompt length


def test_what_does_not_fit_is_refused_before_anything_runs(program: tuple[torch.nn.Module, Path]) -> None:
    loaded = load(path := program[1], device="cpu")
    prompt = torch.zeros(1, 8, dtype=torch.int64)
    with pytest.raises(InputError, match="a prompt of 8 tokens and 18 new ones need 25 cache positions; the program's "
                                         "cache holds 24"):
        generate(loaded, prompt, 18)
    with pytest.raises(InputError, match=r"prompt must be one row of token ids, shape \[1, T\]"):
        generate(loaded, torch.zeros(2, 8, dtype=torch.int64), 4)
    run = subprocess.run([sys.executable, "-m", "pipeline.runtime.generate", str(path), "--prompt-ids", "1 2 x"],
                         capture_output=True, text=True)
    assert run.returncode == 2 and run.stderr.startswith("error: --prompt-ids must be token ids"), run.stderr
    run = subprocess.run([sys.executable, "-m", "pipeline.runtime.generate", str(path), "--prompt-ids", "1 2 3",
                          "--max-new-tokens", "4"], capture_output=True, text=True, check=True)
    assert len(run.stdout.split("\n")[0].split()) == 4 and "4 tokens in" in run.stdout


def test_input_buffers_take_the_next_call_in_place(program: tuple[torch.nn.Module, Path]) -> None:
    """`generate` writes each token and position into decode's own input memory (planned, or its
    own where the plan shares it with later values): the same logits; a shape outside the plan is
    refused."""
    decode = load(program[1], device="cpu").method("decode")
    with pytest.raises(InputError, match="method 'decode' input 0"):
        decode.input_buffer(0, (1, 25))
    token, position = decode.input_buffer(0, (1, 1)), decode.input_buffer(1, (1,))
    assert token is not None and position is not None
    token.fill_(5)
    position.fill_(0)
    (got,) = decode.execute([token, position])
    (want,) = load(program[1], device="cpu").method("decode").execute([torch.tensor([[5]]), torch.tensor([0])])
    torch.testing.assert_close(got, want)
