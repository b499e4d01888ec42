"""The lowering report of a program: per method, the nodes TensorRT claimed, the nodes left over
with the reason each was refused, and every delegate (engines with bytes and, when built while
lowering, build seconds)."""

from __future__ import annotations

import operator
from collections.abc import Mapping
from typing import Any

from executorch.exir.lowered_backend_module import LoweredBackendModule
from torch.export import ExportedProgram

from pipeline.delegate import blob, plan
from pipeline.engine.converters.registry import aten_op
from pipeline.lowering.partitioner import PartitionRecord


def delegates(program: ExportedProgram) -> list[LoweredBackendModule]:
    """The lowered backend modules a program calls, in call order."""
    gm = program.graph_module
    out = []
    for node in gm.graph.nodes:
        if node.op == "call_function" and "executorch_call_delegate" in str(node.target):
            out.append(getattr(gm, node.args[0].target))
    return out


def engine_of(module: LoweredBackendModule) -> tuple[blob.BlobMetadata, bytes]:
    """The blob metadata and the engine of a lowered TensorRT delegate (the engine is the module's named data)."""
    meta, ref = blob.decode(module.processed_bytes)
    store = module.named_data_store_output
    groups = [store.pte_data, *store.external_data.values()] if store is not None else []
    named = {key: store.buffers[entry.buffer_index] for group in groups for key, entry in group.items()}  # type: ignore[union-attr]
    return meta, bytes(blob.engine_bytes(ref, named))


def engine_entry(module: LoweredBackendModule) -> dict[str, Any]:
    """Report entry for one delegate: backend, bytes, and for TensorRT the engine and its build."""
    entry: dict[str, Any] = {"backend": module.backend_id, "blob_bytes": len(module.processed_bytes)}
    if module.backend_id == blob.BACKEND_ID:
        meta, refs = plan.delegate_view(module.processed_bytes)
        engines = [r for r in refs if isinstance(r, blob.EngineRef)]
        info = module.meta.get("_delegate_info_meta") or {}
        if plan.is_plan(module.processed_bytes):  # engines and the project's kernels in turn (`delegate/plan.py`)
            entry["plan"] = {k: info.get(k) for k in ("plan_steps", "engines", "kernels", "attention_kernels", "kernel_weight_bytes")}
        entry.update(
            engine_bytes=sum(r.size for r in engines),
            engine_key=engines[0].key if len(engines) == 1 else [r.key for r in engines],
            build_seconds=None if info.get("build_seconds") is None else round(float(info["build_seconds"]), 4),
            num_layers=info.get("num_layers"),
            profiles=info.get("profiles"),  # optimization profiles (0: static shapes)
            quantized=info.get("quantized"),  # what the engine stores quantized (`quantize.QuantizationPlan.summary`)
            # its network, run by the CPU reference executor on the example inputs, against its graph
            # run eagerly (`lowering.engine_check`): {"max_rel_error", "layers"} or {"skipped": why}
            reference=info.get("reference"),
            inputs=[{"name": b.name, "dtype": b.dtype, "shape": list(b.shape)} for b in meta.inputs],
            outputs=[{"name": b.name, "dtype": b.dtype, "shape": list(b.shape)} for b in meta.outputs],
        )
    return entry


def method_report(program: ExportedProgram, record: PartitionRecord | None) -> dict[str, Any]:
    """Report of one lowered method."""
    record = record or PartitionRecord()
    entries = [engine_entry(m) for m in delegates(program)]
    left = []
    for node in program.graph.nodes:
        if node.op != "call_function" or node.target is operator.getitem or "executorch_call_delegate" in str(node.target):
            continue
        reason = record.refused.get(node.name, {}).get("reason", "not part of any TensorRT engine")
        left.append({"node": node.name, "op": str(aten_op(node.target)).split(":")[0], "reason": reason})
    trt_entries = [e for e in entries if e["backend"] == blob.BACKEND_ID]
    return {
        "claimed_by_tensorrt": sum(len(v) for v in record.claimed.values()),
        "claimed_nodes": {tag: nodes for tag, nodes in record.claimed.items()},
        "left_over": left,
        "other_delegates": [e for e in entries if e["backend"] != blob.BACKEND_ID],
        "num_engines": len(trt_entries),
        "engine_bytes": sum(e["engine_bytes"] for e in trt_entries),
        # Known for engines built while lowering; engines built by the compile step log theirs.
        "build_seconds": round(sum(e["build_seconds"] or 0.0 for e in trt_entries), 4),
        "engines": trt_entries,
    }


def lowering_report(programs: Mapping[str, ExportedProgram], records: Mapping[str, PartitionRecord]) -> dict[str, Any]:
    """Report of every method of a lowered program (`executorch_api.edge_programs`)."""
    return {name: method_report(ep, records.get(name)) for name, ep in programs.items()}


