"""Our engine and the ONNX parser's engine of suite models, compared on the CPU by what TensorRT-RTX
writes into each plan: its Myelin program, as text, with every kernel and the stream it runs on.
A structural difference behind a speed ratio shows here before any device time is spent (it found
why xcit_nano's parser engine runs on two streams and ours on one: `docs/coverage.md`).

    python -m bench.experiments.plan_compare timm/xcit_nano_12_p16_224 timm/resnext50_32x4d   # needs `onnx`

Per model: each plan's streams, its kernels by kind (`conv`, `matmul`, and Myelin's fused kernels
by the ops they fuse, e.g. `SqrtMaxReplDiv`), the kernels on a second stream, and the kinds whose
counts differ. Our engine is built as the compile step builds it (suite config, `--set` overrides);
the parser's with the same builder settings (`bench/onnx_reference.py`).
"""

from __future__ import annotations

import argparse
import re
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

from bench.coverage_gpu import Setup, onnx_engine  # noqa: E402
from pipeline.coverage.suite import Entry, select  # noqa: E402

_KERNEL = re.compile(rb"(corrltn|fully_connected|function)=\{ name=(\S+)[^\n]*?stream=(\d+)")
_MYELIN = re.compile(r"__myl_([A-Za-z]+)")


def kernels(plan: bytes) -> list[tuple[str, int]]:
    """(kind, stream) of every kernel in a TensorRT-RTX plan's Myelin program, in its order."""
    out = []
    for what, name, stream in _KERNEL.findall(plan):
        if what == b"function":
            fused = _MYELIN.match(name.decode(errors="replace"))
            kind = fused.group(1) if fused else name.decode(errors="replace")
        else:
            kind = "conv" if what == b"corrltn" else "matmul"
        out.append((kind, int(stream)))
    return out


def streams(plan: bytes) -> int:
    """The most streams any part of the plan's Myelin program runs on (1: no auxiliary stream)."""
    return max((int(n) for n in re.findall(rb"n_streams = (\d+)", plan)), default=1)


def our_plan(setup: Setup, entry: Entry) -> bytes:
    """Our engine of `entry`, compiled as the compile step compiles it (one engine: the suite lowers whole)."""
    from pipeline.config import objects
    from pipeline.coverage.run import entry_config
    from pipeline.lowering.compile import compile_method

    cfg = entry_config(entry, setup.precision, setup.overrides)
    program = compile_method(objects.model(cfg), objects.example_inputs(cfg.model.methods["forward"], 0),
                             objects.compile_spec(cfg, "forward"))
    found = [t for name, t in {**program.state_dict, **program.constants}.items() if "_tensorrt_engine_" in name]
    if len(found) != 1:
        raise RuntimeError(f"{entry.name}: {len(found)} engines, expected one")
    return found[0].numpy().tobytes()


def parser_plan(setup: Setup, entry: Entry) -> bytes:
    """The ONNX parser's engine of `entry`, with our builder settings."""
    onnx_engine(setup, entry)
    folder = setup.folder(entry)
    if not (folder / "onnx.engine").exists():
        raise RuntimeError((folder / "onnx.error").read_text())
    return (folder / "onnx.engine").read_bytes()


def compare(plans: dict[str, bytes]) -> dict[str, Any]:
    """Streams, kernels by kind, second-stream kernels by kind, and the kinds whose counts differ."""
    found = {label: kernels(plan) for label, plan in plans.items()}
    counts = {label: Counter(kind for kind, _ in ks) for label, ks in found.items()}
    labels = list(plans)
    kinds = sorted(set().union(*counts.values()))
    return {
        "streams": {label: streams(plan) for label, plan in plans.items()},
        "kernels": {label: sum(c.values()) for label, c in counts.items()},
        "second_stream": {label: dict(Counter(kind for kind, s in ks if s > 0)) for label, ks in found.items()},
        "differ": {kind: [counts[label][kind] for label in labels] for kind in kinds
                   if len({counts[label][kind] for label in labels}) > 1},
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("models", nargs="+", help="suite models, e.g. timm/xcit_nano_12_p16_224")
    parser.add_argument("--precision", default="fp32")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="a config override of our build, e.g. compile.attention=as_written (repeatable)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        setup = Setup(args.precision, tuple(args.overrides), Path(tmp))
        for entry in select(args.models):
            result = compare({"ours": our_plan(setup, entry), "parser": parser_plan(setup, entry)})
            print(f"## {entry.name}")
            print(f"streams: ours {result['streams']['ours']}, parser {result['streams']['parser']}; "
                  f"kernels: ours {result['kernels']['ours']}, parser {result['kernels']['parser']}")
            for label, kinds in result["second_stream"].items():
                if kinds:
                    print(f"{label}, second stream: {kinds}")
            for kind, (a, b) in result["differ"].items():
                print(f"  {kind}: ours {a}, parser {b}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
