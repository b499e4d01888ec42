"""Constant folding before partitioning: every operator whose inputs are all constants (weights,
buffers the program never writes, literals) is computed once at compile time and becomes a constant
of the program. Position ids, attention masks and relative-position tables that models build in
`forward` then cost nothing at run time, and never leave an op without a converter, or an engine
without inputs, behind. A buffer the program writes (a KV cache, a step counter) is state, never a
constant: its value is the last call's. A convolution stays an operator even on constants: TensorRT runs
it as any convolution, and the engine's schedule is built around it (see `ENGINE_COMPUTES`); where
one would be in no engine that has a runtime input, the compile step folds them all after all."""

from __future__ import annotations

import hashlib
import operator
from collections.abc import Collection
from typing import Any

import torch
from torch._ops import OpOverload

# A folded result larger than this stays an operator (TensorRT folds it inside the engine instead)
# rather than growing the program by a constant much larger than its inputs.
MAX_FOLDED_BYTES = 1 << 26

# Operators the engine computes even when every input is a constant (their inputs are folded). Measured
# on the H200 (results/gpu-log.md, 2026-12-01): XCiT's position encoding is a convolution on a grid
# made in `forward`; folded, TensorRT-RTX schedules the engine on one stream and it runs 1.11x as long as
# the ONNX parser's engine (which keeps the convolution); kept, the engine gets the parser's second
# stream and runs 0.99x as long.
ENGINE_COMPUTES = frozenset({torch.ops.aten.convolution.default})


def fold_constants(gm: torch.fx.GraphModule, state: Collection[str] = (),
                   computes: Collection[OpOverload] = ENGINE_COMPUTES) -> int:
    """Replace constant-only subgraphs of `gm` (an unlifted module) by constants; returns how many
    constants were made. The buffers `gm` writes, and those in `state`, are not constants; the
    operators in `computes` stay (their constant inputs are folded)."""
    values: dict[torch.fx.Node, Any] = {}
    state = written_buffers(gm) | frozenset(state)
    for node in gm.graph.nodes:
        if node.op == "get_attr" and str(node.target) not in state:
            values[node] = attr(gm, str(node.target))
        elif _foldable(node) and node.target not in computes and all(n in values for n in node.all_input_nodes):
            args, kwargs = torch.fx.map_arg((node.args, node.kwargs), values.__getitem__)
            with torch.no_grad():
                result = node.target(*args, **kwargs)  # type: ignore[operator]
            if _nbytes(result) <= max(MAX_FOLDED_BYTES, sum(_nbytes(values[n]) for n in node.all_input_nodes)):
                values[node] = result
    folded = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node not in values or not isinstance(values[node], torch.Tensor):
            continue
        if all(user in values for user in node.users):
            continue  # only the frontier becomes a constant; what it feeds on is then dead
        value = values[node].detach().contiguous()
        name = f"_folded_{content_digest(value)}"  # by content: methods share equal constants, never clash
        gm.register_buffer(name, value)
        with gm.graph.inserting_before(node):
            constant = gm.graph.get_attr(name)
        constant.meta = {k: v for k, v in node.meta.items() if k in ("val", "tensor_meta", "stack_trace")}
        node.replace_all_uses_with(constant)
        folded += 1
    if folded:
        gm.graph.eliminate_dead_code()
        gm.delete_all_unused_submodules()
        gm.recompile()
    return folded


def content_digest(tensor: torch.Tensor) -> str:
    """16 hex digits of SHA-256 over a tensor's dtype, shape and bytes: the name of a constant the
    compile step makes. A program stores constants by name for all its methods (in the `.ptd`, one
    entry per name), so names must say what the data is: equal tensors share one, different never clash."""
    digest = hashlib.sha256(f"{tensor.dtype}{tuple(tensor.shape)}".encode())
    flat = tensor.detach().cpu().contiguous().reshape(-1)
    digest.update(flat.view(torch.uint8).numpy().data if flat.numel() else b"")
    return digest.hexdigest()[:16]


def written_buffers(gm: torch.fx.GraphModule) -> frozenset[str]:
    """The buffers an unlifted module writes (its state): the targets its write-backs (`copy_`
    into a buffer, as torch.export unlifts a buffer mutation) go to."""
    return frozenset(
        str(node.args[0].target) for node in gm.graph.nodes
        if node.op == "call_function" and node.target is torch.ops.aten.copy_.default
        and isinstance(node.args[0], torch.fx.Node) and node.args[0].op == "get_attr"
    )


def _foldable(node: torch.fx.Node) -> bool:
    if node.op != "call_function":
        return False
    if node.target is operator.getitem:
        return True
    op = node.target
    if not isinstance(op, OpOverload) or op._schema.is_mutable or torch.Tag.nondeterministic_seeded in op.tags:
        return False
    val = node.meta.get("val")
    vals = val if isinstance(val, (tuple, list)) else [val]
    return all(isinstance(v, torch.Tensor) and all(isinstance(d, int) for d in v.shape) for v in vals)


def _nbytes(value: Any) -> int:
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, (tuple, list)):
        return sum(_nbytes(v) for v in value)
    return 0


def attr(gm: torch.nn.Module, target: str) -> Any:
    """The module attribute a `get_attr` target names (dotted path)."""
    obj: Any = gm
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj
