"""Hugging Face decoders (Llama, Qwen2) built from configs: prefill and decode each lower into one
TensorRT engine with nothing left outside, and the KV cache is the program's state: an input of
both engines at run time, kept once for both methods. On a GPU: teacher-forced logits match eager
`transformers` through prefill and decode steps."""

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from pipeline import steps
from pipeline.config import objects
from pipeline.config.compose import compose, typed
from pipeline.coverage import suite
from pipeline.coverage.run import build_row, entry_config
from pipeline.delegate import pte
from pipeline.delegate.blob import decode_op_metadata
from pipeline.delegate.pte import named_entries
from pipeline.errors import ConfigError, InputError
from pipeline.models.hf import decoder
from pipeline.runtime import load
from pipeline.runtime.generate import generate
from pipeline.runtime.options import RuntimeOptions
from tests.helpers import GPU

MODELS = ["llama_tiny", "qwen2_tiny"]


@pytest.mark.parametrize("kwargs, message", [
    ({"hiden_size": 64}, "model.kwargs.hiden_size is not a field of LlamaConfig (did you mean 'hidden_size'?)"),
    ({"dtype": "int8"}, "model.kwargs.dtype = 'int8' is not a floating-point dtype"),
    ({"architecture": "gpt5"}, "model.kwargs.architecture: 'gpt5' is not a causal-LM model type of transformers"),
    ({"architecture": "mamba"}, "a MambaForCausalLM gets no static KV cache from transformers"),
    ({"attn_implementation": "flash_attention_2"}, "model.kwargs.attn_implementation = 'flash_attention_2': transformers "
                                                   "refuses it for a LlamaForCausalLM"),
    ({"max_cache_len": 0}, "model.kwargs.max_cache_len = 0 must be at least 1"),
    ({"architecture": "roberta"}, "a RobertaForCausalLM keeps a KV cache only as a decoder; set model.kwargs.is_decoder=true"),
    ({"architecture": "openai-gpt"}, "a OpenAIGPTLMHeadModel returns no KV cache from a step"),
])
def test_bad_decoder_kwargs_are_one_line(kwargs: dict[str, object], message: str) -> None:
    """transformers keeps any keyword: a misspelt field would silently build the default-sized model."""
    with pytest.raises(ConfigError) as error:
        decoder(**{"architecture": "llama", "max_cache_len": 8, **kwargs})  # type: ignore[arg-type]
    assert str(error.value).startswith(message), error.value


# Families outside the suite that each need more of the wrapper than the suite's: latent attention
# (keys wider than values, one K/V head) with complex rotary embeddings and an unsorted top-k router
# (DeepSeek-V2), multi-query attention (Falcon), a mask of start + T ones made from the cache's length
# (BioGPT), a cache layer that keeps indexer keys and their length besides keys and values
# (DeepSeek-V3.2), positions through BART's learned embedding of a decoder-only BART, positions from
# numbers read out of the cache's length (TrOCR: computed inside the engine).
HELPED = ("deepseek_v2", "falcon", "biogpt", "deepseek_v32", "bart", "trocr")


