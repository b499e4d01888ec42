"""The docs' figures from the results: each block of a page in `docs/` between `<!-- figures: NAME -->`
and `<!-- /figures -->` is what `RENDER[NAME]` writes from its results file, so the two cannot drift;
every other figure on `docs/performance.md` must be one the results log (`results/gpu-log.md`) or a
results file holds, at the precision the page gives it (`untraced`).

    python -m bench.figures           # rewrite the blocks from the results
    python -m bench.figures --check   # exit 1 naming each block or figure that is not the results'
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
RESULTS = ROOT / "results"
BLOCK = re.compile(r"(<!-- figures: (?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- /figures -->)", re.S)
NUMBER = re.compile(r"(?<![\w.])\d[\d,]*(?:\.\d+)?(?!\w)")


def _dvc_build(r: dict[str, Any]) -> str:
    models = r["models"]
    noop = r["noop"]

    def model(name: str, label: str) -> str:
        m = models[name]
        return f"{label} {m['dvc_s']:.1f} s against {m['in_process_s']:.1f} s ({m['ratio']:.2f}x)"

    stages = models["mlp"]["stages"]
    heavy = [s for s in ("compile", "export", "serialize", "validate") if s in stages]
    own = ", ".join(f"{s} {stages[s]['own_interpreter_s']:.1f}" for s in heavy)
    warm = ", ".join(f"{s} {stages[s]['wall_s']:.1f}" for s in heavy)
    return (f"The DVC loop against the in-process build (`{r['command']}`, {r['machine']}, engine cache off, "
            f"{r['date']}): {model('mlp', 'the MLP')}, {model('resnet18', 'ResNet-18')}; a no-op `dvc repro` "
            f"{noop['noop_s']:.2f} s against `dvc status`'s {noop['status_s']:.2f} s ({noop['ratio']:.2f}x), and "
            f"{noop['toolchain_cp_s']:.2f} s ({noop['toolchain_cp_s'] / noop['status_s']:.2f}x) with the always-run "
            "`toolchain` stage's command a bare `cp` of its record. "
            f"Each heavy stage of the MLP run by itself, in an interpreter of its own: {own} s; as DVC runs it, "
            f"in a fork of the warm stage server: {warm} s.\n")


def _reference_gpu(r: dict[str, Any]) -> str:
    rows = r["rows"]

    def worst(precision: str) -> str:
        row = max((x for x in rows if x["precision"] == precision), key=lambda x: x["tensorrt_error"])
        return f"{precision} {row['tensorrt_error']:.1e} ({row['model']})"

    lines = [f"TensorRT's kernels against the CPU reference executor, engine by engine, on the same inputs "
             f"(`{r['command']}`; {r['machine']}, TensorRT-RTX {r['tensorrt_rtx']}, torch {r['torch']}, {r['date']}; "
             f"{r.get('tests', '')}; {r.get('tf32', '')}): largest relative error {worst('fp32')}, {worst('fp16')}.", "",
             "| model | precision | engines | TensorRT against the reference | the reference against eager |",
             "|---|---|---|---|---|"]
    lines += [f"| {x['model']} | {x['precision']} | {x['engines']} | {x['tensorrt_error']:.1e} | "
              f"{x['reference_error']:.1e} |" for x in rows]
    return "\n".join(lines) + "\n"


def _media(r: dict[str, Any]) -> str:
    encoder = {x["variant"]: x for x in r["encoder"]}
    decode = {x["variant"]: x["decode_tok_s"] for x in r["decode"]}
    ours, compiled = "ours (method graph)", next(k for k in decode if k.startswith("torch.compile"))
    tf = r["teacher_forced"]
    lines = [f"{r['family']} (`{r['command']}`; {r['machine']}, {r['date']}; random fp16 weights, {r['parameters_M']:.0f} M "
             f"parameters, built in {r['build_s']:.0f} s, `.pte` {r['pte_GB']:.2f} GB): decode {decode[ours]:.0f} tok/s, "
             f"{decode[ours] / decode[compiled]:.2f}x torch.compile; teacher-forced max relative error {tf['max_rel_error']:.1e}, "
             f"top-1 agreement {tf['top1_agreement']:.2f}.", "",
             "| variant | encoder median ms | encoder p90 ms | decode tok/s |", "|---|---|---|---|"]
    for name, row in encoder.items():
        match = next((k for k in decode if k.split(" (")[0] == name.split(" (")[0]), None)
        lines.append(f"| {name} | {row['median_ms']:.2f} | {row['p90_ms']:.2f} | "
                     f"{'' if match is None else format(decode[match], '.0f')} |")
    return "\n".join(lines) + "\n"


def _decode_kernels(r: dict[str, Any]) -> str:
    lines = [f"{r['gpu']}, {r['date']} (`{r['command']}`): {r['layers']} TinyLlama-sized layers' products, the device "
             f"copy {r['copy_GBs']:.0f} GB/s (bytes read and written). Weight GB/s of every product in turn as one CUDA "
             "graph, and its share of the copy's; the largest error against the float reference.", "",
             "| format | tokens | µs for the layers | weight GB/s | of the copy | max rel. error |", "|---|---|---|---|---|---|"]
    for x in r["rows"]:
        error = f"{x['max_rel_error']:.1e}" if "max_rel_error" in x else ""
        lines.append(f"| {x['format']} | {x['tokens']} | {x['ms'] * 1e3:.0f} | {x['GBs']:.0f} | {x['of_copy'] * 100:.0f} % | {error} |")
    lines += ["", "| one token, one shape | format | µs | weight GB/s | of the copy |", "|---|---|---|---|---|"]
    lines += [f"| {x['name']} {x['shape']} | {x['format']} | {x['us']:.1f} | {x['GBs']:.0f} | {x['of_copy'] * 100:.0f} % |"
              for x in r.get("shapes", [])]
    return "\n".join(lines) + "\n"


def _cell(row: dict[str, Any], key: str, fmt: str) -> str:
    value = row.get(key)
    return format(value, fmt) if isinstance(value, float | int) else ""


# bench.benchmark.kernel_profile's, in the table's order (a run shows those it has)
CLASSES = ("products (ours)", "products", "attention (ours)", "attention", "the rest")


def _llm_decode(r: dict[str, Any]) -> str:
    """`bench.llm` runs side by side (`runs`: a label, its command and its llm.json), one table."""
    first = r["runs"][0]["llm"]
    lines = [f"{first['gpu']}, {r['date']}; {r['layers']} TinyLlama-sized layers and its head (random weights), batch 1, decode "
             f"after a prompt of 128 (the rated limit: the fp16 weights' bytes over the rated bandwidth), "
             f"the device copy {first['bandwidth_GBs']['measured_copy']:.0f} GB/s. Kernel µs a decode step by class "
             "as measured (products in our kernels / in TensorRT's / attention in ours, where a run has them / in TensorRT's / the "
             "rest); our kernels' GB/s is the bytes their products read a "
             "step over their time; teacher-forced against eager fp16 (and, quantized, the model with its weights rounded "
             "as stored).", "",
             "| program | variant | prefill 128 / 512 ms | decode tok/s | of the rated limit | kernel µs a step | our kernels' GB/s "
             "| teacher-forced max rel. error, top-1 | vs rounded |", "|---|---|---|---|---|---|---|---|---|"]
    for run in r["runs"]:
        for row in run["llm"]["rows"]:
            classes = row.get("per_step", {}).get("kernel_us_per_step_by_class", {})
            tf, rounded = row.get("teacher_forced", {}), row.get("teacher_forced_vs_rounded", {})
            prefill = " / ".join(_cell(row, f"prefill_{n}_ms", ".2f") for n in (128, 512)) if "prefill_128_ms" in row else ""
            lines.append(f"| {run['label']} | {row['variant']} | {prefill} | {_cell(row, 'decode_tok_s', '.0f')} | "
                         f"{_cell(row, 'fraction_of_rated_limit', '.0%')} | {' / '.join(f'{classes[c]:.0f}' for c in CLASSES if c in classes)} | "
                         f"{_cell(row, 'products_ours_GBs', '.0f')} | "
                         f"{'' if 'max_rel_error' not in tf else format(tf['max_rel_error'], '.1e') + ', ' + format(tf['top1_agreement'], '.2f')} | "
                         f"{'' if 'max_rel_error' not in rounded else format(rounded['max_rel_error'], '.1e')} |")
    lines += ["", *(f"- {run['label']}: `{run['command']}`" for run in r["runs"])]
    return "\n".join(lines) + "\n"


RENDER: dict[str, tuple[str, Callable[[dict[str, Any]], str]]] = {
    "dvc-build": ("dvc-build.json", _dvc_build),
    "reference-gpu": ("reference-gpu.json", _reference_gpu),
    "media-gemma3": ("media-gemma3-2026-12-07.json", _media),
    "media-voxtral": ("media-voxtral-2026-12-07.json", _media),
    "decode-kernels": ("decode-kernels-2026-12-07b.json", _decode_kernels),
    "llm-decode-kernels": ("llm-decode-kernels-2026-12-08.json", _llm_decode),
}


def render(name: str) -> str:
    file, write = RENDER[name]
    return write(json.loads((RESULTS / file).read_text()))


def _blocks(text: str, where: str) -> str:
    def one(match: re.Match[str]) -> str:
        if match["name"] not in RENDER:
            raise SystemExit(f"{where}: no figures named {match['name']!r}; known: {sorted(RENDER)}")
        return match.group(1) + render(match["name"]) + match.group(4)

    return BLOCK.sub(one, text)


def _value(text: str) -> float:
    return float(text.replace(",", ""))


def untraced(page: Path = DOCS / "performance.md") -> list[str]:
    """The figures of `page` (outside blocks and code; decimals, and integers from 100) that no number
    of the results log or a results file gives at the precision the page shows."""
    logged: set[float] = set()
    for file in RESULTS.iterdir():
        if file.suffix in (".md", ".json"):
            logged |= {_value(n) for n in NUMBER.findall(file.read_text())}
    text = re.sub(r"`[^`]*`", "", BLOCK.sub("", page.read_text()))
    out = []
    for figure in dict.fromkeys(NUMBER.findall(text)):
        places = len(figure.split(".")[1]) if "." in figure else 0
        value = _value(figure)
        if (places or value >= 100) and not any(round(x, places) == value for x in logged):
            out.append(figure)
    return out


def check() -> list[str]:
    """What is not the results': each page whose blocks differ from their rendering, and each untraced figure."""
    stale = [str(p.relative_to(ROOT)) for p in sorted(DOCS.glob("*.md")) if _blocks(p.read_text(), p.name) != p.read_text()]
    return [f"{p}: its figures blocks are not the results' (python -m bench.figures)" for p in stale] + [
        f"docs/performance.md: {figure} is in no results file" for figure in untraced()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 naming what differs")
    args = parser.parse_args()
    if args.check:
        problems = check()
        print("\n".join(problems) or "the docs' figures are the results'")
        raise SystemExit(1 if problems else 0)
    for page in sorted(DOCS.glob("*.md")):
        text = page.read_text()
        new = _blocks(text, page.name)
        if new != text:
            page.write_text(new)
            print(f"rewrote the figures of {page.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
