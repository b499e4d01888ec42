"""Engines past 2 GB, for real (GPU machine): a generated program whose engines total more than 2 GB
saves, loads and runs, and loading maps the files instead of copying them.

The program has three methods: `forward`, a stack of `--layers` fp32 linear layers of `--hidden`
features (one engine, past 2 GB at the defaults), `again`, the same engine called from a second
method (stored once), and `head`, one more layer (a second engine). For each layout (engines in
the `.ptd`, and engines as `.pte` segments) it reports the file sizes and save seconds, then, in a
fresh process, the host memory that loading every method takes (peak anonymous and file-backed
resident memory above the process's baseline, sampled every 5 ms) against the largest engine, and
each method's largest relative error against eager PyTorch.

    python -m bench.large_program --out /tmp/large            # ~3 GB of engines, ~12 GB of host memory
    python -m bench.large_program --hidden 1024 --layers 2    # the same path in seconds
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import torch

SEED = 0


def stack(hidden: int, layers: int, seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    mods: list[torch.nn.Module] = []
    for _ in range(layers):
        mods += [torch.nn.Linear(hidden, hidden), torch.nn.ReLU()]
    return torch.nn.Sequential(*mods).eval()


def models(hidden: int, layers: int) -> dict[str, torch.nn.Module]:
    big = stack(hidden, layers, SEED)
    return {"forward": big, "again": big, "head": stack(hidden, 1, SEED + 1)}


def example(hidden: int) -> torch.Tensor:
    return torch.randn(4, hidden, generator=torch.Generator().manual_seed(2))


def build(hidden: int, layers: int, out: Path) -> list[dict[str, Any]]:
    """Compile once, save both layouts; rows of sizes and seconds."""
    from pipeline.delegate import pte
    from pipeline.engine.compile_spec import TensorRTCompileSpec
    from pipeline.lowering.compile import compile_method
    from pipeline.lowering.export import stage
    from pipeline.lowering.serialize import save

    spec = TensorRTCompileSpec()
    start = time.perf_counter()
    mods = models(hidden, layers)
    big = compile_method(mods["forward"], (example(hidden),), spec, method="forward")
    programs = {"forward": big, "again": stage(big), "head": compile_method(mods["head"], (example(hidden),), spec, method="head")}
    compile_s = time.perf_counter() - start
    rows = []
    for external in (True, False):
        start = time.perf_counter()
        files = save(programs, out / ("external" if external else "inline") / "large.pte", external_data=external)
        seconds = time.perf_counter() - start
        entries = pte.named_entries(pte.read(files["pte"], files.get("ptd")))
        rows.append({"layout": "engines in .ptd" if external else "engines in .pte", "files": {k: str(p) for k, p in files.items()},
                     "pte_bytes": files["pte"].stat().st_size, "ptd_bytes": files["ptd"].stat().st_size if "ptd" in files else 0,
                     "engines": len(entries), "engine_bytes": sum(e["bytes"] for e in entries),
                     "largest_engine_bytes": max(e["bytes"] for e in entries), "compile_s": round(compile_s, 1),
                     "save_s": round(seconds, 1)})
    return rows


class Sampler:
    """Peak RssAnon and RssFile of this process (kB from /proc/self/status), sampled every 5 ms."""

    def __init__(self) -> None:
        self.base = self._read()
        self.peak = dict(self.base)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    @staticmethod
    def _read() -> dict[str, int]:
        out = {}
        for line in Path("/proc/self/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("RssAnon", "RssFile"):
                out[key] = int(value.split()[0]) * 1024
        return out

    def _run(self) -> None:
        while not self._stop.wait(0.005):
            for key, value in self._read().items():
                self.peak[key] = max(self.peak[key], value)

    def stop(self) -> dict[str, int]:
        self._stop.set()
        self._thread.join()
        for key, value in self._read().items():
            self.peak[key] = max(self.peak[key], value)
        return {f"load_peak_{k.lower()}_bytes": self.peak[k] - self.base[k] for k in self.peak}


def measure(pte: str, ptd: str | None, hidden: int, layers: int) -> dict[str, Any]:
    """In this (fresh) process: load every method, with host memory sampled; then run and compare."""
    from pipeline.runtime import load

    torch.cuda.init()
    torch.empty(1, device="cuda")
    sampler = Sampler()
    start = time.perf_counter()
    program = load(pte, ptd)
    methods = {name: program.method(name) for name in program.method_names}
    load_s = time.perf_counter() - start
    memory = sampler.stop()
    x = example(hidden).cuda()
    errors = {}
    with torch.no_grad():
        for name, module in models(hidden, layers).items():
            ref = module.cuda()(x)
            (out,) = methods[name].execute([x])
            errors[name] = float(((out.float() - ref).abs().max() / ref.abs().max()).item())
            module.cpu()
    return {**memory, "load_s": round(load_s, 2), "max_rel_error": errors}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hidden", type=int, default=8192)
    parser.add_argument("--layers", type=int, default=10)
    parser.add_argument("--out", type=Path, default=Path("/tmp/large_program"))
    parser.add_argument("--measure", nargs=2, metavar=("PTE", "PTD"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        pte, ptd = args.measure
        print(json.dumps(measure(pte, None if ptd == "-" else ptd, args.hidden, args.layers)))
        return
    if not torch.cuda.is_available():
        raise SystemExit("bench/large_program.py needs a CUDA GPU")
    rows = build(args.hidden, args.layers, args.out)
    for row in rows:
        files = row.pop("files")
        cmd = [sys.executable, __file__, "--hidden", str(args.hidden), "--layers", str(args.layers),
               "--measure", files["pte"], files.get("ptd", "-")]
        result = subprocess.run(cmd, capture_output=True, text=True, check=True)
        row.update(json.loads(result.stdout.strip().splitlines()[-1]))
        print(json.dumps(row), flush=True)
    print(json.dumps({"rows": rows}))


if __name__ == "__main__":
    main()
