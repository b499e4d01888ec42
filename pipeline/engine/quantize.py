"""Quantized weights inside engines (`compile.quantize`, `QuantizeSpec`): which constants of a graph are
the weights of quantizable layers (`plan`), how each is stored (int4 in groups along the input dim, int8
per output channel, fp8 with one scale) and turned back into the compute precision by a TensorRT dequantize layer,
which TensorRT fuses into its quantized kernels (`weight_layers`), and fp8 layer inputs, quantized with
a scale from calibration (`input_layers`). The engine then holds the quantized weights, not float ones."""

from __future__ import annotations

import fnmatch
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from pipeline.engine.compile_spec import QuantizeSpec
from pipeline.engine.context import torch_to_trt
from pipeline.engine.converters.registry import aten_op
from pipeline.engine.trt_api import trt
from pipeline.errors import CompileSpecError

log = logging.getLogger("pipeline")

if TYPE_CHECKING:
    from pipeline.engine.context import ConversionContext
    from pipeline.engine.network import GraphSource

aten = torch.ops.aten
FP8_MAX = 448.0  # largest finite fp8 E4M3 value
_STORED = {"int4_weight_only": "int4", "int8_weight_only": "int8", "fp8": "fp8"}
_LEVELS = {"int4": 7.0, "int8": 127.0, "fp8": FP8_MAX}  # largest stored magnitude a scale maps to
_BITS = {"int4": 4, "int8": 8, "fp8": 8}


@dataclass(frozen=True)
class LayerSlots:
    """Where an op takes its constant weight and its input, and how the weight is laid out."""

    layer: str  # "linear" or "embedding" (`QuantizeSpec.layers`)
    weight: int  # argument index of the weight
    input: int | None  # argument index of the input an fp8 layer quantizes (None: an embedding's indices)
    in_axis: int  # the weight's input dim (int4 groups run along it)
    out_axis: int  # the weight's output-channel dim (int8 and fp8 scales run along it)


SLOTS = {
    aten.linear.default: LayerSlots("linear", 1, 0, 1, 0),  # weight [out, in]
    aten.mm.default: LayerSlots("linear", 1, 0, 0, 1),  # weight [in, out]
    aten.matmul.default: LayerSlots("linear", 1, 0, 0, 1),
    aten.addmm.default: LayerSlots("linear", 2, 1, 0, 1),
    aten.embedding.default: LayerSlots("embedding", 0, None, 1, 0),  # table [rows, dim]
}
SLOTS_BY_LAYER = {"linear": SLOTS[aten.linear.default], "embedding": SLOTS[aten.embedding.default]}  # as torch.nn holds them


@dataclass(frozen=True)
class WeightScheme:
    """How one constant is stored: `stored` ("int4", "int8", "fp8"), one scale per `group` values along
    `axis` (group 0: one scale per index of `axis`, i.e. per output channel; axis None: one scale for the
    whole weight, which fp8 products need: per-channel fp8 weights gave inf on the H200)."""

    name: str  # the model's parameter name
    layer: str
    stored: str
    axis: int | None
    group: int


@dataclass
class QuantizationPlan:
    """What one engine quantizes: its weights (placeholder name -> scheme), the inputs fp8 layers
    quantize (layer node name -> largest magnitude from calibration), and the candidate weights kept in
    float with the reason (parameter name -> reason)."""

    mode: str = "none"
    weights: dict[str, WeightScheme] = field(default_factory=dict)
    inputs: dict[str, float] = field(default_factory=dict)
    kept: dict[str, str] = field(default_factory=dict)
    float_bytes: int = 0  # the quantized weights' bytes in the compute precision's 2 bytes per value
    stored_bytes: int = 0  # their bytes as stored, scales included

    def summary(self) -> dict[str, Any] | None:
        """The report's entry for this engine (None when it quantizes nothing and keeps nothing back)."""
        if self.mode == "none" or not (self.weights or self.kept):
            return None
        layers: dict[str, int] = {}
        for scheme in self.weights.values():
            layers[scheme.layer] = layers.get(scheme.layer, 0) + 1
        return {"mode": self.mode, "weights": len(self.weights), "layers": layers,
                "quantized_inputs": len(self.inputs), "weight_bytes_16bit": self.float_bytes,
                "weight_bytes_stored": self.stored_bytes, "kept_float": dict(sorted(self.kept.items()))}


def say_what_was_quantized(spec: QuantizeSpec, plans: Sequence[QuantizationPlan], method: str) -> None:
    """Say on the console how many of the weights a quantize mode could take it quantized, and warn
    when that is fewer than half (a mode that changes almost nothing), naming the most common reason."""
    if spec.mode == "none":
        return
    done = sum(len(p.weights) for p in plans)
    kept = [why for p in plans for why in p.kept.values()]
    total = done + len(kept)
    if total and done * 2 >= total:
        log.info("method %r: %s quantized %d of %d weight(s)", method, spec.mode, done, total)
        return
    common = max(set(kept), key=kept.count) if kept else "no layer of its kinds is in an engine"
    log.warning("method %r: %s quantized %d of %d weight(s), so the program is barely smaller or faster than float; "
                "most stayed float because %s (report.json lists each)", method, spec.mode, done, total, common)


