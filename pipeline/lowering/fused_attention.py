"""Attention as one TensorRT layer: the compile step finds `softmax(q k^T * scale + masks) @ v` in a
graph, as models spell it: torch's `scaled_dot_product_attention` as it decomposes (the scale split
over q and k), `transformers`' attention (half precision cast up around the products, grouped-query
attention's K/V heads repeated for each query head, a softmax asked for in fp32, a bias and a mask
added one after the other as T5 does), attention written by hand (scaled after the product or not
at all). It replaces each by one `tensorrt::attention` call on the un-repeated heads in their own
dtype, which the converter builds as TensorRT's attention layer (`IAttention`): fused kernels for
prompts, each K/V head read once, the repeat never written. What it does not recognise, or what
something else also reads (the probabilities as an output), stays as written."""

from __future__ import annotations

import math
from typing import Any

import torch

from pipeline.engine.attention_op import attention as _op  # noqa: F401  (registers tensorrt::attention)
from pipeline.engine.converters._validators import FLOAT_DTYPES
from pipeline.lowering.graph_rewrite import SCALINGS, new_node, rewrite_products
from pipeline.lowering.grouped_query import repeated_heads

aten = torch.ops.aten
Node = torch.fx.Node

_SOFTMAX = (aten._safe_softmax.default, aten._softmax.default, aten.softmax.int)
_CASTS = (aten._to_copy.default,)


def fuse_attention(gm: torch.fx.GraphModule) -> int:
    """Replace every attention the graph spells out by one `tensorrt::attention` call; returns how many."""
    return rewrite_products(gm, _fuse)


def _fuse(graph: torch.fx.Graph, out: Node) -> bool:
    probs: Any = _peeled(out.args[0], scales=False)[0]  # the probabilities, perhaps cast
    v: Any = out.args[1]
    if not _is_softmax(probs) or not _only_path(out.args[0], probs):
        return False
    scores: Any = _peeled(probs.args[0], scales=False)[0]
    if not _only_path(probs.args[0], scores):
        return False
    masks: list[Node] = []  # added to the scores: masks, biases (T5 adds both)
    while isinstance(scores, Node) and scores.target is aten.add.Tensor and len(scores.users) == 1:
        a, b = scores.args
        scores, term = (a, b) if _leads_to_product(a) else (b, a)
        if not isinstance(term, Node):
            return False
        masks.append(term)
    product, scale = _peeled(scores)
    if not _is_product(product) or not _only_path(scores, product):
        return False
    scores = product
    q, q_scale = _peeled(scores.args[0])
    k, k_scale = _peeled(scores.args[1])
    k, k_scale2 = _peeled(_untransposed(k))
    k, v = _heads(k), _heads(_peeled(v, scales=False)[0])  # a scaling of v scales the output: left out
    scale *= q_scale * k_scale * k_scale2
    if not _fits(q, k, v, masks, out):
        return False
    with graph.inserting_before(out):
        mask = masks[0] if masks else None
        for term in masks[1:]:
            mask = new_node(graph, aten.add.Tensor, (mask, term))
        keep = _bool_mask(graph, mask)
        if keep is None and mask is not None:
            keep = new_node(graph, aten._to_copy.default, (mask,), {"dtype": q.meta["val"].dtype})
        fused = new_node(graph, torch.ops.tensorrt.attention.default, (q, k, v, keep, scale),
                         val=q.meta["val"].new_empty(q.meta["val"].shape))
        result = fused
        if out.meta["val"].dtype != q.meta["val"].dtype:
            result = new_node(graph, aten._to_copy.default, (fused,), {"dtype": out.meta["val"].dtype})
    out.replace_all_uses_with(result)
    graph.erase_node(out)
    return True


def _is_softmax(node: Any) -> bool:
    """A softmax over the last dim (in any float dtype: the attention layer's runs in fp32)."""
    if not isinstance(node, Node) or node.target not in _SOFTMAX:
        return False
    dim, rank = node.args[1], node.meta["val"].dim()
    return dim in (-1, rank - 1) and node.meta["val"].dtype in FLOAT_DTYPES


def _is_product(node: Any) -> bool:
    return isinstance(node, Node) and node.target is aten.matmul.default and node.meta["val"].dim() == 4


def _only_path(top: Any, bottom: Node) -> bool:
    """Every node from `top` down its first inputs to `bottom` (both included) has one user: nothing
    else reads what the fused attention will no longer compute."""
    node = top
    while isinstance(node, Node) and len(node.users) == 1:
        if node is bottom:
            return True
        node = node.args[0]
    return False


