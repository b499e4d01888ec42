"""The decode-attention kernels (`decode_attention.cu` states their contract): the sizes they take, the
workspace and grids a launch needs, and what they compute (their reference)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

import torch

CHUNK = 64  # cache positions a block of `SPLIT` reads (the source's kChunk)
MAX_QUERIES = 32  # query heads a K/V head serves, times the tokens (kMaxQueries)
MAX_QUERY_VALUES = 4096  # those queries' values (kMaxQueryValues)
THREADS = 128  # threads a block (kAttnThreads)
MAX_TOKENS = 8
SPLIT, COMBINE = "da_split", "da_combine"  # the PTX entries, launched in turn
LEFT_OUT = -65504.0  # a mask value at or below it leaves its position out (fp16's lowest)


class Sizes(NamedTuple):
    """One attention's sizes, read from its values: q [batch, heads, tokens, dim], k and v [batch,
    kv_heads, positions, dim], mask [mask_batch, 1, tokens, positions] (mask_batch 0: no mask)."""

    batch: int
    heads: int
    kv_heads: int
    tokens: int
    positions: int
    dim: int
    mask_batch: int

    @property
    def chunks(self) -> int:
        return -(-self.positions // CHUNK)

    @property
    def workspace(self) -> int:
        """float32 values of the workspace a launch writes and combines."""
        return self.batch * self.heads * self.tokens * self.chunks * (self.dim + 2)

    @property
    def grids(self) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
        """`SPLIT`'s grid (chunk, K/V head, batch) and `COMBINE`'s (a block per query row)."""
        return (self.chunks, self.kv_heads, self.batch), (self.batch * self.heads * self.tokens, 1, 1)


def sizes(q: Sequence[int], k: Sequence[int], v: Sequence[int], mask: Sequence[int] | None) -> Sizes | str:
    """The sizes of an attention over values of these shapes, or why the kernels cannot take it (one
    sentence; dtypes are the caller's: float16 throughout)."""
    if len(q) != 4 or len(k) != 4 or tuple(k) != tuple(v):
        return f"its q {list(q)}, k {list(k)} and v {list(v)} are not [B, H, T, D] and two equal [B, KVH, S, D]"
    (batch, heads, tokens, dim), (_, kv_heads, positions, _) = q, k
    if min(*q, *k) <= 0 or math.prod(q) >= 2**31:
        return f"its q {list(q)} or k {list(k)} has an empty dim, or q 2^31 values or more"
    if k[0] != batch or k[3] != dim or kv_heads <= 0 or heads % kv_heads:
        return f"its k {list(k)} does not serve q {list(q)} (one batch and head size, K/V heads dividing the query heads)"
    if tokens > MAX_TOKENS or dim % 8:
        return f"q {list(q)} is not 1 to {MAX_TOKENS} tokens of a head size that is a multiple of 8"
    queries = heads // kv_heads * tokens
    if queries > MAX_QUERIES or queries * dim > MAX_QUERY_VALUES:
        return (f"a K/V head serves {queries} queries of {dim} values; the kernels take {MAX_QUERIES} and "
                f"{MAX_QUERY_VALUES} values at most")
    if mask is not None and (len(mask) != 4 or mask[0] not in (1, batch) or tuple(mask[1:]) != (1, tokens, positions)):
        return f"its mask {list(mask)} is not [1 or {batch}, 1, {tokens}, {positions}] (one mask for every head)"
    return Sizes(batch, heads, kv_heads, tokens, positions, dim, 0 if mask is None else mask[0])


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, scale: float) -> torch.Tensor:
    """What the kernels compute, in float32 on the CPU: softmax(q k^T * scale + mask) v over the
    positions the mask keeps (above `LEFT_OUT`), each K/V head serving its query heads; zeros for a
    query that keeps none. [B, T, H, D]: the heads merged, as the kernels write them."""
    group = q.shape[1] // k.shape[1]
    q, k, v = (t.cpu().float() for t in (q, k, v))
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    scores = q @ k.transpose(-1, -2) * scale
    if mask is not None:
        mask = mask.cpu().float()
        scores = (scores + mask).masked_fill(mask <= LEFT_OUT, -math.inf)
    out = torch.softmax(scores, dim=-1).nan_to_num(0.0) @ v  # a row of no position: NaN -> zeros
    return out.transpose(1, 2).contiguous()
