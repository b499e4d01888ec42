"""Which graph calls are the project's kernels (`pipeline::decode_*`): what a plan runs between its engines
and the partitioner leaves to it. Importing this registers every kernel op."""

from __future__ import annotations

import torch

from pipeline.kernels.attention_op import is_decode_attention
from pipeline.kernels.product_op import is_decode_product


def is_kernel_call(node: torch.fx.Node) -> bool:
    """A call of `decode_product` or `decode_attention` (ATen, Edge or out form)."""
    return is_decode_product(node) or is_decode_attention(node)