def _leads_to_product(node: Any) -> bool:
    """`node` is the scores' product, perhaps scaled or cast, perhaps with terms added."""
    node = _peeled(node)[0]
    if isinstance(node, Node) and node.target is aten.add.Tensor:
        return any(_leads_to_product(x) for x in node.args)
    return _is_product(node)


def _peeled(node: Any, casts: bool = True, scales: bool = True) -> tuple[Any, float]:
    """`node` before casts between float dtypes (the upcast around half-precision attention) and
    multiplications or divisions by Python numbers (the scale, split over q and k), and the scale."""
    factor = 1.0
    while isinstance(node, Node) and node.op == "call_function" and node.args and isinstance(node.args[0], Node):
        if scales and node.target in SCALINGS and isinstance(node.args[1], (int, float)) \
                and not isinstance(node.args[1], bool) and len(node.users) == 1:
            value = float(node.args[1])
            factor *= 1.0 / value if SCALINGS[node.target] else value
        elif not (casts and node.target in _CASTS and set(node.kwargs) <= {"dtype"}
                  and node.meta["val"].dtype in FLOAT_DTYPES and node.args[0].meta["val"].dtype in FLOAT_DTYPES):
            break
        node = node.args[0]
    return node, factor


def _untransposed(node: Any) -> Any:
    """x for x's last two dims swapped (permute [0, 1, 3, 2] or transpose(-2, -1)); None otherwise."""
    if not isinstance(node, Node):
        return None
    if node.target is aten.permute.default and list(node.args[1]) == [0, 1, 3, 2]:  # type: ignore[arg-type]
        return node.args[0]
    if node.target is aten.transpose.int and {d % 4 for d in node.args[1:3]} == {2, 3}:  # type: ignore[operator]
        return node.args[0]
    return None


def _heads(node: Any) -> Any:
    """K or V before a grouped-query head repeat (itself when none)."""
    source, _ = repeated_heads(node) if isinstance(node, Node) else (None, 0)
    return source if source is not None else node


def _bool_mask(graph: torch.fx.Graph, mask: Node | None) -> Node | None:
    """The keep-mask of an additive mask `where(c, 0, -inf)` (c) or `where(c, -inf, 0)` (not c); else
    None (a bool tensor added to the scores adds 0 or 1: a bias, not a mask)."""
    if mask is None or mask.target is not aten.where.self:
        return None
    then, other = _constant(mask.args[1]), _constant(mask.args[2])
    if (then, other) == (0.0, -math.inf):
        return mask.args[0]  # type: ignore[return-value]
    if (then, other) == (-math.inf, 0.0):
        return new_node(graph, aten.bitwise_not.default, (mask.args[0],))
    return None


def _constant(node: Any) -> float | None:
    if isinstance(node, (int, float)):
        return float(node)
    if isinstance(node, Node) and node.target in (aten.scalar_tensor.default, aten.full.default):
        value = node.args[0] if node.target is aten.scalar_tensor.default else node.args[1]
        return float(value) if isinstance(value, (int, float)) else None
    return None


def _fits(q: Any, k: Any, v: Any, masks: list[Node], out: Node) -> bool:
    """Shapes and dtypes the attention layer takes: q [B, H, T, D], k and v [B, H/g, S, D] of q's float
    dtype, masks broadcasting to the scores [B, H, T, S]."""
    if not all(isinstance(n, Node) and isinstance(n.meta.get("val"), torch.Tensor) for n in (q, k, v)):
        return False
    qv, kv, vv = (n.meta["val"] for n in (q, k, v))
    if qv.dim() != 4 or kv.dim() != 4 or vv.dim() != 4 or qv.dtype not in FLOAT_DTYPES:
        return False
    if kv.dtype != qv.dtype or vv.dtype != qv.dtype or tuple(kv.shape) != tuple(vv.shape):
        return False
    if qv.shape[0] != kv.shape[0] or qv.shape[3] != kv.shape[3] or not isinstance(qv.shape[1], int) \
            or not isinstance(kv.shape[1], int) or qv.shape[1] % kv.shape[1]:
        return False
    if tuple(out.meta["val"].shape) != tuple(qv.shape):
        return False
    scores = (qv.shape[0], qv.shape[1], qv.shape[2], kv.shape[2])
    for mask in masks:
        mv = mask.meta.get("val")
        if not isinstance(mv, torch.Tensor) or mv.dim() > 4 or not (mv.dtype == torch.bool or mv.dtype in FLOAT_DTYPES):
            return False
        if any(m != 1 and m != s for m, s in zip(reversed(mv.shape), reversed(scores))):
            return False
    return True
