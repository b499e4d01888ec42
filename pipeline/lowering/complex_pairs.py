"""Complex values as real pairs. TensorRT has no complex dtype; rotary embeddings written with
complex numbers (Llama 4, Meta's reference Llama: `torch.polar`, `view_as_complex`, a complex
product, `view_as_real`) become the same arithmetic on real tensors whose last dim of 2 holds the
real and imaginary parts, so they stay in the engine."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from pipeline.lowering.graph_rewrite import new_node

aten = torch.ops.aten
Node = torch.fx.Node

_VIEWS = (aten.view.default, aten._unsafe_view.default, aten.reshape.default)
_SAME = (aten.clone.default, aten.alias.default)


def complex_as_pairs(gm: torch.fx.GraphModule) -> int:
    """Give every complex value the ops below can make a real pair of (`[..., 2]`) and read
    `view_as_real` from the pairs; a complex value of any other op stays as it was, and so does
    what reads it. Returns how many `view_as_real` now read pairs."""
    graph = gm.graph
    pairs: dict[Node, Node] = {}
    read = 0
    for node in list(graph.nodes):
        if node.op != "call_function":
            continue
        if node.target is aten.view_as_real.default and node.args[0] in pairs:
            node.replace_all_uses_with(pairs[node.args[0]])
            read += 1
            continue
        if not _is_complex(node):
            continue
        rule = _RULES.get(node.target)
        with graph.inserting_before(node):
            pair = rule(graph, node, pairs) if rule is not None else None
        if pair is not None:
            pairs[node] = pair
    for node in list(graph.nodes):  # complex values left without readers, and their dtype checks
        if node.target is aten._assert_tensor_metadata.default and _is_complex(node.args[0]) and node.args[0] in pairs:
            graph.erase_node(node)
    graph.eliminate_dead_code()
    gm.recompile()
    return read


def _is_complex(node: Any) -> bool:
    val = node.meta.get("val") if isinstance(node, Node) else None
    return isinstance(val, torch.Tensor) and val.is_complex()


def _part(graph: torch.fx.Graph, pair: Node, index: int) -> Node:
    return new_node(graph, aten.select.int, (pair, -1, index))


def _stack(graph: torch.fx.Graph, real: Node, imag: Node) -> Node:
    parts = [new_node(graph, aten.unsqueeze.default, (part, -1)) for part in (real, imag)]
    return new_node(graph, aten.cat.default, (parts, -1))


def _from_complex(graph: torch.fx.Graph, node: Node, pairs: dict[Node, Node]) -> Node | None:
    source = node.args[0]
    return source if isinstance(source, Node) and not _is_complex(source) else None


def _polar(graph: torch.fx.Graph, node: Node, pairs: dict[Node, Node]) -> Node | None:
    magnitude, angle = node.args[0], node.args[1]
    real = new_node(graph, aten.mul.Tensor, (magnitude, new_node(graph, aten.cos.default, (angle,))))
    imag = new_node(graph, aten.mul.Tensor, (magnitude, new_node(graph, aten.sin.default, (angle,))))
    return _stack(graph, real, imag)


def _times(graph: torch.fx.Graph, node: Node, pairs: dict[Node, Node]) -> Node | None:
    a, b = node.args[0], node.args[1]
    a_pair, b_pair = pairs.get(a) if isinstance(a, Node) else None, pairs.get(b) if isinstance(b, Node) else None
    if a_pair is not None and b_pair is not None:  # (ar + i ai)(br + i bi)
        ar, ai, br, bi = (_part(graph, p, i) for p in (a_pair, b_pair) for i in (0, 1))
        mul = aten.mul.Tensor
        real = new_node(graph, aten.sub.Tensor, (new_node(graph, mul, (ar, br)), new_node(graph, mul, (ai, bi))))
        imag = new_node(graph, aten.add.Tensor, (new_node(graph, mul, (ar, bi)), new_node(graph, mul, (ai, br))))
        return _stack(graph, real, imag)
    pair, other = (a_pair, b) if a_pair is not None else (b_pair, a)
    if pair is None or _is_complex(other):
        return None
    if isinstance(other, Node):  # a real tensor scales both parts
        other = new_node(graph, aten.unsqueeze.default, (other, -1))
    return new_node(graph, aten.mul.Tensor, (pair, other))


def _sum(graph: torch.fx.Graph, node: Node, pairs: dict[Node, Node]) -> Node | None:
    a, b = node.args[0], node.args[1]
    if not (isinstance(a, Node) and isinstance(b, Node) and a in pairs and b in pairs):
        return None
    return new_node(graph, node.target, (pairs[a], pairs[b], *node.args[2:]), dict(node.kwargs))


def _source(node: Node, pairs: dict[Node, Node]) -> Node | None:
    """The pair of `node`'s first argument, if it has one."""
    source = node.args[0]
    return pairs.get(source) if isinstance(source, Node) else None


def _unsqueeze(graph: torch.fx.Graph, node: Node, pairs: dict[Node, Node]) -> Node | None:
    pair, dim = _source(node, pairs), int(node.args[1])  # type: ignore[arg-type]
    if pair is None:
        return None
    return new_node(graph, aten.unsqueeze.default, (pair, dim if dim >= 0 else dim - 1))


def _view(graph: torch.fx.Graph, node: Node, pairs: dict[Node, Node]) -> Node | None:
    pair, shape = _source(node, pairs), node.args[1]
    if pair is None or not isinstance(shape, (list, tuple)):
        return None
    return new_node(graph, aten.view.default, (pair, [*shape, 2]))


def _same(graph: torch.fx.Graph, node: Node, pairs: dict[Node, Node]) -> Node | None:
    return _source(node, pairs)


def _copy(graph: torch.fx.Graph, node: Node, pairs: dict[Node, Node]) -> Node | None:
    """A copy that keeps the value complex: to the real dtype of its parts."""
    pair = _source(node, pairs)
    if pair is None:
        return None
    return new_node(graph, aten._to_copy.default, (pair,), {"dtype": node.meta["val"].real.dtype})


_RULES: dict[Any, Callable[[torch.fx.Graph, Node, dict[Node, Node]], Node | None]] = {
    aten.view_as_complex.default: _from_complex,
    aten.polar.default: _polar,
    aten.mul.Tensor: _times,
    aten.add.Tensor: _sum,
    aten.sub.Tensor: _sum,
    aten.unsqueeze.default: _unsqueeze,
    **dict.fromkeys(_VIEWS, _view),
    **dict.fromkeys(_SAME, _same),
    aten._to_copy.default: _copy,
}
