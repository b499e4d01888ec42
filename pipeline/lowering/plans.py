"""A partition of engine calls and `decode_product` calls (`compile.decode_kernels`) as one delegate: its
plan (`delegate/plan.py`), steps in graph order, and the named data they read (engines, the kernels'
PTX, packed weights), so ExecuTorch sees one TensorRT delegate and its values stay on the device."""

from __future__ import annotations

import operator
from typing import Any

import torch
from torch.export import ExportedProgram

from pipeline import dtypes
from pipeline.delegate import blob, plan
from pipeline.delegate.blob import IOBinding
from pipeline.engine.network import graph_source
from pipeline.errors import BlobFormatError
from pipeline.kernels import decode_attention, formats
from pipeline.kernels.attention_op import is_decode_attention
from pipeline.kernels.calls import is_kernel_call
from pipeline.kernels.product_op import packed_of
from pipeline.runtime.engine_op import is_engine_call


def is_planned(node: torch.fx.Node) -> bool:
    """A call a plan takes: an engine call, or one of the project's kernels."""
    return is_engine_call(node) or is_kernel_call(node)


def build_plan(program: ExportedProgram) -> tuple[bytes, dict[str, bytes], dict[str, Any]] | None:
    """The plan blob of `program` (a partition), the named data it reads (key -> bytes) and build
    statistics; None where the partition calls none of the project's kernels (one engine: `blob.py`).

    Raises:
        BlobFormatError: a value of a dynamic shape, or an output no step writes.
    """
    calls = [n for n in program.graph.nodes if is_planned(n)]
    if not any(is_kernel_call(n) for n in calls):
        return None
    constants = graph_source(program).constants
    names: dict[torch.fx.Node, str] = {}
    placeholders = {n.name: n for n in program.graph.nodes if n.op == "placeholder"}
    inputs = [placeholders[name] for name in program.graph_signature.user_inputs]
    io = [_binding(f"input_{i}", node, True) for i, node in enumerate(inputs)]
    names.update((node, f"input_{i}") for i, node in enumerate(inputs))
    out_node = next(n for n in program.graph.nodes if n.op == "output")
    produced = list(out_node.args[0])
    data: dict[str, bytes] = {}
    values: list[IOBinding] = []
    steps: list[plan.Step] = []
    for call in calls:
        if is_engine_call(call):
            steps.append(_engine_step(call, constants, names, produced, values, data))
        elif is_decode_attention(call):
            steps.append(_attention_step(call, constants, names, produced, values, data))
        else:
            steps.append(_kernel_step(call, constants, names, produced, values, data))
    for j, node in enumerate(produced):
        name = names.get(node, "")  # an input's name: the plan writes it into that input's memory
        io.append(_binding(f"output_{j}", node, False, name if name.startswith("input_") else ""))
    built = plan.Plan(tuple(io), tuple(values), tuple(steps))
    stats = {"plan_steps": len(steps), "engines": len(built.engines), "kernels": len(steps) - len(built.engines),
             "attention_kernels": sum(isinstance(s, plan.AttentionStep) for s in steps),
             "kernel_weight_bytes": sum(len(v) for k, v in data.items() if k.startswith(plan.WEIGHT_PREFIX))}
    return plan.encode(built), data, stats


def _binding(name: str, node: torch.fx.Node, is_input: bool, aliases: str = "") -> IOBinding:
    value = node.meta.get("val")
    if not isinstance(value, torch.Tensor) or any(not isinstance(d, int) for d in value.shape):
        raise BlobFormatError(f"value {node.name} of a plan has no static shape ({value!r}); compile.decode_kernels "
                              "needs a method of static shapes (a decode step of fixed tokens)")
    return IOBinding.of(name, value.dtype, tuple(value.shape), is_input, aliases=aliases)


def _value(node: torch.fx.Node, names: dict[torch.fx.Node, str], produced: list[Any], values: list[IOBinding]) -> str:
    """The name a step output gets: "output_<j>" where the delegate returns it, else a new value."""
    if node in produced:
        name = f"output_{produced.index(node)}"
    else:
        name = f"value_{len(values)}"
        values.append(_binding(name, node, False))
    names[node] = name
    return name


