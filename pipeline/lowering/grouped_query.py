"""Grouped-query attention without repeated key/value heads: a matrix product whose second operand
repeats each key/value head for a group of query heads (`transformers`' `repeat_kv`: unsqueeze,
expand, clone, view; then perhaps cast, permuted and scaled) becomes one product per key/value head
over the group's queries stacked, so an engine reads each head of the KV cache once and never
writes the repeated copy."""

from __future__ import annotations

import torch

from pipeline.lowering.graph_rewrite import SCALINGS, new_node, rewrite_products

aten = torch.ops.aten
Node = torch.fx.Node

_VIEWS = (aten.view.default, aten._unsafe_view.default, aten.reshape.default)


def share_kv_heads(gm: torch.fx.GraphModule) -> int:
    """Rewrite every product `a @ f(repeat(kv))` (`a`: [B, H, T, K]; `kv`: [B, H/g, S, D] repeated
    g times per head; `f`: casts, permutes of the last two dims and scalings, which commute with
    the repeat) into `(a viewed as [B, H/g, g*T, K] @ f(kv))` viewed back as [B, H, T, N]: the same
    dot products, each head read once. Returns how many products were rewritten."""
    return rewrite_products(gm, _rewrite)


def _rewrite(graph: torch.fx.Graph, matmul: Node) -> bool:
    a, b = matmul.args[0], matmul.args[1]
    if not isinstance(a, Node) or not isinstance(b, Node):
        return False
    chain, source, group = _head_chain(b)
    a_val, out_val = a.meta.get("val"), matmul.meta.get("val")
    if source is None or a_val is None or out_val is None or a_val.dim() != 4:
        return False
    batch, heads, tokens, inner = a_val.shape
    if not all(isinstance(d, int) for d in (batch, heads, inner, out_val.shape[3])):
        return False  # the views below name these sizes as numbers
    if batch != source.meta["val"].shape[0] or heads != source.meta["val"].shape[1] * group:
        return False
    # Fake values made, not computed: on some torch versions inferring a view's -1 over a symbolic
    # token count specializes the symbol to the example's value.
    stacked = (batch, heads // group, tokens * group)
    with graph.inserting_before(matmul):
        dense = new_node(graph, aten.clone.default, (a,), {"memory_format": torch.contiguous_format},
                         a_val.new_empty(a_val.shape))  # a view needs it; TensorRT makes nothing of it
        grouped = new_node(graph, aten.view.default, (dense, [batch, heads // group, -1, inner]),
                           val=a_val.new_empty((*stacked, inner)))
        operand = source
        for link in reversed(chain):  # the same permutes and scalings, on the shared heads
            operand = new_node(graph, link.target, (operand, *link.args[1:]), dict(link.kwargs))
        product = new_node(graph, aten.matmul.default, (grouped, operand), val=out_val.new_empty((*stacked, out_val.shape[3])))
        out = new_node(graph, aten.view.default, (product, [batch, heads, -1, out_val.shape[3]]), val=out_val)
    matmul.replace_all_uses_with(out)
    graph.erase_node(matmul)
    return True


def _head_chain(node: Node) -> tuple[list[Node], Node | None, int]:
    """The ops between a product's operand and a head repeat (operand first), the repeated tensor,
    and the group size; `(_, None, 0)` when `node` is not such a chain."""
    chain = []
    while _head_wise(node):
        chain.append(node)
        node = node.args[0]  # type: ignore[assignment]
    source, group = repeated_heads(node)
    return chain, source, group


def _head_wise(node: Node) -> bool:
    """An op on [B, H, S, D] that leaves dims 0 and 1 alone and treats every head the same."""
    if node.op != "call_function" or not isinstance(node.args[0], Node):
        return False
    if node.target is aten.permute.default:
        return list(node.args[1])[:2] == [0, 1]  # type: ignore[arg-type, index]
    if node.target is aten.transpose.int:
        return all(d % 4 >= 2 for d in node.args[1:3])  # type: ignore[operator]
    if node.target is aten._to_copy.default:  # the attention's upcast of half-precision K and V
        return set(node.kwargs) <= {"dtype"}
    if node.target in SCALINGS:
        other = node.args[1]
        return isinstance(other, (int, float)) or (isinstance(other, Node) and _scalar(other))
    return False


def _scalar(node: Node) -> bool:
    val = node.meta.get("val")
    return isinstance(val, torch.Tensor) and val.dim() == 0


def repeated_heads(node: Node) -> tuple[Node | None, int]:
    """`kv` and g when `node` is view(clone?(expand(unsqueeze(kv, 2), [B, Hkv, g, S, D])), [B, Hkv*g, S, D])."""
    if node.op != "call_function" or node.target not in _VIEWS or not isinstance(node.args[0], Node):
        return None, 0
    expand = node.args[0]
    if expand.target is aten.clone.default and isinstance(expand.args[0], Node):
        expand = expand.args[0]
    if expand.target is not aten.expand.default or not isinstance(expand.args[0], Node):
        return None, 0
    unsqueeze = expand.args[0]
    if unsqueeze.target is not aten.unsqueeze.default or unsqueeze.args[1] != 2:
        return None, 0
    source = unsqueeze.args[0]
    src_val = source.meta.get("val") if isinstance(source, Node) else None
    if src_val is None or src_val.dim() != 4:
        return None, 0
    b, h, s, d = src_val.shape
    group = expand.meta["val"].shape[2]
    if not isinstance(group, int) or group < 2:
        return None, 0
    if tuple(expand.meta["val"].shape) != (b, h, group, s, d) or tuple(node.meta["val"].shape) != (b, h * group, s, d):
        return None, 0  # broadcasting more than the heads, or merging other dims
    return source, group  # type: ignore[return-value]
