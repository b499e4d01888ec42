"""Quantized programs against the float one: per `compile.quantize.mode`, the engine bytes (built on
any machine) and, on a GPU, each method's error against eager PyTorch in float (the validate step's
largest error relative to the outputs' range), the agreement of the top-1 entry of the last output dim
(a decoder's next token), the error against eager PyTorch with the weights rounded as the engine stores
them (what tells a wrong engine from quantization's own error) and the median call. Prints markdown;
`--out` also writes `quantized.json`.

    python -m bench.quantized --set model=llama_tiny compile=fp16 --build build/quantized        # build and measure
    python -m bench.quantized --set model=llama_tiny compile=fp16 --build build/quantized --built # measure what is there
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import torch

from pipeline.config import objects
from pipeline.config.compose import compose, typed
from pipeline.engine import quantize
from pipeline.engine.compile_spec import QUANTIZE_MODES, QuantizeSpec
from pipeline.runtime.program import load
from pipeline.steps import run_all
from pipeline.steps.validate import validate_program


def measure(overrides: list[str], mode: str, build: Path, built: bool) -> dict[str, Any]:
    """One mode's row: engine bytes, and on a GPU error, top-1 agreement and median call per method."""
    cfg: Any = typed(compose([*overrides, f"compile.quantize.mode={mode}"]))
    folder = build / mode
    if not built:
        run_all(cfg, folder)
    report = json.loads((folder / "report.json").read_text())
    engines = {e["engine_key"]: e for m in report.values() for e in m["engines"]}
    row: dict[str, Any] = {"mode": mode, "engine_bytes": sum(e["engine_bytes"] for e in engines.values()),
                           "quantized": [e.get("quantized") for e in engines.values()]}
    if not torch.cuda.is_available():
        return row
    pte = next((folder / "program").glob("*.pte"))
    ptd = next((folder / "program").glob("*.ptd"), None)
    row["methods"] = validate_program(cfg, pte, ptd)["methods"]
    model, program = objects.model(cfg), load(pte, ptd)
    rounded = rounded_model(objects.model(cfg), QuantizeSpec.of(cfg.compile.quantize))
    seed = cfg.runtime.validation_seed
    for name, spec in cfg.model.methods.items():
        inputs = objects.example_inputs(spec, seed)
        function = spec.function
        with torch.no_grad():
            want = torch.utils._pytree.tree_leaves(getattr(model, function)(*inputs))[0].float()
            simulated = torch.utils._pytree.tree_leaves(getattr(rounded, function)(*inputs))[0].float()
        got = program.method(name).execute(list(inputs))[0].cpu().float()
        row["methods"][name]["top1_agreement"] = float((got.argmax(-1) == want.argmax(-1)).float().mean())
        row["methods"][name]["rel_error_vs_rounded"] = float((got - simulated).abs().max() / simulated.abs().max())
        row["methods"][name]["rounded_rel_error_vs_float"] = float((simulated - want).abs().max() / want.abs().max())
    return row


def rounded_model(model: torch.nn.Module, spec: QuantizeSpec) -> torch.nn.Module:
    """`model` with the weights of its Linear and Embedding layers (those `spec` takes and does not keep)
    rounded as an engine stores them: the engine's result without its own error."""
    if not spec.active:
        return model
    layers = {torch.nn.Linear: "linear", torch.nn.Embedding: "embedding"}
    for module_name, module in model.named_modules():
        layer = layers.get(type(module))
        if layer not in spec.layers or quantize.kept(f"{module_name}.weight", spec):
            continue
        scheme = quantize.scheme(spec, quantize.SLOTS_BY_LAYER[layer], f"{module_name}.weight")
        with torch.no_grad():
            module.weight.copy_(quantize.simulated(module.weight, scheme))
    return model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--set", nargs="*", default=["model=llama_tiny", "compile=fp16"], help="Hydra overrides of the build")
    parser.add_argument("--modes", nargs="*", default=list(QUANTIZE_MODES), choices=list(QUANTIZE_MODES))
    parser.add_argument("--build", type=Path, default=Path("build/quantized"), help="a folder per mode")
    parser.add_argument("--built", action="store_true", help="measure the programs already in --build")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    rows = [measure(args.set, mode, args.build, args.built) for mode in args.modes]
    base = rows[0]["engine_bytes"]
    print("| mode | engine bytes | vs first | method | max rel error | top-1 agreement | vs rounded weights | median ms |")
    print("|---|---|---|---|---|---|---|---|")
    for row in rows:
        for name, m in (row.get("methods") or {"-": {}}).items():
            print(f"| {row['mode']} | {row['engine_bytes']:,} | {row['engine_bytes'] / base:.3f}x | {name} | "
                  f"{m.get('max_rel_error', '-')} | {m.get('top1_agreement', '-')} | {m.get('rel_error_vs_rounded', '-')} | "
                  f"{m.get('median_ms', '-')} |")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "quantized.json").write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
