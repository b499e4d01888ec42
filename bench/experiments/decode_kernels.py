"""The project's decode-product kernels (GPU): how fast they read a decoder's weights at 1 to 8 tokens,
against the GPU's copy bandwidth and cuBLAS, and whether they compute what their reference says.

The weights are `--layers` TinyLlama-sized layers (`decode_products.SHAPES`, 2048/256/5632), packed as
fp16, int4 (groups of 128) and fp8 (`pipeline.kernels.formats`); the PTX is the one a program carries
(NVRTC, compute_80). Per format and token count: the whole chain's time (every product of every layer,
launched back to back as one CUDA graph, as a method graph runs them), its weight GB/s and the share of
the copy bandwidth (`torch` copying 1 GiB: bytes read + written / time); at one token, each shape
alone (copies of it past the L2 cache). Every kernel's output is checked against the float reference.

    python -m bench.experiments.decode_kernels --layers 4 --out build/decode_kernels
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import torch

from bench.experiments.decode_products import SHAPES, graph_ms, save
from pipeline.kernels import driver, formats, ptx

TOKENS = (1, 2, 4, 8)
L2_PAST = 256 << 20  # bytes of copies a one-shape row reads, past any L2 cache


def copy_bandwidth() -> float:
    """GB/s of a 1 GiB device-to-device copy (bytes read + written)."""
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    stream = torch.cuda.Stream()
    ms = graph_ms(lambda: dst.copy_(src), stream, 20)
    return 2 * src.numel() / ms / 1e6


def packed_layers(layers: int, format: str) -> list[dict[str, formats.PackedWeight]]:
    gen = torch.Generator().manual_seed(0)
    return [{name: formats.pack(torch.randn(shape, generator=gen) * 0.02, format).to("cuda")
             for name, shape in SHAPES.items()} for _ in range(layers)]


def chain(module: driver.Module, layers: list[dict[str, formats.PackedWeight]], tokens: int) -> tuple[float, float]:
    """(ms of every product of every layer as one graph, the largest relative error against the reference)."""
    xs = {w.k: torch.randn(tokens, w.k, dtype=torch.float16, device="cuda") for layer in layers for w in layer.values()}
    outs = [{name: torch.empty(tokens, w.n, dtype=torch.float16, device="cuda") for name, w in layer.items()} for layer in layers]

    def run() -> None:
        for layer, out in zip(layers, outs, strict=True):
            for name, w in layer.items():
                driver.product(module, xs[w.k], w, out[name])

    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        run()
    stream.synchronize()
    error = 0.0
    for name, w in layers[0].items():
        ref = (xs[w.k].float() @ formats.dequantized(w).cuda().T)
        error = max(error, ((outs[0][name].float() - ref).abs().max() / ref.abs().max()).item())
    with torch.cuda.stream(stream):
        ms = graph_ms(run, stream, 20)
    return ms, error


def one_shape(module: driver.Module, format: str, name: str) -> dict[str, Any]:
    n, k = SHAPES[name]
    gen = torch.Generator().manual_seed(1)
    first = formats.pack(torch.randn(n, k, generator=gen) * 0.02, format)
    copies = [first.to("cuda") for _ in range(max(1, L2_PAST // first.nbytes))]
    x = torch.randn(1, k, dtype=torch.float16, device="cuda")
    out = torch.empty(1, n, dtype=torch.float16, device="cuda")
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        ms = graph_ms(lambda: [driver.product(module, x, w, out) for w in copies], stream, 10)
    return {"shape": [n, k], "copies": len(copies), "us": ms * 1e3 / len(copies), "GBs": first.nbytes * len(copies) / ms / 1e6}


def cublas_chain(layers: int, tokens: int) -> tuple[float, float]:
    gen = torch.Generator().manual_seed(0)
    ws = [{n: (torch.randn(s, generator=gen) * 0.02).half().cuda() for n, s in SHAPES.items()} for _ in range(layers)]
    xs = {k: torch.randn(tokens, k, dtype=torch.float16, device="cuda") for k in {s[1] for s in SHAPES.values()}}
    stream = torch.cuda.Stream()

    def run() -> None:
        for layer in ws:
            for w in layer.values():
                torch.nn.functional.linear(xs[w.shape[1]], w)

    with torch.cuda.stream(stream):
        run()
        ms = graph_ms(run, stream, 20)
    return ms, sum(w.nbytes for layer in ws for w in layer.values()) / 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--formats", nargs="*", default=list(formats.FORMATS))
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    begin = time.perf_counter()
    module = driver.Module(ptx.kernels_ptx())
    copy = copy_bandwidth()
    results: dict[str, Any] = {"gpu": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d"),
                               "command": f"python -m bench.experiments.decode_kernels --layers {args.layers}",
                               "nvrtc": ptx.nvrtc_version(), "arch": ptx.ARCH,
                               "copy_GBs": copy, "layers": args.layers, "rows": []}
    print(json.dumps({k: v for k, v in results.items() if k != "rows"}), flush=True)
    for tokens in TOKENS:
        ms, gb = cublas_chain(args.layers, tokens)
        row = {"format": "cuBLAS fp16", "tokens": tokens, "ms": ms, "GBs": gb / ms * 1e3, "of_copy": gb / ms * 1e3 / copy}
        results["rows"].append(row)
        print(json.dumps(row), flush=True)
    for format in args.formats:
        layers = packed_layers(args.layers, format)
        gb = sum(w.nbytes for layer in layers for w in layer.values()) / 1e9
        for tokens in TOKENS:
            ms, error = chain(module, layers, tokens)
            row = {"format": format, "tokens": tokens, "ms": ms, "GBs": gb / ms * 1e3, "of_copy": gb / ms * 1e3 / copy,
                   "max_rel_error": error}
            results["rows"].append(row)
            print(json.dumps(row), flush=True)
        del layers
        shapes = {name: one_shape(module, format, name) for name in ("q", "k", "gate", "down")}
        for name, row in shapes.items():
            row.update(format=format, name=name, of_copy=row["GBs"] / copy)
            results.setdefault("shapes", []).append(row)
            print(json.dumps(row), flush=True)
        torch.cuda.empty_cache()
    results["seconds"] = time.perf_counter() - begin
    save(results, args.out, "decode_kernels.json")


if __name__ == "__main__":
    main()
