"""The values an integer input of a program may take, read from how its exported graph uses it: an
input that indexes a table (token ids into an embedding, positions into a KV cache) may only hold
indices inside it. The bounds go into the program's record (`record.py`), and the runtime refuses a
call outside them before anything runs (`tensor_spec.check_inputs`): TensorRT's gathers and cache
updates do not check indices, so a value past a table's end would read or write other memory.

The analysis follows each input forward as `input + c` (c an int) or `input + c + arange(L)` (the
positions `start .. start + L - 1` a decoder writes), through the ops that keep values (views,
copies, element selection, adding constants), to the ops that index: `embedding`, `index`,
`index_put`, `index_select`, `gather`, `index_copy`, `scatter`. An input no indexing op reads keeps
the bounds the caller declares (a config's `low`/`high`), if any."""

from __future__ import annotations

import operator
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.export import ExportedProgram

aten = torch.ops.aten
# Where a compiled program's input placeholders keep their bounds (`Bounds.to_json`); `.pt2` files
# keep them beside the program (`intermediates.py`), `export` hands them to the record.
INPUT_VALUES = "pipeline_input_values"
# Ops whose output holds the values of their first tensor argument (or a subset of them).
_KEEPS = {aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.unsqueeze.default,
          aten.squeeze.dim, aten.squeeze.dims, aten.squeeze.default, aten.expand.default, aten.clone.default,
          aten.alias.default, aten.contiguous.default, aten._to_copy.default, aten.flatten.using_ints,
          aten.permute.default, aten.t.default, aten.transpose.int, aten.detach.default, aten.lift_fresh_copy.default,
          aten.slice.Tensor, aten.repeat.default}
# Indexing ops: where the index tensor is in the arguments, and which dim of the first argument it indexes.
_INDEX_AT = {aten.embedding.default: (1, None), aten.index_select.default: (2, 1), aten.gather.default: (2, 1),
             aten.index_copy.default: (2, 1), aten.index_copy_.default: (2, 1), aten.scatter.src: (2, 1),
             aten.scatter.value: (2, 1), aten.scatter_add.default: (2, 1)}
_INDEX_LISTS = {aten.index.Tensor, aten.index_put.default, aten.index_put_.default, aten._unsafe_index.Tensor,
                aten._unsafe_index_put.default}


@dataclass(frozen=True)
class _Form:
    """Values `input + offset (+ arange(span))`: `span` None, an int, or (input, dim) whose size it is."""

    input: int
    offset: int = 0
    span: int | tuple[int, int] | None = None


@dataclass
class Bounds:
    """What the graph asks of one input: values in [low, high], and with `end`, value + the size of
    that (input, dim) at most its limit."""

    low: int | None = None
    high: int | None = None
    end: tuple[int, int, int] | None = None

    def to_json(self) -> dict[str, Any]:
        return {"values": [self.low, self.high], **({"end": list(self.end)} if self.end else {})}

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Bounds:
        low, high = doc["values"]
        end = doc.get("end")
        return cls(int(low), int(high), None if end is None else (int(end[0]), int(end[1]), int(end[2])))

    def require(self, low: int, high: int, end: tuple[int, int, int] | None = None) -> None:
        self.low = low if self.low is None else max(self.low, low)
        self.high = high if self.high is None else min(self.high, high)
        if end is not None and (self.end is None or end[2] < self.end[2]):
            self.end = end


def value_bounds(program: ExportedProgram, declared: Sequence[tuple[int, int] | None] = ()) -> list[Bounds | None]:
    """Per user input of `program`: the bounds its indexing ops ask of its values, else the `declared`
    inclusive range (a config's [low, high - 1]) for integer inputs, else None.

    Args:
        program: a method as `torch.export` gives it (before the compile step replaces ops by engines).
        declared: an inclusive range per input, or None, used where no indexing op bounds the input.
    """
    names = list(program.graph_signature.user_inputs)
    nodes = {n.name: n for n in program.graph.nodes if n.op == "placeholder"}
    forms, dims = _inputs(nodes, names)
    bounds: dict[int, Bounds] = {}
    for node in program.graph.nodes:
        if node.op != "call_function":
            continue
        form = _follow(node, forms, dims)
        if form is not None:
            forms[node] = form
        for index, size in _indexes(node):
            found = forms.get(index)
            if isinstance(found, _Form) and isinstance(size, int):
                _require(bounds.setdefault(found.input, Bounds()), found, size)
    out: list[Bounds | None] = []
    for i, name in enumerate(names):
        found = bounds.get(i)
        range_ = declared[i] if i < len(declared) else None
        if found is None and range_ is not None and _form_of(nodes[name], forms):
            found = Bounds(*range_)
        out.append(found)
    return out


def _inputs(nodes: dict[str, torch.fx.Node], names: list[str]) -> tuple[dict[torch.fx.Node, Any], dict[str, tuple[int, int]]]:
    """The integer inputs as forms of themselves, and each symbolic size -> the (input, dim) it sizes."""
    forms: dict[torch.fx.Node, Any] = {}
    dims: dict[str, tuple[int, int]] = {}
    for i, name in enumerate(names):
        val = nodes[name].meta.get("val")
        if not isinstance(val, torch.Tensor):
            continue
        for d, size in enumerate(val.shape):
            if not isinstance(size, int):
                dims.setdefault(str(size.node.expr), (i, d))
        if not val.dtype.is_floating_point and val.dtype != torch.bool:
            forms[nodes[name]] = _Form(i)
    return forms, dims