def plan(source: GraphSource, spec: QuantizeSpec) -> QuantizationPlan:
    """Which constants of `source` an engine built under `spec` stores quantized."""
    out = QuantizationPlan(mode=spec.mode)
    if not spec.active:
        return out
    for node in source.graph.find_nodes(op="placeholder"):
        value = source.constants.get(node.name)
        if value is None or not value.is_floating_point() or not node.users:
            continue
        name = source.names.get(node.name, node.name)
        uses = [_slots(user, node) for user in node.users]
        kinds = {u.layer for u in uses if u is not None}
        if not kinds & set(spec.layers):
            continue
        reason = _kept_reason(name, value, uses, spec)
        if reason:
            out.kept[name] = reason
            continue
        slots = uses[0]
        assert slots is not None
        out.weights[node.name] = weights = scheme(spec, slots, name)
        out.float_bytes += value.numel() * 2
        scales = value.numel() // weights.group if weights.group else 1 if weights.axis is None else value.shape[weights.axis]
        out.stored_bytes += value.numel() * _BITS[weights.stored] // 8 + scales * 2
        if spec.mode == "fp8" and slots.input is not None:
            out.inputs.update((user.name, spec.activation_amax[name]) for user in node.users)
    return out


def scheme(spec: QuantizeSpec, slots: LayerSlots, name: str) -> WeightScheme:
    """How `spec` stores the weight `name` of a layer with `slots`."""
    # TensorRT folds an fp8 weight that no fp8 product reads back to float: an fp8 program's tables stay int8.
    stored = "int8" if spec.mode == "fp8" and slots.layer == "embedding" else _STORED[spec.mode]
    if stored == "int4":
        return WeightScheme(name, slots.layer, stored, slots.in_axis, spec.group_size)
    return WeightScheme(name, slots.layer, stored, None if stored == "fp8" else slots.out_axis, 0)


def kept(name: str, spec: QuantizeSpec) -> bool:
    """Whether a `quantize.keep` pattern names parameter `name`."""
    return any(_names(pattern, name) for pattern in spec.keep)


def _names(pattern: str, name: str) -> bool:
    """Whether `pattern` matches parameter `name` whole or from a dot on: `lm_head.*` names the wrapped
    model's `model.lm_head.weight` as the model's own code calls it."""
    return fnmatch.fnmatchcase(name, pattern) or fnmatch.fnmatchcase(name, f"*.{pattern}")


def check_keep(spec: QuantizeSpec, names: list[str], method: str) -> None:
    """Refuse a `quantize.keep` pattern that names none of a method's parameters `names` (a misspelt
    pattern would otherwise quantize the layer it meant to keep).

    Raises:
        CompileSpecError: the first such pattern, with a name the method has.
    """
    for pattern in spec.keep if spec.active else ():
        if not any(_names(pattern, name) for name in names):
            example = next((n for n in names if n.endswith(".weight")), names[0] if names else "")
            raise CompileSpecError(f"compile.quantize.keep pattern {pattern!r} names no parameter of method {method!r} "
                                   f"(its names look like {example!r}); fix the pattern or drop it")


def _slots(user: torch.fx.Node, weight: torch.fx.Node) -> LayerSlots | None:
    """The slots of `user` when it reads `weight` as its layer weight, and only there."""
    slots = SLOTS.get(aten_op(user.target))  # type: ignore[arg-type]
    if slots is None or len(user.args) <= slots.weight or user.args[slots.weight] is not weight:
        return None
    if sum(a is weight for a in user.args) != 1:
        return None
    return slots


def _kept_reason(name: str, value: torch.Tensor, uses: list[LayerSlots | None], spec: QuantizeSpec) -> str | None:
    if kept(name, spec):
        return "quantize.keep"
    if any(u is None for u in uses) or len({u for u in uses}) != 1:
        return "read by other ops as well (a tied weight?)"
    slots = uses[0]
    assert slots is not None
    if slots.layer not in spec.layers:
        return f"also a {slots.layer} weight, which quantize.layers leaves out"
    rank = value.dim()
    if rank != 2:
        return f"a weight of rank {rank}"
    if spec.mode == "fp8" and slots.input is not None and name not in spec.activation_amax:
        return "fp8 needs its input's calibrated scale (the compile step calibrates; TensorRT turns an fp8 weight " \
               "whose input stays float back into float)"
    if spec.mode == "int4_weight_only":
        size = value.shape[slots.in_axis]
        if size % spec.group_size:
            return f"its input dim ({size}) is not a multiple of quantize.group_size ({spec.group_size})"
        if value.numel() % 2:
            return "an odd number of values (int4 packs two per byte)"
    return None


def constant_weight(ctx: ConversionContext, node: torch.fx.Node, value: torch.Tensor) -> Any:
    """The network tensor of constant `node` holding `value`: dequantized from its stored form where the
    plan quantizes it, else a float constant."""
    scheme = ctx.quantized.weights.get(node.name)
    return ctx.constant(value, ctx.node_dtype(node)) if scheme is None else weight_layers(ctx, value, scheme)


