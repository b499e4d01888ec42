"""The one partitioning pass (which nodes TensorRT claims, in which blocks, and why the rest is
refused) and what it keeps on the graph, free of ExecuTorch: the compile step partitions with it
before any Edge program exists, and `partitioner.TensorRTPartitioner` with it during lowering."""

from __future__ import annotations

import operator
from typing import Any

import torch
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind
from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner

from pipeline.engine.compile_spec import DimRange, TensorRTCompileSpec
from pipeline.engine.converters.registry import SYMINT_BUILTINS, aten_op, lookup, supported_ops
from pipeline.engine.support import TensorRTOperatorSupport
from pipeline.errors import CompileSpecError

# Where the compile step keeps its partitioning with the program (`node.meta["custom"]`, which
# torch.export saves and ExecuTorch's decompositions pass on): on an engine call
# {"claimed": [node names]}, on a node left outside {"refused": reason}.
RECORD_KEY = "tensorrt"


def propose(graph_module: torch.fx.GraphModule, spec: TensorRTCompileSpec) -> tuple[list[list[torch.fx.Node]], dict[str, dict[str, str]]]:
    """The one partitioning pass: maximal connected blocks of nodes TensorRT takes, in graph order,
    that reach `spec.min_block_size`, and every node refused (op and reason: no converter, a
    validator's reason, or a block too small)."""
    support = TensorRTOperatorSupport(spec)
    proposals = CapabilityBasedPartitioner(graph_module, support, allows_single_node_partition=True).propose_partitions()
    # Nodes in graph order (the partitioner's own order varies run to run), so each engine's inputs
    # and outputs, and with them its bytes, are the same for the same program.
    order = {n: i for i, n in enumerate(graph_module.graph.nodes)}
    by_name = {n.name: n for n in order}
    refused = {name: {"op": refused_op(by_name[name].target), "reason": why} for name, why in support.refused.items()}
    blocks = []
    for partition in sorted(proposals, key=lambda p: min(order[n] for n in p.nodes)):
        nodes = sorted(partition.nodes, key=order.__getitem__)
        # A size (or number) computed only for nodes outside stays outside (engines return tensors),
        # and so, in turn, does one computed only for it.
        inside: set[torch.fx.Node] = set()
        while inside != set(nodes):
            inside = set(nodes)
            nodes = [n for n in nodes if _is_tensor(n) or any(u in inside for u in n.users)]
        ops = [n for n in nodes if is_operator(n)]
        if len(ops) < spec.min_block_size:
            why = f"in a block of {len(ops)} operator(s), below min_block_size={spec.min_block_size}"
            refused.update((n.name, {"op": refused_op(n.target), "reason": why}) for n in ops)
            continue
        blocks.append(nodes)
    return blocks, refused


def mark_refused(graph_module: torch.fx.GraphModule, refused: dict[str, dict[str, str]]) -> None:
    """Keep each refusal's reason on its node, for the report of the lowered program."""
    for node in graph_module.graph.nodes:
        if node.name in refused:
            node.meta.setdefault("custom", {})[RECORD_KEY] = {"refused": refused[node.name]["reason"]}


def _is_tensor(node: torch.fx.Node) -> bool:
    val = node.meta.get("val")
    return isinstance(val, torch.Tensor) or (isinstance(val, (tuple, list)) and any(isinstance(v, torch.Tensor) for v in val))


def preserved_ops(table: dict[Any, Any]) -> list[Any]:
    """Compute ops with a converter that decomposition `table` would otherwise break up."""
    return [
        op for op in supported_ops()
        if op in table and not _is_view(op) and not lookup(op).decomposes  # type: ignore[union-attr]
    ]


def is_operator(node: torch.fx.Node) -> bool:
    """A node that counts toward `min_block_size`: any ATen operator, as Torch-TensorRT counts them
    (not getitem, symbolic-int arithmetic or sym_size)."""
    if node.op != "call_function" or node.target is operator.getitem or node.target in SYMINT_BUILTINS:
        return False
    return aten_op(node.target) is not torch.ops.aten.sym_size.int


def symbol_ranges(program: ExportedProgram, spec: TensorRTCompileSpec) -> dict[str, DimRange]:
    """Translate `spec.dynamic_shapes` (program input name -> dim -> range) into symbol ranges.

    Raises:
        CompileSpecError: an input name that is not a program input, a dim that is out of range
            or static in the program.
    """
    if not spec.dynamic_shapes:
        return {}
    inputs = {s.arg.name: s for s in program.graph_signature.input_specs if s.kind == InputKind.USER_INPUT}
    nodes = {n.name: n for n in program.graph.nodes if n.op == "placeholder"}
    out: dict[str, DimRange] = {}
    for name, dims in spec.dynamic_shapes.items():
        if name not in inputs:
            raise CompileSpecError(
                f"compile dynamic_shapes names input {name!r}, but the program's inputs are {sorted(inputs)}"
            )
        shape = nodes[name].meta["val"].shape
        for dim, rng in dims.items():
            if dim >= len(shape):
                raise CompileSpecError(f"dynamic_shapes[{name!r}][{dim}]: input {name!r} has only {len(shape)} dims")
            size = shape[dim]
            if isinstance(size, int):
                raise CompileSpecError(
                    f"dynamic_shapes[{name!r}][{dim}]: that dim is static ({size}) in the exported program; "
                    "export it with a torch.export.Dim to make it dynamic"
                )
            out[str(size.node.expr)] = rng
    return out


def _is_view(op: Any) -> bool:
    return any(a.alias_info is not None for a in op._schema.returns)


def refused_op(target: Any) -> str:
    """How the report names a node's op (`aten.add.Tensor`)."""
    return str(aten_op(target)).split(":")[0]
