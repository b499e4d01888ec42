"""Converter for `aten.scaled_dot_product_attention`: softmax(q k^T * scale + mask) v, built from
matmul, softmax and elementwise layers (causal masks need static sequence lengths)."""

from __future__ import annotations

import math
from typing import Any

import torch

from pipeline.tensorrt.context import ConversionContext, torch_to_trt
from pipeline.tensorrt.converters import _validators as v
from pipeline.tensorrt.converters._layers import elementwise, ew_ops, promoted, unsqueeze_to
from pipeline.tensorrt.converters.linear import matmul_layer
from pipeline.tensorrt.converters.registry import converter

aten = torch.ops.aten
Node = torch.fx.Node


def _sdpa_ok(node: Node, spec: Any) -> str | None:
    q, k = node.args[0].meta["val"], node.args[1].meta["val"]  # type: ignore[union-attr]
    if q.dtype not in v.FLOAT_DTYPES:
        return f"attention query dtype {q.dtype} is not floating point"
    if v.arg(node, 4, "dropout_p", 0.0) != 0.0:
        return "attention dropout must be 0 in inference"
    if v.arg(node, 7, "enable_gqa", False) and q.shape[-3] != k.shape[-3]:
        return "grouped-query attention (enable_gqa with fewer key heads) is not supported"
    if v.arg(node, 5, "is_causal", False) and not all(isinstance(d, int) for d in (q.shape[-2], k.shape[-2])):
        return "is_causal needs static query and key lengths; pass an explicit attn_mask instead"
    return None


@converter(aten.scaled_dot_product_attention.default, validator=_sdpa_ok)
def scaled_dot_product_attention(ctx: ConversionContext, node: Node, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    dtype = ctx.node_dtype(node)
    q, k, val = (ctx.cast(t, dtype) for t in args[:3])
    mask = args[3] if len(args) > 3 else kwargs.get("attn_mask")
    qv, kv = node.args[0].meta["val"], node.args[1].meta["val"]  # type: ignore[union-attr]
    scale = v.arg(node, 6, "scale") or 1.0 / math.sqrt(int(qv.shape[-1]))
    scores = matmul_layer(ctx, q, k, transpose_b=True)
    scores = elementwise(ctx, ew_ops().PROD, scores, ctx.tensor(float(scale), like=scores))
    if v.arg(node, 5, "is_causal", False):
        keep = torch.ones(int(qv.shape[-2]), int(kv.shape[-2]), dtype=torch.bool).tril()
        mask = ctx.constant(torch.zeros(keep.shape).masked_fill(~keep, float("-inf")), dtype)
    if mask is not None and mask.dtype == torch_to_trt(torch.bool):
        rank = len(scores.shape)
        neg = ctx.tensor(float("-inf"), like=scores)
        scores = ctx.network.add_select(unsqueeze_to(ctx, mask, rank), scores, neg).get_output(0)
    elif mask is not None:
        scores = elementwise(ctx, ew_ops().SUM, *promoted(ctx, node, scores, mask, dtype))
    softmax = ctx.network.add_softmax(scores)
    softmax.axes = 1 << (len(scores.shape) - 1)
    return matmul_layer(ctx, softmax.get_output(0), val)
