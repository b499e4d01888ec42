"""`TensorRTPartitioner`: claims maximal connected subgraphs of nodes the registry supports,
drops those below `min_block_size`, and leaves the rest to the next partitioner in the chain."""

from __future__ import annotations

import operator
from dataclasses import dataclass, field
from typing import Any

import torch
from executorch.exir.backend.partitioner import DelegationSpec, Partitioner, PartitionResult
from executorch.exir.backend.utils import tag_constant_data
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind
from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner

from pipeline.delegate.blob import BACKEND_ID
from pipeline.engine.compile_spec import DimRange, TensorRTCompileSpec
from pipeline.engine.converters.registry import SYMINT_BUILTINS, aten_op, lookup, supported_ops
from pipeline.engine.support import TensorRTOperatorSupport
from pipeline.errors import CompileSpecError
from pipeline.executorch_api import decomposition_table
from pipeline.lowering import backend as _backend  # noqa: F401  (ExecuTorch finds TensorRTBackend by subclass)
from pipeline.runtime.engine_op import is_engine_call

# Where the compile step keeps its partitioning with the program (`node.meta["custom"]`, which
# torch.export saves and ExecuTorch's decompositions pass on): on an engine call
# {"claimed": [node names]}, on a node left outside {"refused": reason}.
RECORD_KEY = "tensorrt"


@dataclass
class PartitionRecord:
    """What one partitioning pass decided: claimed nodes per tag, refused nodes with their op and reason."""

    claimed: dict[str, list[str]] = field(default_factory=dict)
    refused: dict[str, dict[str, str]] = field(default_factory=dict)


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
    refused = {name: {"op": _name(by_name[name].target), "reason": why} for name, why in support.refused.items()}
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
            refused.update((n.name, {"op": _name(n.target), "reason": why}) for n in ops)
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


def _kept(node: torch.fx.Node) -> dict[str, Any]:
    return (node.meta.get("custom") or {}).get(RECORD_KEY) or {}


class TensorRTPartitioner(Partitioner):
    """ExecuTorch partitioner for TensorRT.

    Engine calls of an engine-bearing program (`tensorrt.execute_engine`) are always claimed, each
    as a delegate of its own; with `claim_ops`, maximal subgraphs of convertible ops are claimed too
    and get engines built in `preprocess`.

    Args:
        spec: the compile spec every engine of this partitioner is built with.
        claim_ops: also claim convertible ATen ops (False: engine calls only).
    """

    def __init__(self, spec: TensorRTCompileSpec | None = None, claim_ops: bool = True) -> None:
        self.compile_spec = spec or TensorRTCompileSpec()
        self.claim_ops = claim_ops
        super().__init__()
        self.delegation_spec = DelegationSpec(BACKEND_ID, self.compile_spec.to_compile_specs())
        self.record = PartitionRecord()

    def ops_to_not_decompose(self, ep: ExportedProgram) -> tuple[list[Any], Any]:
        """Compute ops with a converter that the default decomposition would otherwise break up.

        The filter keeps a node whole only if it lies in a block TensorRT will claim (the same
        partitioning pass, `propose`) and was not refused while partitioning (ExecuTorch asks again
        after lowering to check nothing preserved is left).
        """
        if not self.claim_ops:  # it claims engine calls only: keeping ops whole would strand them
            return [], None
        keep = preserved_ops(decomposition_table())
        spec = self.compile_spec.with_symbol_ranges(symbol_ranges(ep, self.compile_spec))
        blocks, _ = propose(ep.graph_module, spec)
        claimable = {n.name for block in blocks for n in block}  # a node in a block too small is decomposed

        def accept(node: torch.fx.Node) -> bool:
            return node.name in claimable and node.name not in self.record.refused

        return keep, accept

    def partition(self, exported_program: ExportedProgram) -> PartitionResult:
        """Tag TensorRT partitions of `exported_program` (Edge dialect)."""
        graph_module = exported_program.graph_module
        ranges = symbol_ranges(exported_program, self.compile_spec)
        spec = self.compile_spec.with_symbol_ranges(ranges)
        tags: dict[str, DelegationSpec] = {}
        record = PartitionRecord()
        for node in graph_module.graph.nodes:
            if is_engine_call(node):
                tag = f"tensorrt_{len(tags)}"
                node.meta["delegation_tag"] = tag
                for user in node.users:  # the getitems of its outputs
                    user.meta["delegation_tag"] = tag
                tags[tag] = DelegationSpec(BACKEND_ID, spec.to_compile_specs())
                record.claimed[tag] = list(_kept(node).get("claimed", [node.name]))
            elif node.op == "call_function" and "refused" in _kept(node):  # the compile step's refusal
                record.refused[node.name] = {"op": _name(node.target), "reason": _kept(node)["refused"]}
        if self.claim_ops:
            self._claim_ops(graph_module, spec, tags, record)
        tag_constant_data(exported_program)
        _untag_state(exported_program)
        self.record = record
        return PartitionResult(tagged_exported_program=exported_program, partition_tags=tags)

    def _claim_ops(self, graph_module: torch.fx.GraphModule, spec: TensorRTCompileSpec, tags: dict[str, DelegationSpec],
                   record: PartitionRecord) -> None:
        blocks, refused = propose(graph_module, spec)
        record.refused.update(refused)
        for nodes in blocks:
            tag = f"tensorrt_{len(tags)}"
            for n in nodes:
                n.meta["delegation_tag"] = tag
            tags[tag] = DelegationSpec(BACKEND_ID, spec.to_compile_specs())
            record.claimed[tag] = [n.name for n in nodes if is_operator(n)]


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


def _name(target: Any) -> str:
    return str(aten_op(target)).split(":")[0]


def _untag_state(program: ExportedProgram) -> None:
    """Buffers that engines take as inputs stay the program's: the compile step builds every other
    buffer and weight into the engines, so these are state (a KV cache some method writes), read at
    run time. (`tag_constant_data` would hand them to the delegate as constant data.)"""
    for node in program.graph_module.graph.nodes:
        if node.op == "placeholder" and node.name in program.graph_signature.inputs_to_buffers and any(
                is_engine_call(user) and node in user.args[0] for user in node.users):  # an input, not the engine
            node.meta.pop("delegation_tag", None)
