"""`tensorrt::attention`: the one call the compile step puts in place of each attention it finds
(`pipeline/lowering/fused_attention.py`), which the attention converter builds as TensorRT's
attention layer."""

from __future__ import annotations

import torch

_LIB = torch.library.Library("tensorrt", "FRAGMENT")
_LIB.define("attention(Tensor q, Tensor k, Tensor v, Tensor? mask, float scale) -> Tensor")


@torch.library.impl(_LIB, "attention", "CompositeImplicitAutograd")
def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, scale: float) -> torch.Tensor:
    """softmax(q k^T * scale + mask) v, each of k's and v's heads serving q.shape[1] / k.shape[1]
    query heads; a bool mask keeps where True, a float mask is added. Composite: where no engine
    takes it, export decomposes it again (into torch's attention), so a program never needs a
    kernel for it."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
