"""LLM benchmark (GPU): a decoder built by the pipeline (default: the TinyLlama-sized Llama, about
1.1 B parameters, fp16, batch 1: `+experiment=llm_fp16`) against eager `transformers` and
`transformers` under `torch.compile` (static cache, CUDA graphs), on the same seeded weights.

Per variant: prefill latency (one call of 128 and of 512 tokens) and decode tokens/s (greedy steps:
a step, the argmax on the device, one token read back), with decode's physical limit (weight bytes /
memory bandwidth, at the GPU's rated bandwidth and at the one a device copy reaches here) and each
variant's fraction of it. For our program also: device memory it takes (against weights + cache),
bytes copied and kernels launched per decode step (from the CUDA profiler: the cache is updated
where it lives, so a step copies no cache), what the check of a step's token and position against
the program's bounds costs, and teacher-forced correctness (logits of decode steps
after a prompt, against eager `transformers`: the largest error relative to the logits' range,
and top-1 agreement; a quantized program also against the model with its weights rounded as the
program stores them, which separates the program's error from quantization's own), and with the
project's decode kernels the bandwidth they reached. The Python-free runner (`pipeline-runner
generate`: ExecuTorch's C++ runtime and the native delegate, with and without TensorRT-RTX's CUDA
graph) gets decode tokens/s, the bytes its delegate copied per step, and whether its greedy tokens
are pipeline.runtime's. Prints markdown; `--out` also writes `llm.json` and `llm.md`.

    python -m bench.llm                                   # TinyLlama-sized, fp16
    python -m bench.llm --set model=llama_tiny model.kwargs.max_cache_len=256 --prompt 128 --steps 64
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from bench.benchmark import kernel_profile
from bench.quantized import rounded_model
from pipeline.config import objects
from pipeline.config.compose import compose, typed
from pipeline.delegate import plan, pte
from pipeline.delegate.tensor_spec import check_inputs
from pipeline.engine.compile_spec import QuantizeSpec
from pipeline.runtime import load
from pipeline.runtime.generate import generate
from pipeline.runtime.native_library import run_runner
from pipeline.runtime.options import RuntimeOptions
from pipeline.steps import run_all

RATED_GBS = {"H200": 4800.0, "H100": 3350.0}  # HBM bandwidth, GB/s (NVIDIA's data sheets; H100 SXM)
Step = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (tokens [1, T], start [1]) -> logits


def measured_bandwidth_gbs(gib: int = 2) -> float:
    """GB/s a device-to-device copy reaches (bytes read + written over its time)."""
    src = torch.empty(gib << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    begin.record()
    for _ in range(10):
        dst.copy_(src)
    end.record()
    end.synchronize()
    seconds = begin.elapsed_time(end) / 1e3 / 10
    del src, dst
    torch.cuda.empty_cache()
    return 2 * (gib << 30) / seconds / 1e9


def prefill_ms(step: Step, tokens: int, vocab: int, reps: int = 10) -> float:
    """Median milliseconds of one prefill call of `tokens` tokens (synced, CUDA events)."""
    prompt = torch.randint(0, vocab, (1, tokens), device="cuda")
    start = torch.zeros(1, dtype=torch.int64, device="cuda")
    times = []
    for i in range(reps + 3):
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        step(prompt, start)
        end.record()
        end.synchronize()
        if i >= 3:
            times.append(begin.elapsed_time(end))
    return statistics.median(times)


def decode_loop(step: Step, token: torch.Tensor, position: torch.Tensor, first: int, steps: int) -> float:
    """Seconds for `steps` greedy decode steps from position `first` (each: a step, the argmax
    into `token` on the device, the position moved on, the token read back)."""
    position.fill_(first)
    torch.cuda.synchronize()
    begin = time.perf_counter()
    for _ in range(steps):
        logits = step(token, position)
        torch.argmax(logits[:, -1], dim=-1, keepdim=True, out=token)
        position += 1
        int(token.item())
    return time.perf_counter() - begin


def tokens_per_s(step: Step, token: torch.Tensor, position: torch.Tensor, first: int, steps: int) -> float:
    decode_loop(step, token, position, first, 8)  # warm-up (captures graphs, compiles kernels)
    return statistics.median(steps / decode_loop(step, token, position, first, steps) for _ in range(3))


def profile_step(step: Step, token: torch.Tensor, position: torch.Tensor, first: int, steps: int = 8) -> dict[str, Any]:
    """Per decode step: bytes moved by copies (memcpy and memset), kernels and graph launches, the
    kernels' summed time, and the kernels that take most of it (where a step's time goes)."""
    decode_loop(step, token, position, first, 4)
    return kernel_profile(lambda: decode_loop(step, token, position, first, steps), steps)


def profile_prefill(prefill: Step, tokens: int, vocab: int, calls: int = 4) -> dict[str, Any]:
    """The same per prefill call of `tokens` tokens."""
    prompt = torch.randint(0, vocab, (1, tokens), device="cuda")
    start = torch.zeros(1, dtype=torch.int64, device="cuda")

    def run() -> None:
        for _ in range(calls):
            prefill(prompt, start)
        torch.cuda.synchronize()

    run()
    return kernel_profile(run, calls)


def teacher_forced(step: Step, reference: Step, prompt_len: int, steps: int, vocab: int) -> dict[str, float]:
    """Prefill a prompt, then `steps` decode steps fed the given tokens (not the predicted ones):
    the largest |ours - reference| over the reference logits' largest magnitude, and how often the
    two argmaxes agree (prefill's last position and every decode step)."""
    generator = torch.Generator().manual_seed(7)
    prompt = torch.randint(0, vocab, (1, prompt_len), generator=generator).cuda()
    follow = torch.randint(0, vocab, (steps,), generator=generator).cuda()
    zero = torch.zeros(1, dtype=torch.int64, device="cuda")
    errors, agree = [], []
    with torch.no_grad():
        pairs = [(step(prompt, zero)[:, -1].float().clone(), reference(prompt, zero)[:, -1].float())]
        for i, token in enumerate(follow):
            position = torch.tensor([prompt_len + i], device="cuda")
            pairs.append((step(token.view(1, 1), position)[:, -1].float().clone(),
                          reference(token.view(1, 1), position)[:, -1].float()))
    for got, want in pairs:
        errors.append(float((got - want).abs().max() / want.abs().max()))
        agree.append(bool((got.argmax(-1) == want.argmax(-1)).all()))
    return {"max_rel_error": max(errors), "median_rel_error": statistics.median(errors),
            "top1_agreement": sum(agree) / len(agree), "positions": len(agree)}


def ours(program: Any) -> tuple[Step, Step, torch.Tensor, torch.Tensor]:
    """Prefill and decode calls of a loaded program, and decode's own input buffers (as `generate`)."""
    prefill, decode = program.method("prefill"), program.method("decode")
    token, position = decode.input_buffer(0, (1, 1)), decode.input_buffer(1, (1,))
    token = torch.zeros(1, 1, dtype=torch.int64, device="cuda") if token is None else token
    position = torch.zeros(1, dtype=torch.int64, device="cuda") if position is None else position
    return (lambda t, s: prefill.execute([t, s], copy_outputs=False)[0],
            lambda t, s: decode.execute([t, s], copy_outputs=False)[0], token, position)


def kernel_bytes_per_step(files: dict[str, Path]) -> int:
    """Bytes decode's steps in the project's kernels read a call (their packed weights, scales and biases,
    from the plan's named data); 0 for a program without them."""
    program = pte.load_program(files["pte"])  # the plans' records name their data's sizes: no .ptd read
    plans = [plan.decode(c.payload) for c in pte.delegate_calls(program) if c.method == "decode" and plan.is_plan(c.payload)]
    return sum(ref.size for p in plans for s in p.steps if isinstance(s, plan.KernelStep)
               for ref in (s.weight, s.scales, s.bias) if ref is not None)


def value_check_us(method: Any, token: torch.Tensor, position: torch.Tensor, calls: int = 200) -> float:
    """Microseconds the runtime's value check of a decode call's inputs takes (token ids and the
    position against the bounds in the program's record: one read back from the device)."""
    for _ in range(10):
        check_inputs("decode", method._specs, [token, position])
    begin = time.perf_counter()
    for _ in range(calls):
        check_inputs("decode", method._specs, [token, position])
    return (time.perf_counter() - begin) / calls * 1e6


RUNNER_VARIANTS = {  # name (--runner): row label, pipeline-runner's flags
    "plain": ("", []),
    "cuda-graph": (", TensorRT-RTX CUDA graph", ["--cuda-graph"]),
    "eager-kernels": (", eager kernels", ["--kernels", "eager"]),
    "method-graph": (", method graph", ["--method-graph"]),
}


def runner_rows(files: dict[str, Path], program: Any, vocab: int, prompt_len: int, steps: int,
                names: list[str]) -> list[dict[str, Any]]:
    """The runner's rows, one per `RUNNER_VARIANTS` entry in `names` (`runner_decode`)."""
    rows = []
    for label, flags in (RUNNER_VARIANTS[name] for name in names):
        row = {"variant": "pipeline-runner (ExecuTorch C++ runtime, native delegate)" + label}
        guarded(row, "decode_tok_s", lambda f=flags, r=row: runner_decode(files, program, vocab, prompt_len, steps, f, r))
        rows.append(row)
    return rows


def runner_decode(files: dict[str, Path], program: Any, vocab: int, prompt_len: int, steps: int, flags: list[str],
                  row: dict[str, Any]) -> float:
    """Greedy decode tokens/s of the Python-free runner (`pipeline-runner generate` with `flags`) after a
    prompt of `prompt_len` tokens; `row` also gets the bytes its delegate copied per decode step and
    whether its tokens are the ones `pipeline.runtime` generates from the same prompt."""
    prompt = [(7 * i + 3) % vocab for i in range(prompt_len)]
    args: list[object] = ["generate", files["pte"], "--prompt", " ".join(map(str, prompt)), "--max-new-tokens", steps + 2]
    args += ["--ptd", files["ptd"]] if "ptd" in files else []
    done = run_runner(*args, *flags)
    if done.returncode != 0:
        raise RuntimeError(f"pipeline-runner failed: {done.stderr.strip()}")
    tokens = [int(t) for t in done.stdout.splitlines()[0].split()]
    found = re.search(r"\(([0-9.]+) tokens/s\); per step the delegate copied ([0-9]+) bytes in and ([0-9]+) out", done.stdout)
    assert found is not None, done.stdout + done.stderr
    row["per_step"] = {"copied_bytes_in": int(found.group(2)), "copied_bytes_out": int(found.group(3))}
    ours = generate(program, torch.tensor([prompt]), steps + 2)[0, prompt_len:].tolist()
    row["same_greedy_tokens_as_pipeline_runtime"] = f"{sum(a == b for a, b in zip(tokens, ours))} of {len(ours)}"
    return float(found.group(1))


def guarded(results: dict[str, Any], name: str, fn: Callable[[], Any]) -> None:
    """Run one measurement; a failure is recorded under its name and the rest go on."""
    try:
        results[name] = fn()
    except Exception as exc:  # one broken variant must not cost the others' numbers
        results[name] = {"error": f"{type(exc).__name__}: {exc}"}
        traceback.print_exc()
    print(name, json.dumps(results[name]), flush=True)


def measure(name: str, variant: tuple[Step, Step, torch.Tensor, torch.Tensor], args: argparse.Namespace, vocab: int,
            limits: dict[str, float], references: dict[str, Step], kernel_bytes: int = 0) -> dict[str, Any]:
    """One variant's row: prefill ms, decode tok/s (and its fraction of each limit); for compiled
    variants the per-step profile (and for ours the bandwidth its kernels reached reading their
    `kernel_bytes` a step); for ours the teacher-forced error against each of `references`
    (`teacher_forced` against the float model, `teacher_forced_vs_<name>` against the others)."""
    prefill, decode, token, position = variant
    row: dict[str, Any] = {"variant": name}
    for length in args.prefill:
        guarded(row, f"prefill_{length}_ms", lambda n=length: prefill_ms(prefill, n, vocab))
    guarded(row, "decode_tok_s", lambda: tokens_per_s(decode, token, position, args.prompt, args.steps))
    for k, limit in limits.items():
        if isinstance(row["decode_tok_s"], float):
            row[f"fraction_of_{k}_limit"] = row["decode_tok_s"] / limit
    if not name.startswith("eager"):
        guarded(row, "per_step", lambda: profile_step(decode, token, position, args.prompt))
        if name.startswith("ours") and kernel_bytes:  # the bandwidth our product kernels reached
            ours_us = row["per_step"].get("kernel_us_per_step_by_class", {}).get("products (ours)")
            if ours_us:
                row["products_ours_GBs"] = kernel_bytes / ours_us / 1e3
        guarded(row, f"per_prefill_{max(args.prefill)}", lambda: profile_prefill(prefill, max(args.prefill), vocab))
    if name.startswith("ours"):
        for label, reference in references.items():
            guarded(row, "teacher_forced" + (f"_vs_{label}" if label != "float" else ""), lambda r=reference: teacher_forced(
                lambda t, s: (prefill if t.shape[1] > 1 else decode)(t, s), r, args.prompt, args.steps, vocab))
    return row


def _arguments() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--set", nargs="*", default=["+experiment=llm_fp16"], help="Hydra overrides of the build")
    parser.add_argument("--prefill", nargs="*", type=int, default=[128, 512], help="prompt lengths timed")
    parser.add_argument("--steps", type=int, default=64, help="decode steps timed, and teacher-forced")
    parser.add_argument("--prompt", type=int, default=128, help="prompt length before the decode steps")
    parser.add_argument("--no-compile", action="store_true", help="skip the torch.compile baseline")
    parser.add_argument("--no-stepwise", action="store_true", help="skip our program run engine graph by engine graph")
    parser.add_argument("--runner", nargs="*", default=list(RUNNER_VARIANTS), choices=list(RUNNER_VARIANTS),
                        help="the runner's rows (default: all)")
    parser.add_argument("--build", type=Path, default=None, help="build folder (default: a temporary one)")
    parser.add_argument("--built", action="store_true", help="measure the program already in --build (no build)")
    parser.add_argument("--baselines-only", action="store_true", help="time eager transformers and torch.compile alone "
                        "(no program: while one builds elsewhere)")
    parser.add_argument("--out", type=Path, default=None)
    return parser


def _program_files(args: argparse.Namespace, cfg: Any, results: dict[str, Any]) -> dict[str, Path]:
    """The program's files: built now (what `dvc repro` runs), or already in `--build` with `--built`."""
    start = time.perf_counter()
    if args.built:
        files = {p.suffix[1:]: p for p in (args.build / "program").iterdir() if p.suffix in (".pte", ".ptd")}
    else:
        files = run_all(cfg, args.build or Path(tempfile.mkdtemp()))
        results["build_s"] = round(time.perf_counter() - start, 1)
    results["files_GB"] = {k: round(Path(v).stat().st_size / 1e9, 3) for k, v in files.items()}
    print("built", results.get("build_s"), results["files_GB"], flush=True)
    return files


def _variants(args: argparse.Namespace, files: dict[str, Path], model: Any,
              results: dict[str, Any]) -> tuple[Any, dict[str, tuple[Step, Step, torch.Tensor, torch.Tensor]]]:
    """Our program (with the device memory it takes) and the rows it is timed against."""
    if args.baselines_only:
        return None, _baselines(args, model)
    torch.cuda.synchronize()
    free_before = torch.cuda.mem_get_info()[0]
    variants: dict[str, tuple[Step, Step, torch.Tensor, torch.Tensor]] = {}
    program = load(files["pte"], files.get("ptd"), options=RuntimeOptions(method_graph=True))
    variants["ours (method graph)"] = ours(program)
    prefill, decode, token, position = variants["ours (method graph)"]
    prefill(torch.zeros(1, 8, dtype=torch.int64, device="cuda"), torch.zeros(1, dtype=torch.int64, device="cuda"))
    decode(token, position)  # each method's execution context is made at its first call: both counted
    torch.cuda.synchronize()
    results["ours_device_GB"] = (free_before - torch.cuda.mem_get_info()[0]) / 1e9
    results["engines_on_device"] = len(program._engines)
    guarded(results, "decode_value_check_us", lambda: value_check_us(program.method("decode"), token, position))
    results["kernel_bytes_per_step"] = kernel_bytes_per_step(files)
    if not args.no_stepwise:
        stepwise = load(files["pte"], files.get("ptd"), options=RuntimeOptions(cuda_graph=True))
        variants["ours (engine graphs, step by step)"] = ours(stepwise)
    return program, {**variants, **_baselines(args, model)}


def _baselines(args: argparse.Namespace, model: Any) -> dict[str, tuple[Step, Step, torch.Tensor, torch.Tensor]]:
    """Eager `transformers` and, unless --no-compile, `torch.compile` of the same model on the GPU."""
    variants: dict[str, tuple[Step, Step, torch.Tensor, torch.Tensor]] = {}
    model.cuda()  # in place, after the program's memory was measured
    variants["eager transformers"] = (model.step, model.step, torch.zeros(1, 1, dtype=torch.int64, device="cuda"),
                                      torch.zeros(1, dtype=torch.int64, device="cuda"))
    if not args.no_compile:
        for name, buffer in model.named_buffers():
            if "cache" in name:  # moved to the GPU: new tensors, which CUDA graphs must see as fixed
                torch._dynamo.mark_static_address(buffer)
        compiled = torch.compile(model.step, mode="reduce-overhead", dynamic=False)
        variants["torch.compile (static cache, CUDA graphs)"] = (
            compiled, compiled, torch.zeros(1, 1, dtype=torch.int64, device="cuda"),
            torch.zeros(1, dtype=torch.int64, device="cuda"))
    return variants


def main() -> None:
    args = _arguments().parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench/llm.py needs a CUDA GPU")
    cfg = typed(compose(list(args.set)))
    vocab = int(cfg.model.kwargs["vocab_size"])
    results: dict[str, Any] = {"config": args.set, "gpu": torch.cuda.get_device_name()}
    files = {} if args.baselines_only else _program_files(args, cfg, results)
    model: Any = objects.model(cfg)
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    cache_bytes = sum(b.numel() * b.element_size() for n, b in model.named_buffers() if "cache" in n)
    results["weights_GB"], results["cache_GB"] = weight_bytes / 1e9, cache_bytes / 1e9
    program, variants = _variants(args, files, model, results)
    rated = next((v for k, v in RATED_GBS.items() if k in results["gpu"]), None)
    guarded(results, "bandwidth_GBs", lambda: {"rated": rated, "measured_copy": measured_bandwidth_gbs()})
    limits = {k: v * 1e9 / weight_bytes for k, v in results["bandwidth_GBs"].items() if isinstance(v, float)}
    results["decode_limit_tok_s"] = limits
    references = {"float": model.step}
    spec = QuantizeSpec.of(cfg.compile.quantize)
    if spec.active:  # the same seeded weights, rounded as the program stores them
        references["rounded"] = rounded_model(objects.model(cfg), spec).cuda().step
    with torch.no_grad():
        rows = [measure(name, variant, args, vocab, limits, references, results.get("kernel_bytes_per_step", 0))
                for name, variant in variants.items()]
    results["rows"] = rows + (runner_rows(files, program, vocab, args.prompt, args.steps, args.runner) if program else [])
    table = markdown(results)
    print(table)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "llm.json").write_text(json.dumps(results, indent=1))
        (args.out / "llm.md").write_text(table + "\n")


def markdown(results: dict[str, Any]) -> str:
    ours = (f"; our program on the device {results['ours_device_GB']:.3f} GB ({results['engines_on_device']} engine)"
            if "ours_device_GB" in results else "")
    lines = [f"{results['gpu']}, {' '.join(results['config'])}: weights {results['weights_GB']:.3f} GB, cache "
             f"{results['cache_GB']:.3f} GB{ours}; decode limit (tok/s) {results['decode_limit_tok_s']}", "",
             "| variant | " + " | ".join(c for c in _columns(results)) + " |", "|---|" + "---|" * len(_columns(results))]
    for row in results["rows"]:
        cells = []
        for c in _columns(results):
            v = row.get(c, "")
            if isinstance(v, dict):  # the kernel breakdown stays in llm.json
                v = {k: x for k, x in v.items() if not k.startswith("top_")}
            cells.append(f"{v:.3f}" if isinstance(v, float) else json.dumps(v) if isinstance(v, dict) else str(v))
        lines.append(f"| {row['variant']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _columns(results: dict[str, Any]) -> list[str]:
    seen: dict[str, None] = {}
    for row in results["rows"]:
        for k in row:
            if k != "variant":
                seen.setdefault(k)
    return list(seen)


if __name__ == "__main__":
    main()
