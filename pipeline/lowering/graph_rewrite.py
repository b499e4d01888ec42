"""What the compile step's graph rewrites share: rewriting every product a pattern starts from, and
new nodes that carry their fake values (which partitioning and the converters read)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch

Node = torch.fx.Node
aten = torch.ops.aten

# Scalings a rewrite may carry through or fold: op -> whether it divides.
SCALINGS = {aten.mul.Scalar: False, aten.mul.Tensor: False, aten.div.Scalar: True, aten.div.Tensor: True}


def rewrite_products(gm: torch.fx.GraphModule, rewrite: Callable[[torch.fx.Graph, Node], bool]) -> int:
    """Call `rewrite(graph, node)` on every `aten.matmul` node; drop what the rewrites left unread.
    Returns how many were rewritten."""
    rewritten = 0
    for node in list(gm.graph.nodes):
        if node.op == "call_function" and node.target is aten.matmul.default and rewrite(gm.graph, node):
            rewritten += 1
    if rewritten:
        gm.graph.eliminate_dead_code()
        gm.recompile()
    return rewritten


def new_node(graph: torch.fx.Graph, target: Any, args: tuple[Any, ...], kwargs: dict[str, Any] | None = None,
             val: torch.Tensor | None = None) -> Node:
    """A new node with its fake value: `val`, or the op run on its inputs' fake values."""
    node = graph.call_function(target, args, kwargs or {})
    if val is None:
        values = torch.fx.map_arg((args, kwargs or {}), lambda n: n.meta["val"])
        mode = torch._guards.detect_fake_mode(torch.utils._pytree.tree_leaves(values))
        with mode or contextlib.nullcontext():
            val = target(*values[0], **values[1])
    node.meta["val"] = val
    return node
