"""The float values a graph computes from integers alone, which an fp16 or bf16 engine keeps in float32.

A decoder's rotary angles are positions times frequencies: hundreds to thousands of radians, which 16
bits hold to within 0.25 rad at position 1000 (fp16's spacing there is 0.5), turning the keys and
queries of every later position. Models compute them in float32 for that reason; an engine whose every
float is its compute dtype would not. So a float32 value made from an integer tensor (a cast of one),
and what cheap elementwise and layout ops make from such values, constants and integers, stays float32,
with the float32 constants only those ops read; the first other op (a cast to half precision, a product
with an activation, a matrix product) takes its input in the compute dtype as before. Relative position
biases made from distances (T5's logarithm of them) are such values too."""

from __future__ import annotations

import torch

from pipeline.engine.converters.registry import aten_op

# What keeps a value made from integers such a value: elementwise arithmetic and math, and layout (by
# ATen name; Edge programs spell the layout ops `<name>_copy`).
_KEEPS = frozenset({
    "mul", "add", "sub", "rsub", "div", "neg", "reciprocal", "pow", "exp", "log", "sqrt", "rsqrt", "cos", "sin", "floor",
    "abs", "minimum", "maximum", "clamp", "cat", "view", "_unsafe_view", "reshape", "unsqueeze", "squeeze", "expand",
    "permute", "transpose", "slice", "select", "clone", "repeat", "alias",
})
# Casts, where such values start (Edge programs hold dim-order copies where ATen has `_to_copy` and `clone`).
_CASTS = frozenset({"_to_copy", "_to_dim_order_copy", "_clone_dim_order"})


def _name(target: object) -> str:
    """An op's ATen name without its namespace and Edge's `_copy` ("unsqueeze" for unsqueeze_copy)."""
    op = aten_op(target)
    name = str(op._schema.name).split("::")[-1] if hasattr(op, "_schema") else ""
    return name if name in _CASTS else name.removesuffix("_copy")


def _tensor(node: object) -> torch.Tensor | None:
    value = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    return value if isinstance(value, torch.Tensor) else None


def position_floats(graph: torch.fx.Graph, constants: set[torch.fx.Node]) -> frozenset[torch.fx.Node]:
    """The float32 nodes of `graph` made from integer tensors (see the module), and the float32 constant
    placeholders (`constants`), and values made from them alone, that only those nodes read."""
    kept: set[torch.fx.Node] = set()
    fixed = set(constants)  # constants, and what the ops above make from them alone
    for node in graph.nodes:
        name = _name(node.target) if node.op == "call_function" else ""
        if name not in _KEEPS and name not in _CASTS:
            continue
        inputs = node.all_input_nodes
        if inputs and all(a in fixed for a in inputs):
            fixed.add(node)
            continue
        value = _tensor(node)
        if value is None or value.dtype != torch.float32:
            continue
        made_from = [a for a in inputs if a not in fixed]
        integers = [a for a in made_from if (t := _tensor(a)) is not None and not t.is_floating_point() and not t.is_complex()]
        if name in _CASTS and integers == made_from == inputs[:1]:
            kept.add(node)  # a cast of integers: where such values start
        elif any(a in kept for a in made_from) and all(a in kept or a in integers for a in made_from):
            kept.add(node)
    for node in reversed(graph.nodes):
        value = _tensor(node)
        if node in fixed and node.users and all(u in kept for u in node.users) and value is not None and value.dtype == torch.float32:
            kept.add(node)
    return frozenset(kept)