def _engine_step(call: torch.fx.Node, constants: dict[str, Any], names: dict[torch.fx.Node, str], produced: list[Any],
                 values: list[IOBinding], data: dict[str, bytes]) -> plan.EngineStep:
    args, engine_node, metadata = call.args
    meta, _ = blob.decode_op_metadata(metadata)
    engine = constants[engine_node.name].cpu().numpy().tobytes()
    ref = blob.EngineRef.of(engine)
    data[ref.key] = engine  # type: ignore[index]
    step_inputs = tuple(names[a] for a in args)
    items = {int(u.args[1]): u for u in call.users if u.target is operator.getitem}
    by_binding = dict(zip((b.name for b in meta.inputs), step_inputs))
    outputs = []
    for i, binding in enumerate(meta.outputs):
        node = items.get(i)
        if binding.aliases:  # written into its input's memory: the step names it so
            name = by_binding[binding.aliases]
            if node is not None:
                names[node] = name
        elif node is None:  # an output nothing reads still needs memory to go to
            name = f"value_{len(values)}"
            values.append(IOBinding(name, binding.dtype, binding.shape, False))
        else:
            name = _value(node, names, produced, values)
        outputs.append(name)
    meta = blob.BlobMetadata(meta.io_bindings, tf32_override=meta.tf32_override)
    return plan.EngineStep(meta, ref, step_inputs, tuple(outputs))


def _kernel_step(call: torch.fx.Node, constants: dict[str, Any], names: dict[torch.fx.Node, str], produced: list[Any],
                 values: list[IOBinding], data: dict[str, bytes]) -> plan.KernelStep:
    x, weight, scales, bias, kernels = call.args
    value = x.meta["val"]
    packed = packed_of(value, constants[weight.name], None if scales is None else constants[scales.name])
    tokens = int(value.numel() // value.shape[-1])

    module, packed_weight = _stored(call, kernels, plan.KERNELS_PREFIX, constants, data), _stored(call, weight, plan.WEIGHT_PREFIX, constants, data)
    assert module is not None and packed_weight is not None
    if dtypes.name_of(value.dtype) != "float16":
        raise BlobFormatError(f"kernel call {call.name} takes {value.dtype}; the kernels take float16")
    return plan.KernelStep(formats.kernel_name(packed.format, tokens), module, packed_weight,
                           _stored(call, scales, plan.WEIGHT_PREFIX, constants, data),
                           _stored(call, bias, plan.WEIGHT_PREFIX, constants, data), packed.n, packed.k,
                           packed.group, formats.grid(packed.n, packed.format), formats.THREADS, (names[x],),
                           (_value(call, names, produced, values),))


def _stored(call: torch.fx.Node, node: torch.fx.Node | None, prefix: str, constants: dict[str, Any],
            data: dict[str, bytes]) -> plan.DataRef | None:
    """The named-data entry of the constant `node` a kernel call reads (None for None)."""
    if node is None:
        return None
    tensor = constants.get(node.name)
    if tensor is None:
        raise BlobFormatError(f"kernel call {call.name} reads {node.name} at run time; its weights must be constants")
    raw = tensor.contiguous().cpu().view(torch.uint8).numpy().tobytes()
    ref = plan.DataRef.of(raw, prefix)
    data[ref.key] = raw
    return ref


def _attention_step(call: torch.fx.Node, constants: dict[str, Any], names: dict[torch.fx.Node, str], produced: list[Any],
                    values: list[IOBinding], data: dict[str, bytes]) -> plan.AttentionStep:
    q, k, v, mask, scale, kernels, _ = call.args  # the shape: the output value's
    module = _stored(call, kernels, plan.KERNELS_PREFIX, constants, data)
    assert module is not None
    sizes = decode_attention.sizes(q.meta["val"].shape, k.meta["val"].shape, v.meta["val"].shape,
                                   None if mask is None else mask.meta["val"].shape)
    if isinstance(sizes, str):
        raise BlobFormatError(f"attention call {call.name}: {sizes}")
    out = _value(call, names, produced, values)
    workspace = f"value_{len(values)}"
    values.append(IOBinding(workspace, "float32", (sizes.workspace,), False))
    inputs = tuple(names[a] for a in (q, k, v, *([mask] if mask is not None else [])))
    return plan.AttentionStep(module, plan.AttentionStep.bits(float(scale)), inputs, (out, workspace))