@pytest.mark.parametrize("family", suite.DECODERS + HELPED)
def test_every_suite_family_steps_as_transformers_does(family: str) -> None:
    """Any causal-LM type transformers has, by its model type: the decoder (sdpa or eager attention
    as the family allows, experts as gathered batched matmuls, the static cache) gives, for a prompt
    and then decode steps, the logits transformers' own model with its defaults gives for the whole
    sequence without a cache; and a new prompt after them, its own logits."""
    import transformers

    (entry,) = suite.select([f"hf-decoder/{family}"])
    model = objects.model(entry_config(entry))
    lm = model.checkpoint_module  # type: ignore[union-attr]
    reference = transformers.AutoModelForCausalLM.from_config(type(lm.config)(**lm.config.to_dict())).eval()
    reference.load_state_dict(lm.state_dict())
    tokens = torch.randint(0, suite.DECODER_SIZE["vocab_size"], (1, 9), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        want = reference(tokens, use_cache=False).logits
        got = [model.prefill(tokens[:, :6])] + [model.decode(tokens[:, i:i + 1], torch.tensor([i])) for i in range(6, 9)]
        again = model.prefill(tokens[:, 3:7])  # a new prompt: nothing of the last one's state counts
    torch.testing.assert_close(torch.cat(got, dim=1), want, rtol=1e-4, atol=1e-4)
    with torch.no_grad():
        torch.testing.assert_close(again, reference(tokens[:, 3:7], use_cache=False).logits, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("family", (*HELPED, "opt"))
def test_families_that_need_the_wrapper_lower_whole(family: str, tmp_path: Path) -> None:
    """Built as the coverage suite builds a decoder (its tiny size, fp32, on the CPU): prefill and
    decode one engine, nothing left outside (OPT: the length its unused mask of start + T ones read
    from the cache stays out of the program, with the assertions on it)."""
    (entry,) = suite.select([f"hf-decoder/{family}"])
    row = build_row(entry, "fp32", tmp_path)
    assert row["lowered_whole"] and row["engines"] == 2, row


def test_positions_a_family_counts_its_own_way_are_left_to_it(tmp_path: Path) -> None:
    """RoBERTa as a decoder numbers its positions after its padding index: steps given positions from 0
    would be wrong, so the decoder gives it only the mask, and its prompt and decode steps give
    transformers' own logits; it lowers whole like any other family."""
    import transformers

    (entry,) = suite.select(["hf-decoder/roberta"])
    entry.model["kwargs"]["is_decoder"] = True
    model = objects.model(entry_config(entry))
    assert model._given == ("attention_mask",)  # type: ignore[union-attr]
    lm = model.checkpoint_module  # type: ignore[union-attr]
    reference = transformers.AutoModelForCausalLM.from_config(type(lm.config)(**lm.config.to_dict())).eval()
    reference.load_state_dict(lm.state_dict())
    tokens = torch.randint(3, suite.DECODER_SIZE["vocab_size"], (1, 8), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        got = torch.cat([model.prefill(tokens[:, :5])] + [model.decode(tokens[:, i:i + 1], torch.tensor([i]))
                                                          for i in range(5, 8)], dim=1)
        torch.testing.assert_close(got, reference(tokens, use_cache=False).logits, rtol=1e-4, atol=1e-4)
    row = build_row(entry, "fp32", tmp_path)
    assert row["lowered_whole"] and row["engines"] == 2, row


# llama_tiny's engine has a one-token profile for decode besides the whole token range (one engine,
# two profiles: each method's context runs on the narrowest that takes its call); qwen2_tiny's one range.
PROFILES = {"llama_tiny": ["compile.profiles=[{tokens:[1,1,1]}]"], "qwen2_tiny": []}


@pytest.fixture(scope="module", params=MODELS)
def built(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[object, Path]:
    cfg = typed(compose([f"model={request.param}", "cache=off", *PROFILES[request.param]]))
    out = tmp_path_factory.mktemp(request.param)
    steps.run_all(cfg, out)
    return cfg, out


def test_prefill_and_decode_lower_whole_with_the_cache_as_state(built: tuple[object, Path]) -> None:
    cfg, out = built
    report = json.loads((out / "report.json").read_text())
    assert {m: (r["num_engines"], r["left_over"]) for m, r in report.items()} == {"prefill": (1, []), "decode": (1, [])}
    profiles = 1 + len(cfg.compile.profiles)
    assert [e["profiles"] for r in report.values() for e in r["engines"]] == [profiles, profiles]
    kwargs = cfg.model.kwargs
    head_dim = kwargs["hidden_size"] // kwargs["num_attention_heads"]
    cache_bytes = 2 * kwargs["num_hidden_layers"] * kwargs["num_key_value_heads"] * kwargs["max_cache_len"] * head_dim * 4
    program = load(out / "program" / f"{cfg.model.name}.pte", device="cpu")
    (state,) = program.state.values()  # one arena, both methods'
    engines = [e for e in named_entries(program.file) if e["key"].startswith("tensorrt.engine.")]
    assert len(engines) == 1  # prefill and decode call one engine: the weights are stored once
    assert program.constant("max_cache_len") == kwargs["max_cache_len"]  # what generate checks prompts against
    assert cache_bytes <= state.numel() < cache_bytes + 1024
    for method in ("prefill", "decode"):
        exported = torch.export.load(out / "compiled" / f"{method}.pt2")
        (engine,) = [n for n in exported.graph.nodes if n.op == "call_function" and "execute_engine" in str(n.target)]
        fed = {exported.graph_signature.inputs_to_buffers.get(a.name, "") for a in engine.args[0]}
        assert {f"module.model.key_cache_{i}" for i in range(kwargs["num_hidden_layers"])} <= fed, fed
        meta, _ = decode_op_metadata(engine.args[2])  # every K and V cache updated where it lives
        caches = {f"module_model_{kv}_cache_{i}" for kv in ("key", "value") for i in range(kwargs["num_hidden_layers"])}
        assert {b.aliases for b in meta.outputs if b.aliases} == caches, method


@pytest.mark.parametrize("profile, message", [
    ("{tokns:[1,1,1]}", r"^compile.profiles\[0\] names dim 'tokns', which method 'prefill' does not have \(its dims: "
                        r"\['tokens'\]\); name a dim of model.methods.prefill.dims, or give the method its own profiles in "
                        r"compile.per_method.prefill$"),
    ("{tokens:[1,1,100]}", r"^compile.profiles\[0\].tokens = \[1, 1, 100\] is not inside model.methods.prefill.dims.tokens "
                           r"\(1..64\); a profile narrows a dim's range$"),
])
def test_a_bad_profile_is_one_line_before_anything_is_built(profile: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        compose(["model=llama_tiny", f"compile.profiles=[{profile}]"])


@pytest.mark.gpu
@pytest.mark.skipif(not GPU, reason="needs CUDA and TensorRT")
@pytest.mark.parametrize("method_graph", [False, True])
def test_teacher_forced_logits_match_transformers(built: tuple[object, Path], method_graph: bool) -> None:
    """Prefill, then decode steps (each method one CUDA graph when `method_graph`), the cache
    updated in place in the program's state: every step's logits match eager transformers."""
    cfg, out = built
    program = load(out / "program" / f"{cfg.model.name}.pte",
                   options=RuntimeOptions(method_graph=method_graph))
    (state,) = program.state.values()
    where = state.data_ptr()
    assert_teacher_forced(program, objects.model(cfg).cuda(), 256, 16, 8)  # type: ignore[arg-type]
    assert state.data_ptr() == where and len(program._engines) == 1  # in place; one engine on the device


def assert_teacher_forced(program: Any, model: Any, vocab: int, prompt_len: int, steps_: int) -> None:
    """Prefill a prompt, then decode `steps_` given tokens: every step's last logits match the eager
    model's (within fp32 engine tolerance) and pick the same next token."""
    torch.manual_seed(1)
    prompt, follow = torch.randint(0, vocab, (1, prompt_len)).cuda(), torch.randint(0, vocab, (steps_,)).cuda()
    with torch.no_grad():
        got = [program.method("prefill").execute([prompt, torch.tensor([0]).cuda()])[0][:, -1]]
        want = [model.prefill(prompt)[:, -1]]
        for i, token in enumerate(follow):
            position = torch.tensor([prompt_len + i]).cuda()
            got.append(program.method("decode").execute([token.view(1, 1), position])[0][:, -1])
            want.append(model.decode(token.view(1, 1), position)[:, -1])
    for g, w in zip(got, want):
        torch.testing.assert_close(g.float(), w.float(), rtol=2e-3, atol=2e-3 * float(w.abs().max()))
    assert all(bool((g.argmax(-1) == w.argmax(-1)).all()) for g, w in zip(got, want))


@pytest.mark.parametrize("family", suite.DECODERS + HELPED)
def test_a_folder_of_every_suite_family_loads(family: str, tmp_path: Path) -> None:
    """Each decoder family, saved by transformers (`save_pretrained` of the model the suite builds),
    builds from its folder (`model=hf_decoder model.weights=<folder>`, the sizes from its config.json)
    into a decoder that gives the same logits."""
    (entry,) = suite.select([f"hf-decoder/{family}"])
    built = objects.model(entry_config(entry))
    built.checkpoint_module.save_pretrained(tmp_path / family)  # type: ignore[union-attr]
    loaded = objects.model(typed(compose(["model=hf_decoder", f"model.weights={tmp_path / family}",  # type: ignore[arg-type]
                                          f"model.kwargs.max_cache_len={suite.DECODER_CACHE}"])))
    tokens = torch.randint(0, suite.DECODER_SIZE["vocab_size"], (1, 6), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        torch.testing.assert_close(loaded.prefill(tokens), built.prefill(tokens), rtol=0, atol=0)  # type: ignore[operator]


@pytest.mark.gpu
@pytest.mark.skipif(not GPU, reason="needs CUDA and TensorRT")
@pytest.mark.parametrize("family", suite.DECODERS + HELPED)
def test_every_suite_family_teacher_forced_on_the_gpu(family: str, tmp_path: Path) -> None:
    """The coverage suite's decoder families, and the held-out ones that need more of the wrapper,
    each built as the suite builds it (its own tiny config, engines from TensorRT-RTX): lowered whole,
    and teacher-forced logits match eager."""
    (entry,) = suite.select([f"hf-decoder/{family}"])
    row = build_row(entry, "fp32", tmp_path)
    assert row["lowered_whole"], row
    program = load(tmp_path / "program" / f"{entry.model['name']}.pte")
    model = objects.model(entry_config(entry)).cuda()
    assert_teacher_forced(program, model, suite.DECODER_SIZE["vocab_size"], 8, 6)


@pytest.mark.gpu
@pytest.mark.skipif(not GPU, reason="needs CUDA and TensorRT")
def test_generate_on_the_gpu_matches_transformers(built: tuple[object, Path]) -> None:
    cfg, out = built
    model = objects.model(cfg).cuda()  # type: ignore[arg-type]
    prompt = torch.randint(0, 256, (1, 12), generator=torch.Generator().manual_seed(2))
    want = prompt.cuda()
    with torch.no_grad():
        logits = model.prefill(want)
        for _ in range(10):
            token = logits[:, -1].argmax(-1, keepdim=True)
            want = torch.cat([want, token], dim=1)
            logits = model.decode(token, torch.tensor([want.shape[1] - 1]).cuda())
    for method_graph in (False, True):
        program = load(out / "program" / f"{cfg.model.name}.pte",
                       options=RuntimeOptions(method_graph=method_graph))
        assert torch.equal(generate(program, prompt, 10), want.cpu()), method_graph


def test_the_record_bounds_token_ids_and_positions(built: tuple[object, Path]) -> None:
    cfg, out = built
    record = pte.read(out / "program" / f"{cfg.model.name}.pte").record
    cache, vocab = cfg.model.kwargs["max_cache_len"], cfg.model.kwargs["vocab_size"]
    for method in ("prefill", "decode"):
        tokens, start = record.inputs[method]  # type: ignore[union-attr]
        assert (tokens.values, tokens.end) == ((0, vocab - 1), None)
        assert (start.values, start.end) == ((0, cache - 1), (0, 1, cache))  # start + T <= the cache


@pytest.mark.gpu
@pytest.mark.skipif(not GPU, reason="needs CUDA and TensorRT")
def test_out_of_range_ids_and_positions_are_refused_and_the_logits_stay_right(built: tuple[object, Path]) -> None:
    """Measured on the H200 before the check: ids 300, -5 and 10**9 gave finite logits, a start of
    -7 NaN logits and every later call NaN. Now each is refused before anything runs, and the
    teacher-forced logits after them match transformers."""
    cfg, out = built
    model = objects.model(cfg).cuda()  # type: ignore[arg-type]
    program = load(out / "program" / f"{cfg.model.name}.pte")
    prefill, decode = program.method("prefill"), program.method("decode")
    bad = [([[1, 300, 9]], [0]), ([[1, -5, 9]], [0]), ([[10**9]], [0]), ([[1, 2, 3]], [1000]), ([[1]], [-7]),
           ([[1, 2, 3]], [62]), ([[4]], [64])]
    torch.manual_seed(3)
    prompt, follow = torch.randint(0, 256, (1, 16)).cuda(), torch.randint(0, 256, (6,)).cuda()
    with torch.no_grad():
        for tokens, start in bad:
            with pytest.raises(InputError, match="but the program takes values"):
                prefill.execute([torch.tensor(tokens).cuda(), torch.tensor(start).cuda()])
        got = [prefill.execute([prompt, torch.tensor([0]).cuda()])[0][:, -1]]
        want = [model.prefill(prompt)[:, -1]]
        for i, token in enumerate(follow):
            for tokens, start in bad:
                with pytest.raises(InputError):
                    decode.execute([torch.tensor(tokens).cuda(), torch.tensor(start).cuda()])
            position = torch.tensor([16 + i]).cuda()
            got.append(decode.execute([token.view(1, 1), position])[0][:, -1])
            want.append(model.decode(token.view(1, 1), position)[:, -1])
    for g, w in zip(got, want):
        assert bool(torch.isfinite(g).all())
        torch.testing.assert_close(g.float(), w.float(), rtol=2e-3, atol=2e-3 * float(w.abs().max()))
