"""The float32 values an fp16 or bf16 engine keeps in float32, as the model computes them: the ones
16 bits cannot hold.

- **Values made from integers alone.** A decoder's rotary angles are positions times frequencies,
  hundreds to thousands of radians, which fp16 holds to within 0.25 rad at position 1000 (its
  spacing there is 0.5), turning the keys and queries of every later position; relative-position
  terms made from distances (T5's logarithm of them) are such values too. A cast of an integer
  tensor to float32 starts them.
- **Normalization statistics.** An RMSNorm or a layer norm written as ops casts its half-precision
  input up to float32 before squaring and averaging it: one activation of 256 or more squares past
  fp16's largest value (65504), the mean becomes infinite and the normalized row zeros. Trained
  decoders carry such activations in a few channels of their residual stream. A cast of a half-
  precision value up to float32 whose ops reach a mean, a sum or a variance starts them.

From such a cast, what cheap elementwise and layout ops make from those values, constants and integers
stays float32, with the float32 constants (and what is made from them alone) that only those ops read;
the first other op (the cast back down, a product with an activation, a matrix product) takes its
input in the compute dtype as before."""

from __future__ import annotations

import heapq

import torch

from pipeline.engine.converters.registry import aten_op

# What keeps such a value such a value: elementwise arithmetic and math, reductions and layout (by ATen
# name; Edge programs spell the layout ops `<name>_copy`).
_REDUCTIONS = frozenset({"mean", "sum", "var"})
_KEEPS = _REDUCTIONS | frozenset({
    "mul", "add", "sub", "rsub", "div", "neg", "reciprocal", "pow", "exp", "log", "sqrt", "rsqrt", "cos", "sin", "floor",
    "abs", "minimum", "maximum", "clamp", "cat", "view", "_unsafe_view", "reshape", "unsqueeze", "squeeze", "expand",
    "permute", "transpose", "slice", "select", "clone", "repeat", "alias",
})
# Products, which keep a value made from integers such a value too (rotary angles as transformers writes
# them: frequencies @ positions), never a normalization's.
_PRODUCTS = frozenset({"mm", "bmm", "matmul"})
# Casts, where such values start (Edge programs hold dim-order copies where ATen has `_to_copy` and `clone`).
_CASTS = frozenset({"_to_copy", "_to_dim_order_copy", "_clone_dim_order"})
_HALF = (torch.float16, torch.bfloat16)


def _name(target: object) -> str:
    """An op's ATen name without its namespace and Edge's `_copy` ("unsqueeze" for unsqueeze_copy)."""
    op = aten_op(target)
    name = str(op._schema.name).split("::")[-1] if hasattr(op, "_schema") else ""
    return name if name in _CASTS else name.removesuffix("_copy")


def _tensor(node: object) -> torch.Tensor | None:
    value = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    return value if isinstance(value, torch.Tensor) else None


def _float32(node: torch.fx.Node) -> bool:
    value = _tensor(node)
    return value is not None and value.dtype == torch.float32


def _integer(node: torch.fx.Node) -> bool:
    value = _tensor(node)
    return value is not None and not value.is_floating_point() and not value.is_complex()


def kept_float32(graph: torch.fx.Graph, constants: set[torch.fx.Node]) -> frozenset[torch.fx.Node]:
    """The nodes of `graph` an engine of a half precision keeps in float32 (see the module); `constants`:
    its constant placeholders."""
    order = {n: i for i, n in enumerate(graph.nodes)}  # the graph's (topological) order, which islands grow in
    fixed = set(constants)  # constants, and what the ops above make from them alone
    for node in graph.nodes:
        if _name(node.target) in _KEEPS | _PRODUCTS | _CASTS and node.all_input_nodes and all(a in fixed for a in node.all_input_nodes):
            fixed.add(node)
    kept: set[torch.fx.Node] = set()
    for seed in graph.nodes:
        if seed in fixed or _name(seed.target) not in _CASTS or not _float32(seed) or not seed.all_input_nodes:
            continue
        source = seed.all_input_nodes[0]
        value = _tensor(source)
        if _integer(source):
            kept |= _island(seed, fixed, _KEEPS | _PRODUCTS | _CASTS, order)
        elif value is not None and value.dtype in _HALF:
            island = _island(seed, fixed, _KEEPS | _CASTS, order)
            if any(_name(n.target) in _REDUCTIONS for n in island):
                kept |= island
    for node in reversed(graph.nodes):  # constants only kept values read, and what is made from them alone
        if node in fixed and node.users and all(u in kept for u in node.users) and _float32(node):
            kept.add(node)
    return frozenset(kept)


def _island(seed: torch.fx.Node, fixed: set[torch.fx.Node], ops: frozenset[str],
            order: dict[torch.fx.Node, int]) -> set[torch.fx.Node]:
    """`seed` and the float32 values `ops` make from it, constants and integers alone: its readers
    visited in graph order, so a node's inputs are settled before it is."""
    island, todo = {seed}, [(order[u], u) for u in seed.users]
    heapq.heapify(todo)
    while todo:
        _, node = heapq.heappop(todo)
        if node in island or _name(node.target) not in ops or not _float32(node):
            continue
        if all(a in island or a in fixed or _integer(a) for a in node.all_input_nodes):
            island.add(node)
            for user in node.users:
                heapq.heappush(todo, (order[user], user))
    return island
