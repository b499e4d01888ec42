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
from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
from torch.fx.passes.operator_support import OperatorSupportBase

from pipeline.delegate.blob import BACKEND_ID
from pipeline.engine.compile_spec import TensorRTCompileSpec
from pipeline.executorch_api import decomposition_table
from pipeline.kernels.calls import is_kernel_call
from pipeline.lowering import backend as _backend  # noqa: F401  (ExecuTorch finds TensorRTBackend by subclass)
from pipeline.lowering.partitioning import RECORD_KEY, is_operator, preserved_ops, propose, refused_op, symbol_ranges
from pipeline.lowering.plans import is_planned
from pipeline.runtime.engine_op import is_engine_call


@dataclass
class PartitionRecord:
    """What one partitioning pass decided: claimed nodes per tag, refused nodes with their op and reason."""

    claimed: dict[str, list[str]] = field(default_factory=dict)
    refused: dict[str, dict[str, str]] = field(default_factory=dict)


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
        for group in _planned_groups(graph_module):
            tag = f"tensorrt_{len(tags)}"
            for node in group:
                node.meta["delegation_tag"] = tag
                for user in node.users:  # the getitems of its outputs
                    if user.target is operator.getitem:
                        user.meta["delegation_tag"] = tag
            tags[tag] = DelegationSpec(BACKEND_ID, spec.to_compile_specs())
            record.claimed[tag] = [name for node in group if is_engine_call(node)
                                   for name in _kept(node).get("claimed", [node.name])]
        for node in graph_module.graph.nodes:
            if node.op == "call_function" and "refused" in _kept(node) and not is_planned(node):  # the compile step's refusal
                record.refused[node.name] = {"op": refused_op(node.target), "reason": _kept(node)["refused"]}
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


class _Planned(OperatorSupportBase):
    def is_node_supported(self, submodules: Any, node: torch.fx.Node) -> bool:
        return is_planned(node) or (node.target is operator.getitem and isinstance(node.args[0], torch.fx.Node)
                                    and is_planned(node.args[0]))


def _planned_groups(graph_module: torch.fx.GraphModule) -> list[list[torch.fx.Node]]:
    """The calls each delegate takes: engine calls one by one; where the program calls the project's
    kernels (`compile.decode_kernels`), each maximal connected run of engine and kernel calls (no other
    op between them) is one delegate, which runs them as a plan (`lowering/plans.py`)."""
    nodes = list(graph_module.graph.nodes)
    if not any(is_kernel_call(n) for n in nodes):
        return [[n] for n in nodes if is_engine_call(n)]
    order = {n: i for i, n in enumerate(nodes)}
    proposals = CapabilityBasedPartitioner(graph_module, _Planned(), allows_single_node_partition=True).propose_partitions()
    groups = [sorted((n for n in p.nodes if is_planned(n)), key=order.__getitem__) for p in proposals]
    return sorted((g for g in groups if g), key=lambda g: order[g[0]])


def _untag_state(program: ExportedProgram) -> None:
    """Buffers that engines take as inputs stay the program's: the compile step builds every other
    buffer and weight into the engines, so these are state (a KV cache some method writes), read at
    run time. (`tag_constant_data` would hand them to the delegate as constant data.)"""
    for node in program.graph_module.graph.nodes:
        if node.op == "placeholder" and node.name in program.graph_signature.inputs_to_buffers and any(
                is_engine_call(user) and node in user.args[0] for user in node.users):  # an input, not the engine
            node.meta.pop("delegation_tag", None)
