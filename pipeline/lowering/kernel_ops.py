"""Fewer kernels between engines: what ExecuTorch's Edge decompositions leave outside TensorRT, made
smaller without changing any value. Each kernel call of a program is a launch (in a CUDA graph a
node, in ExecuTorch's runtime an instruction), and a decomposed op (`hardsigmoid`: add, clamp, clamp,
div) brings copies of its scalar constants with it, made at every call.

- A `_to_dim_order_copy` of a constant (weight, buffer no method writes, lifted constant) in the
  default dim order is a constant: the cast is made once, at build, into a constant named by its
  content (as every constant the pipeline makes).
- `clamp(clamp(x, min=a), max=b)` is `clamp(x, a, b)` (both are max with a, then min with b).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind, InputSpec, TensorArgument

from pipeline.lowering.constant_fold import content_digest

_COPY = "dim_order_ops._to_dim_order_copy.default"
_CLAMP = "aten.clamp.default"
_FIXED = (InputKind.PARAMETER, InputKind.CONSTANT_TENSOR, InputKind.BUFFER)


def fewer_kernels(program: ExportedProgram) -> int:
    """Rewrite `program`'s kernel calls in place as the module says; returns how many calls went."""
    gone = _drop_constant_copies(program) + _merge_clamps(program.graph)
    if gone:
        program.graph.eliminate_dead_code()
        program.graph_module.recompile()
    return gone


def _drop_constant_copies(program: ExportedProgram) -> int:
    constants = _constant_inputs(program)
    sources, gone = set(), 0
    for node in list(program.graph.nodes):
        source = node.args[0] if _is(node, _COPY) else None
        if (not isinstance(source, torch.fx.Node) or source.name not in constants or not _default_layout(source, node)
                or any(user.op == "output" for user in node.users)):  # an output is the program's own memory
            continue
        value = constants[source.name].to(node.meta["val"].dtype).contiguous()
        node.replace_all_uses_with(_constant(program, value, node.meta["val"]))
        program.graph.erase_node(node)
        sources.add(source)
        gone += 1
    _drop_unread(program, [s for s in sources if not s.users])
    return gone


def _constant_inputs(program: ExportedProgram) -> dict[str, torch.Tensor]:
    """Placeholders whose value is fixed in the program (parameters, constants, buffers no method of
    it writes), by name, with their values."""
    signature = program.graph_signature
    written = set(signature.buffers_to_mutate.values())
    out = {}
    for spec in signature.input_specs:
        if spec.kind in _FIXED and spec.target not in written:
            value = program.constants.get(spec.target, program.state_dict.get(spec.target))
            if isinstance(value, torch.Tensor):
                out[spec.arg.name] = value  # type: ignore[union-attr]
    return out


def _default_layout(source: torch.fx.Node, copy: torch.fx.Node) -> bool:
    before, after = source.meta.get("val"), copy.meta.get("val")
    if not isinstance(before, torch.Tensor) or not isinstance(after, torch.Tensor):
        return False
    dim_order = copy.kwargs.get("dim_order")
    default = dim_order is None or (isinstance(dim_order, (list, tuple)) and list(dim_order) == list(range(before.dim())))
    return (before.shape == after.shape and default
            and copy.kwargs.get("layout") in (None, torch.strided))


def _constant(program: ExportedProgram, value: torch.Tensor, val: torch.Tensor) -> torch.fx.Node:
    """The placeholder of constant `value` (added before the user inputs when the program lacks it)."""
    name = f"_folded_{content_digest(value)}"  # by content: methods share equal constants, never clash
    existing = next(iter(program.graph.find_nodes(op="placeholder", target=name)), None)
    if existing is not None:
        return existing
    specs = program.graph_signature.input_specs
    at = next((i for i, s in enumerate(specs) if s.kind == InputKind.USER_INPUT), len(specs))
    placeholders = list(program.graph.find_nodes(op="placeholder"))  # in the order of the input specs
    before = placeholders[at] if at < len(placeholders) else next(n for n in program.graph.nodes if n.op != "placeholder")
    with program.graph.inserting_before(before):
        node = program.graph.placeholder(name)
    node.meta["val"] = val
    program.constants[name] = value
    specs.insert(at, InputSpec(InputKind.CONSTANT_TENSOR, TensorArgument(name), name))
    return node


def _drop_unread(program: ExportedProgram, placeholders: list[torch.fx.Node]) -> None:
    """Remove constant inputs the folding left unread (the method no longer carries them)."""
    specs = program.graph_signature.input_specs
    for node in placeholders:
        spec = next(s for s in specs if getattr(s.arg, "name", None) == node.name)
        program.graph.erase_node(node)
        specs.remove(spec)
        for store in (program.constants, program.state_dict):
            store.pop(str(spec.target), None)


def _merge_clamps(graph: torch.fx.Graph) -> int:
    gone = 0
    for node in list(graph.nodes):
        if not _is(node, _CLAMP):
            continue
        inner = node.args[0]
        low, high = _bounds(node)
        if not (isinstance(inner, torch.fx.Node) and _is(inner, _CLAMP) and len(inner.users) == 1
                and low is None and high is not None):
            continue
        inner_low, inner_high = _bounds(inner)
        if inner_low is None or inner_high is not None:
            continue
        node.args, node.kwargs = (inner.args[0], inner_low, high), {}
        gone += 1
    return gone


def _is(node: torch.fx.Node, name: str) -> bool:
    return node.op == "call_function" and getattr(node.target, "__name__", None) == name


def _bounds(node: torch.fx.Node) -> tuple[Any, Any]:
    args = [*node.args[1:], None, None]
    low = node.kwargs.get("min", args[0])
    high = node.kwargs.get("max", args[1])
    return low, high
