"""Converters for attention: `aten.scaled_dot_product_attention`, softmax(q k^T * scale + mask) v
built from matmul, softmax and elementwise layers (causal masks need static sequence lengths), and
the compile step's fused `tensorrt::attention`, built as TensorRT's attention layer."""

from __future__ import annotations

import math
from typing import Any

import torch

from pipeline.engine.attention_op import attention as _op  # noqa: F401  (registers tensorrt::attention)
from pipeline.engine.context import ConversionContext, torch_to_trt
from pipeline.engine.converters import _validators as v
from pipeline.engine.converters._layers import broadcast, elementwise, ew_ops, promoted, unsqueeze_to
from pipeline.engine.converters.linear import matmul_layer
from pipeline.engine.converters.registry import converter
from pipeline.engine.trt_api import trt

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


# Decomposes: kept whole, sdpa's output strides differ from its decomposition's and break views after it
# in ExecuTorch's retrace; its decomposition (matmul, softmax) converts just as well.
@converter(aten.scaled_dot_product_attention.default, validator=_sdpa_ok, decomposes=True)
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


def _attention_ok(node: Node, spec: Any) -> str | None:
    q, k = node.args[0].meta["val"], node.args[1].meta["val"]  # type: ignore[union-attr]
    if q.dtype not in v.FLOAT_DTYPES:
        return f"attention query dtype {q.dtype} is not floating point"
    if q.shape[1] % k.shape[1]:
        return f"{q.shape[1]} query heads do not divide into {k.shape[1]} key/value heads"
    return None


@converter(torch.ops.tensorrt.attention.default, validator=_attention_ok)
def attention(ctx: ConversionContext, node: Node, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The compile step's fused attention (`fused_attention`): TensorRT's attention layer, q scaled
    first. Grouped-query attention runs as one head per K/V head with the group's query heads
    stacked along the tokens (and the mask's rows repeated to match): each K/V head is read once,
    never repeated, and a one-token decode step is a product of g rows, not g products of one."""
    t, dtype = trt(), ctx.node_dtype(node)
    q, k, val = (ctx.cast(x, dtype) for x in args[:3])
    mask, scale = args[3], args[4]
    batch, heads, tokens, width = ctx.dims(q)
    kv_heads = int(node.args[1].meta["val"].shape[1])  # type: ignore[union-attr]
    group = heads // kv_heads
    q = elementwise(ctx, ew_ops().PROD, q, ctx.tensor(float(scale), like=q))
    if group > 1:
        q = ctx.reshape(q, [batch, kv_heads, -1, width])
    if mask is not None:
        mask = unsqueeze_to(ctx, mask, 4)
        if group > 1:
            mask = _stacked_rows(ctx, mask, kv_heads, group)
        if mask.dtype != torch_to_trt(torch.bool):
            mask = ctx.cast(mask, dtype)
    layer = ctx.network.add_attention_v2(q, k, val, t.AttentionNormalizationOp.SOFTMAX, t.CausalMaskKind.NONE)
    if mask is not None:
        layer.mask = mask
    layer.decomposable = True  # TensorRT's own kernels where no fused one fits (fp32, odd head sizes)
    out = layer.get_output(0)
    return ctx.reshape(out, [batch, heads, tokens, width]) if group > 1 else out


def _stacked_rows(ctx: ConversionContext, mask: Any, kv_heads: int, group: int) -> Any:
    """A mask [a, h, T, S] (h 1 or one per query head) for queries stacked [B, kv_heads, group*T]:
    per-head rows regrouped, a shared mask's rows repeated `group` times."""
    a, h, tokens, keys = ctx.dims(mask)
    if h != 1:
        return ctx.reshape(mask, [a, kv_heads, -1, keys])
    wide = broadcast(ctx, ctx.reshape(mask, [a, 1, 1, tokens, keys]), [a, 1, group, tokens, keys])
    return ctx.reshape(wide, [a, 1, -1, keys])
