"""Multimodal and speech benchmark (GPU): a program of `model=image_text_decoder` (Gemma 3),
`model=audio_text_decoder` (Voxtral) or `model=parakeet` (Parakeet CTC, its encoder alone), built by
the pipeline from a model folder of random weights that transformers saved (fp16), against eager
`transformers` and `torch.compile` on the same weights.

Per variant: the encoder's latency (one image, or one 30 s window: median and p90 of timed calls,
`bench.benchmark.timed`), and decode tokens/s after a prompt (`bench.llm.tokens_per_s`: a step, the
argmax on the device, one token read back); for our program also the teacher-forced error of its text
decoder against eager `transformers` (`bench.llm.teacher_forced`). The sizes are the families' own
encoders (Gemma 3's SigLIP at 896 px; Voxtral Mini's Whisper-large encoder, fewer layers) before a
text decoder of fewer layers and a smaller vocabulary than the released models (so that a build takes
about a minute); Parakeet's are parakeet-ctc-0.6b's (transformers' defaults), on 30 s of features, its
CTC logits' error against eager `transformers` reported. Prints JSON rows; `--out` writes
`media-<family>.json`.

    python -m bench.media --family gemma3 --out results/
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from bench.benchmark import Timing, Variant, _row, rel_error, timed
from bench.llm import guarded, teacher_forced, tokens_per_s
from pipeline.config import objects
from pipeline.config.compose import compose, typed
from pipeline.runtime import load
from pipeline.runtime.options import RuntimeOptions
from pipeline.steps import run_all

TEXT = {"vocab_size": 32768, "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 8,
        "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128, "max_position_embeddings": 4096}
FAMILIES: dict[str, dict[str, Any]] = {
    "gemma3": {"config": "image_text_decoder", "encoder": "vision_encoder", "item": (1, 3, 896, 896),
               "vision": {"hidden_size": 1152, "intermediate_size": 4304, "num_hidden_layers": 27,
                          "num_attention_heads": 16, "image_size": 896, "patch_size": 14},
               "text": {**TEXT, "sliding_window": 512, "layer_types": ["sliding_attention"] * 5 + ["full_attention"] * 3}},
    "voxtral": {"config": "audio_text_decoder", "encoder": "audio_encoder", "item": (1, 128, 3000),
                "audio": {"hidden_size": 1280, "intermediate_size": 5120, "num_hidden_layers": 8,
                          "num_attention_heads": 20, "num_mel_bins": 128, "max_source_positions": 1500},
                "text": {**TEXT, "model_type": "llama"}},
    "parakeet": {"config": "parakeet", "encoder": "encoder", "item": (1, 3000, 80)},  # 30 s of 80 mels
}


def folder(family: str, path: Path) -> Path:
    """A model folder of random fp16 weights of the family's benchmark sizes, as save_pretrained writes it."""
    import transformers

    sizes = FAMILIES[family]
    torch.manual_seed(0)
    if family == "gemma3":
        config = transformers.Gemma3Config(text_config=sizes["text"], vision_config=sizes["vision"], mm_tokens_per_image=256,
                                           image_token_id=262, boi_token_index=261, eoi_token_index=263)
        model = transformers.Gemma3ForConditionalGeneration(config)
    elif family == "voxtral":
        config = transformers.VoxtralConfig(audio_config=sizes["audio"], text_config=sizes["text"], audio_token_id=24)
        model = transformers.VoxtralForConditionalGeneration(config)
    else:
        model = transformers.ParakeetForCTC(transformers.ParakeetCTCConfig())
    model.to(torch.float16).save_pretrained(path)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--family", choices=sorted(FAMILIES), default="gemma3")
    parser.add_argument("--prompt", type=int, default=128, help="prompt length before the decode steps")
    parser.add_argument("--steps", type=int, default=64, help="decode steps timed, and teacher-forced")
    parser.add_argument("--no-compile", action="store_true", help="skip the torch.compile baselines")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench/media.py needs a CUDA GPU")
    spec = FAMILIES[args.family]
    work = Path(tempfile.mkdtemp())
    shape = list(spec["item"])
    speech = "text" not in spec  # an encoder alone
    overrides = [f"model={spec['config']}", f"model.weights={folder(args.family, work / 'folder')}", "compile=fp16",
                 "cache=off", f"model.methods.{spec['encoder']}.inputs.0.shape={shape}",
                 *([] if speech else [f"model.kwargs.max_cache_len={args.prompt + args.steps + 16}"])]
    results: dict[str, Any] = {"command": f"python -m bench.media --family {args.family}", "date": time.strftime("%Y-%m-%d"),
                               "family": args.family, "gpu": torch.cuda.get_device_name(), "config": overrides[:1] + overrides[2:]}
    start = time.perf_counter()
    files = run_all(typed(compose(overrides)), work / "build")  # type: ignore[arg-type]
    results["build_s"] = round(time.perf_counter() - start, 1)
    results["pte_GB"] = round(files["pte"].stat().st_size / 1e9, 3)
    model: Any = objects.model(typed(compose(overrides)))  # type: ignore[arg-type]
    results["parameters_M"] = round(sum(p.numel() for p in model.parameters()) / 1e6, 1)
    program = load(files["pte"], options=RuntimeOptions(method_graph=True))
    model.cuda()
    item = torch.randn(*shape, generator=torch.Generator().manual_seed(1)).cuda()
    second = torch.ones(shape[:2], dtype=torch.int64, device="cuda") if speech else torch.zeros(1, dtype=torch.int64, device="cuda")
    encoder = program.method(spec["encoder"])  # (features, mask) for speech, else (item, slot)
    eager_encoder = getattr(model, spec["encoder"])
    half = item.half()
    variants = [Variant("ours (method graph)", lambda: encoder.execute([item, second], copy_outputs=False), encoder.stream),
                Variant("eager transformers", lambda: eager_encoder(half, second))]
    if not args.no_compile:
        compiled_encoder = torch.compile(eager_encoder, mode="reduce-overhead")
        variants.append(Variant("torch.compile (CUDA graphs)", lambda: compiled_encoder(half, second)))
    with torch.no_grad():
        guarded(results, "encoder", lambda: (timed(variants, Timing(iters=30, warmup=5, block=10)),
                                             [{"variant": v.name, **_row(v)} for v in variants])[1])
        if speech:
            guarded(results, "encoder_max_rel_err", lambda: rel_error(encoder.execute([item, second]),
                                                                      eager_encoder(half, second)))
    if not speech:
        results["decode"] = _decode(args, program, model, results)
    print(json.dumps(results, indent=1))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / f"media-{args.family}.json").write_text(json.dumps(results, indent=1) + "\n")