def weight_layers(ctx: ConversionContext, value: torch.Tensor, scheme: WeightScheme) -> Any:
    """A constant of `value` quantized as `scheme` says, dequantized to the compute precision."""
    divided, scale = _divided(value, scheme)
    stored = ctx.raw_constant(_stored(divided, scheme.stored), getattr(trt(), scheme.stored), tuple(value.shape), value.numel())
    scales = ctx.exact_constant(scale.to(ctx.compute_dtype))
    layer = ctx.network.add_dequantize(stored, scales, torch_to_trt(ctx.compute_dtype))
    if not scheme.group and scheme.axis is not None:
        layer.axis = scheme.axis
    return layer.get_output(0)


def simulated(value: torch.Tensor, scheme: WeightScheme) -> torch.Tensor:
    """The float weight an engine computes with where it stores `value` as `scheme` says (for checking an
    engine against its own rounding rather than against the float weights)."""
    rounded, scale = stored_values(value, scheme)
    if scheme.group:
        scale = scale.repeat_interleave(scheme.group, dim=scheme.axis)
    elif scheme.axis is not None:
        shape = [1] * value.dim()
        shape[scheme.axis] = -1
        scale = scale.reshape(shape)
    return (rounded * scale.to(torch.float32)).to(value.dtype)


def stored_values(value: torch.Tensor, scheme: WeightScheme) -> tuple[torch.Tensor, torch.Tensor]:
    """The values `value` is stored as under `scheme` (float32: integer levels, or fp8 values) and their
    scales (float32, shaped as `_divided` gives them)."""
    divided, scale = _divided(value, scheme)
    if scheme.stored == "fp8":
        return divided.clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).to(torch.float32), scale
    levels = _LEVELS[scheme.stored]
    return divided.round().clamp(-levels - 1, levels), scale


def _divided(value: torch.Tensor, scheme: WeightScheme) -> tuple[torch.Tensor, torch.Tensor]:
    """`value` divided by its scales (float32, not yet rounded) and the scales: one per `scheme.group`
    values along `scheme.axis` (shaped as the weight with that dim divided), or one per index of it, or one for the whole weight."""
    w = value.detach().to(torch.float32).cpu()
    if scheme.axis is None:
        scale = _scale(w.abs().amax(), scheme.stored)
        return w / scale, scale
    moved = w.movedim(scheme.axis, -1)
    if scheme.group:
        groups = moved.reshape(*moved.shape[:-1], moved.shape[-1] // scheme.group, scheme.group)
        scale = _scale(groups.abs().amax(-1), scheme.stored)
        divided = (groups / scale.unsqueeze(-1)).reshape(moved.shape).movedim(-1, scheme.axis)
        return divided, scale.movedim(-1, scheme.axis)
    scale = _scale(moved.abs().reshape(-1, moved.shape[-1]).amax(0), scheme.stored)
    shape = [1] * w.dim()
    shape[scheme.axis] = -1
    return w / scale.reshape(shape), scale


def input_layers(ctx: ConversionContext, node: torch.fx.Node, x: Any) -> Any:
    """`x`, the input of layer `node`, through fp8 quantize/dequantize with its calibrated scale (as it
    is where the plan does not quantize that input)."""
    amax = ctx.quantized.inputs.get(node.name)
    if amax is None:
        return x
    dtype = ctx.compute_dtype
    scale = ctx.exact_constant(torch.tensor(max(amax, 1e-12) / FP8_MAX, dtype=torch.float32).to(dtype))
    quantized = ctx.network.add_quantize(ctx.cast(x, dtype), scale, trt().fp8).get_output(0)
    return ctx.network.add_dequantize(quantized, scale, torch_to_trt(dtype)).get_output(0)


def quantized_args(ctx: ConversionContext, node: torch.fx.Node, args: tuple[Any, ...]) -> tuple[Any, ...]:
    """`args` of layer `node` with its input quantized where the plan says (fp8)."""
    if node.name not in ctx.quantized.inputs:
        return args
    slots = SLOTS[aten_op(node.target)]  # type: ignore[index]
    assert slots.input is not None
    return (*args[:slots.input], input_layers(ctx, node, args[slots.input]), *args[slots.input + 1:])


def _scale(amax: torch.Tensor, stored: str) -> torch.Tensor:
    """Scales mapping each block's largest magnitude to the stored type's; an all-zero block gets 1."""
    return torch.where(amax > 0, amax / _LEVELS[stored], torch.ones_like(amax))


def _stored(values: torch.Tensor, stored: str) -> np.ndarray:
    """`values` (already divided by their scales) as the bytes TensorRT reads for `stored`."""
    if stored == "fp8":
        return values.clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).view(torch.uint8).numpy().copy()
    levels = int(_LEVELS[stored])
    q = values.round().clamp(-levels - 1, levels).to(torch.int8).reshape(-1).numpy()
    if stored == "int8":
        return q.copy()
    nibbles = (q & 0xF).astype(np.uint8)  # two's-complement 4-bit values, the first of each pair in the low bits
    return (nibbles[0::2] | (nibbles[1::2] << 4)).astype(np.uint8)