def set_input_values(program: ExportedProgram, bounds: Sequence[Bounds | None]) -> None:
    """Put each user input's bounds (or None) into its placeholder's meta (`INPUT_VALUES`)."""
    nodes = {n.name: n for n in program.graph.nodes if n.op == "placeholder"}
    for name, found in zip(program.graph_signature.user_inputs, bounds):
        nodes[name].meta[INPUT_VALUES] = None if found is None else found.to_json()


def input_values(program: ExportedProgram) -> list[dict[str, Any] | None]:
    """Each user input's bounds as `set_input_values` stored them (None where none, or never set)."""
    nodes = {n.name: n for n in program.graph.nodes if n.op == "placeholder"}
    return [nodes[name].meta.get(INPUT_VALUES) for name in program.graph_signature.user_inputs]


def _form_of(node: torch.fx.Node, forms: dict[torch.fx.Node, Any]) -> bool:
    return isinstance(forms.get(node), _Form)


def _require(bounds: Bounds, form: _Form, size: int) -> None:
    """`input + offset + arange(span)` indexes `size` entries: input in [-offset, size - 1 - offset -
    (span - 1)]; a symbolic span becomes an `end` bound."""
    low, high = -form.offset, size - 1 - form.offset
    if isinstance(form.span, int):
        bounds.require(low, high - (form.span - 1))
    elif isinstance(form.span, tuple):
        bounds.require(low, high, (form.span[0], form.span[1], size - form.offset))
    else:
        bounds.require(low, high)


def _follow(node: torch.fx.Node, forms: dict[torch.fx.Node, Any], dims: dict[str, tuple[int, int]]) -> Any:
    """The form of `node`'s values, if it keeps an input's values (shifted), or is an arange from 0."""
    target, args = node.target, node.args
    if target in (aten.arange.default, aten.arange.start, aten.arange.start_step):
        start, end, step = (0, args[0], 1) if target is aten.arange.default else (args[0], args[1], args[2] if len(args) > 2 else 1)
        if start == 0 and step == 1:
            return ("arange", _size(end, dims))
        return None
    first = forms.get(args[0]) if args and isinstance(args[0], torch.fx.Node) else None
    if target in _KEEPS:
        return first if isinstance(first, _Form) else None
    if target is aten.copy.default and len(args) > 1:
        source = forms.get(args[1])
        return source if isinstance(source, _Form) else None
    if target is aten.select.int and isinstance(first, _Form) and isinstance(args[2], int) and args[2] >= 0:
        return _Form(first.input, first.offset + args[2]) if first.span is not None else first
    if target in (aten.add.Tensor, aten.sub.Tensor, operator.add) and len(args) == 2:
        return _shift(node, args, forms)
    return None


def _shift(node: torch.fx.Node, args: Any, forms: dict[torch.fx.Node, Any]) -> _Form | None:
    sign = -1 if node.target is aten.sub.Tensor else 1
    a, b = (forms.get(x) if isinstance(x, torch.fx.Node) else x for x in args)
    if node.kwargs.get("alpha", 1) != 1:
        return None
    if isinstance(a, _Form) and isinstance(b, int):
        return _Form(a.input, a.offset + sign * b, a.span)
    if sign == 1 and isinstance(a, int) and isinstance(b, _Form):
        return _Form(b.input, b.offset + a, b.span)
    if sign == 1 and isinstance(a, tuple) and isinstance(b, _Form) and b.span is None:
        return _Form(b.input, b.offset, a[1])
    if sign == 1 and isinstance(b, tuple) and isinstance(a, _Form) and a.span is None:
        return _Form(a.input, a.offset, b[1])
    return None


def _size(end: Any, dims: dict[str, tuple[int, int]]) -> int | tuple[int, int] | None:
    if isinstance(end, int):
        return end
    val = end.meta.get("val") if isinstance(end, torch.fx.Node) else None
    return dims.get(str(val.node.expr)) if isinstance(val, torch.SymInt) else None


def _indexes(node: torch.fx.Node) -> list[tuple[torch.fx.Node, int | None]]:
    """The index tensors `node` reads, each with the number of entries it indexes (None: unknown)."""
    if node.target in _INDEX_AT:
        at, dim_at = _INDEX_AT[node.target]
        table = node.args[0].meta.get("val")
        dim = 0 if dim_at is None else node.args[dim_at]
        index = node.args[at] if at < len(node.args) else None
        if not isinstance(index, torch.fx.Node) or not isinstance(dim, int):
            return []
        return [(index, _dim_size(table, dim))]
    if node.target in _INDEX_LISTS and len(node.args) > 1:
        table = node.args[0].meta.get("val")
        return [(index, _dim_size(table, k)) for k, index in enumerate(node.args[1])
                if isinstance(index, torch.fx.Node)]
    return []


def _dim_size(table: Any, dim: int) -> int | None:
    if not isinstance(table, torch.Tensor) or not -table.dim() <= dim < table.dim():
        return None
    size = table.shape[dim]
    return size if isinstance(size, int) else None
