"""Operator support: whether TensorRT can take a node, and why not. Derived from the converter
registry alone (its records and their capability validators)."""

from __future__ import annotations

import difflib
import operator
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch.fx.passes.operator_support import OperatorSupportBase

from pipeline.dtypes import ENGINE_DTYPES
from pipeline.engine.compile_spec import TensorRTCompileSpec
from pipeline.engine.converters.registry import aten_op, lookup
from pipeline.errors import CompileSpecError


def refusal_reason(node: torch.fx.Node, spec: TensorRTCompileSpec) -> str | None:
    """Why TensorRT cannot take `node` (a sentence), or None when it can."""
    if node.op != "call_function":
        return f"{node.op} nodes are not operators"
    if node.target is operator.getitem:
        return None
    name = _op_name(node.target)
    if name.startswith(("pipeline.decode_product", "pipeline.decode_attention")):
        return "runs in the project's decode kernels (compile.decode_kernels)"
    if any(_names(entry, name) for entry in spec.torch_executed_ops):
        return f"kept out of TensorRT by compile spec torch_executed_ops ({name})"
    record = lookup(node.target)
    if record is None:
        return f"no TensorRT converter for {name}"
    for value in _tensor_values(node):
        if value.dtype not in ENGINE_DTYPES:
            return f"dtype {value.dtype} is not supported by TensorRT"
    if record.validator is not None:
        reason = record.validator(node, spec)
        if reason:
            return reason
    return None


def check_executed_ops(methods: Mapping[str, tuple[Sequence[str], torch.fx.Graph]]) -> None:
    """Refuse a `torch_executed_ops` entry that names no op of the graphs of the methods it applies to
    (`methods`: per method, its entries and its graph): it would keep nothing out of TensorRT, silently
    (`aten.max_pool2d_with_indices` where the graph has `aten.max_pool2d`)."""
    ops = {method: {_op_name(n.target) for n in graph.nodes if n.op == "call_function" and n.target is not operator.getitem}
           for method, (_, graph) in methods.items()}
    for entry in dict.fromkeys(e for entries, _ in methods.values() for e in entries):
        where = sorted(m for m, (entries, _) in methods.items() if entry in entries)
        if any(_names(entry, op) for m in where for op in ops[m]):
            continue
        names = sorted({op.rsplit(".", 1)[0] for m in where for op in ops[m]})
        close = difflib.get_close_matches(entry.removesuffix(".default"), names, n=3, cutoff=0.6)
        raise CompileSpecError(f"torch_executed_ops entry {entry!r} names no op of the exported graph of method(s) {where}, "
                               "so it would keep nothing out of TensorRT" + (f" (the graph has {close})" if close else "")
                               + "; name an op the graph has, or drop the entry")


def _names(entry: str, op: str) -> bool:
    """Whether a torch_executed_ops entry names `op` ("aten.add.Tensor"): that overload, or the op's every one."""
    return entry in (op, op.rsplit(".", 1)[0])


def _op_name(target: Any) -> str:
    return str(aten_op(target)).split(":")[0]


def _tensor_values(node: torch.fx.Node) -> list[torch.Tensor]:
    vals = [a.meta.get("val") for a in node.all_input_nodes]
    out = node.meta.get("val")
    vals.extend(out if isinstance(out, (tuple, list)) else [out])
    return [v for v in vals if isinstance(v, torch.Tensor)]


class TensorRTOperatorSupport(OperatorSupportBase):
    """torch.fx operator support backed by the registry; records every refusal with its reason."""

    def __init__(self, spec: TensorRTCompileSpec) -> None:
        super().__init__()
        self.spec = spec
        self.refused: dict[str, str] = {}

    def is_node_supported(self, submodules: Any, node: torch.fx.Node) -> bool:
        if node.op != "call_function" or "tensorrt.execute_engine" in str(node.target):
            return False  # engine calls are claimed one by one, never merged with ops
        if node.target is operator.getitem:
            return isinstance(node.args[0], torch.fx.Node) and self.is_node_supported(submodules, node.args[0])
        reason = refusal_reason(node, self.spec)
        if reason:
            self.refused[node.name] = reason
            return False
        return True