def _decode(args: argparse.Namespace, program: Any, model: Any, results: dict[str, Any]) -> list[dict[str, Any]]:
    """Decode tokens/s of our text decoder, eager transformers and torch.compile; the teacher-forced error."""
    decoder = program.method("text_decoder")
    vocab = int(TEXT["vocab_size"])
    token = torch.zeros(1, 1, dtype=torch.int64, device="cuda")
    position = torch.zeros(1, dtype=torch.int64, device="cuda")
    steps: dict[str, Any] = {"ours (method graph)": lambda t, s: decoder.execute([t, s], copy_outputs=False)[0],
                             "eager transformers": model.step}
    if not args.no_compile:
        for name, buffer in model.named_buffers():
            if "cache" in name or name == "media":
                torch._dynamo.mark_static_address(buffer)
        steps["torch.compile (static cache, CUDA graphs)"] = torch.compile(model.step, mode="reduce-overhead", dynamic=False)
    rows = []
    with torch.no_grad():
        for name, step in steps.items():
            row: dict[str, Any] = {"variant": name}
            guarded(row, "decode_tok_s", lambda s=step: tokens_per_s(s, token, position, args.prompt, args.steps))
            rows.append(row)
        guarded(results, "teacher_forced", lambda: teacher_forced(steps["ours (method graph)"], model.step, args.prompt,
                                                                  args.steps, vocab))
    return rows


if __name__ == "__main__":
    main()
