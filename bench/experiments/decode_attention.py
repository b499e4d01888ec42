"""The project's decode-attention kernels (GPU): a decode step's attention over a TinyLlama-sized cache
(32 query heads, 4 K/V heads of 64 values, 1024 positions), per layer, against torch's attention as a
decoder runs it in eager (the K/V heads repeated, the whole cache read under the mask), both captured as
one CUDA graph over `--layers` layers; the output checked against the float reference.

    python -m bench.experiments.decode_attention --layers 22 --out build/decode_attention
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any

import torch

from bench.experiments.decode_products import graph_ms, save
from pipeline.kernels import decode_attention, driver, ptx

HEADS, KV_HEADS, DIM, POSITIONS = 32, 4, 64, 1024


def case(module: driver.Module, layers: int, kept: int, tokens: int) -> dict[str, Any]:
    """µs a layer, ours and torch's, for `tokens` queries keeping the first `kept` positions."""
    gen = torch.Generator().manual_seed(kept)
    sizes = decode_attention.Sizes(1, HEADS, KV_HEADS, tokens, POSITIONS, DIM, 1)
    caches = [[torch.randn(1, KV_HEADS, POSITIONS, DIM, generator=gen).half().cuda() for _ in range(2)] for _ in range(layers)]
    q = torch.randn(1, HEADS, tokens, DIM, generator=gen).half().cuda()
    keep = torch.arange(POSITIONS)[None, :] <= torch.arange(kept - tokens, kept)[:, None]
    mask = torch.where(keep, 0.0, -math.inf).half().reshape(1, 1, tokens, POSITIONS).cuda()
    outs = [torch.empty(1, tokens, HEADS, DIM, dtype=torch.float16, device="cuda") for _ in range(layers)]
    workspace = torch.empty(sizes.workspace, device="cuda")
    scale = DIM ** -0.5

    def ours() -> None:
        for (k, v), out in zip(caches, outs, strict=True):
            driver.attention(module, q, k, v, mask, workspace, out, scale, sizes)

    def torchs() -> None:
        for k, v in caches:
            torch.nn.functional.scaled_dot_product_attention(q, k.repeat_interleave(HEADS // KV_HEADS, 1),
                                                             v.repeat_interleave(HEADS // KV_HEADS, 1), attn_mask=mask, scale=scale)

    stream = torch.cuda.Stream()
    ours_ms, torch_ms = graph_ms(ours, stream, 50), graph_ms(torchs, stream, 50)
    ref = decode_attention.reference(q, *caches[-1], mask, scale)
    error = ((outs[-1].float().cpu() - ref).abs().max() / ref.abs().max()).item()
    read = 2 * KV_HEADS * kept * DIM * 2  # K and V bytes up to the position
    return {"kept": kept, "tokens": tokens, "ours_us": round(ours_ms * 1e3 / layers, 2),
            "torch_us": round(torch_ms * 1e3 / layers, 2), "ours_GBs": round(read / (ours_ms * 1e-3 / layers) / 1e9, 1),
            "max_rel_error": error}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=22)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    module = driver.Module(ptx.kernels_ptx())
    rows = [case(module, args.layers, kept, tokens) for kept in (129, 192, 640, 1024) for tokens in (1, 4)]
    for row in rows:
        print(row)
    save({"gpu": torch.cuda.get_device_name(), "layers": args.layers, "rows": rows}, args.out, "decode-attention.json")


if __name__ == "__main__":
    main()
