"""Turn an ATen/Edge `ExportedProgram` into a TensorRT network through the converter registry
(never through ONNX): inputs, constants, one converter call per node, outputs, and the
optimization-profile ranges of every dynamic input (one profile, or one per `spec.profiles` more)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import sympy
import torch
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind

from pipeline import dtypes
from pipeline.delegate.blob import CHANNELS_LAST, IOBinding
from pipeline.engine import quantize
from pipeline.engine.compile_spec import DimRange, TensorRTCompileSpec
from pipeline.engine.context import ConversionContext, known_size, torch_to_trt
from pipeline.engine.converters.registry import lookup
from pipeline.engine.kept_float32 import kept_float32
from pipeline.engine.support import refusal_reason
from pipeline.engine.trt_api import trt
from pipeline.errors import CompileSpecError, UnsupportedOperatorError

ShapeRange = tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]


@dataclass
class NetworkDefinition:
    """A populated TensorRT network and what the engine's callers need to know about it."""

    network: Any
    ctx: ConversionContext
    bindings: tuple[IOBinding, ...]
    profiles: list[dict[str, ShapeRange]]  # dynamic input -> its range, per optimization profile (the first: the whole range)


@dataclass(frozen=True)
class GraphSource:
    """What a network is made from: a graph, the constant value of each constant placeholder (None
    for runtime inputs), the value ranges of the graph's symbolic dims, and the model's name of each
    constant placeholder's value (its parameter or buffer name: what `compile.quantize` patterns match)."""

    graph: torch.fx.Graph
    constants: dict[str, torch.Tensor | None]
    range_constraints: dict[Any, Any]
    names: dict[str, str] = field(default_factory=dict)
    # The inputs and outputs (placeholder names, `output_<i>`) whose memory only engines read and
    # write: they are held channels last (`blob.CHANNELS_LAST`), as convolutions keep them inside.
    channels_last: frozenset[str] = frozenset()


def graph_source(program: ExportedProgram) -> GraphSource:
    """The `GraphSource` of an exported program (parameters, buffers and constants are constants)."""
    names = {s.arg.name: s.target for s in program.graph_signature.input_specs if s.target is not None}
    return GraphSource(program.graph, _input_sources(program), dict(program.range_constraints), names)


def define_network(builder: Any, source: ExportedProgram | GraphSource, spec: TensorRTCompileSpec) -> NetworkDefinition:
    """Populate a strongly typed TensorRT network from a program or graph.

    Raises:
        UnsupportedOperatorError: a node has no converter or its capability check refuses it.
        CompileSpecError: a dynamic dim has no finite range, or a profile names a dim that is not dynamic.
    """
    if isinstance(source, ExportedProgram):
        source = graph_source(source)
    t = trt()
    network = builder.create_network(1 << int(t.NetworkDefinitionCreationFlag.STRONGLY_TYPED))
    ctx = ConversionContext(network, spec)
    bindings: list[IOBinding] = []
    _check_profiles(spec, source.range_constraints)
    profiles: list[dict[str, ShapeRange]] = [{} for _ in range(1 + len(spec.profiles))]
    ctx.range_constraints = source.range_constraints
    ctx.channels_last = source.channels_last
    # Every constant is known before any node converts: a converter may read ahead (the convolution
    # folds the batch norm's statistics in), and a graph may place placeholders after nodes that
    # do not read them (torch 2.11's partitions do).
    ctx.constants.update((n, v) for n in source.graph.find_nodes(op="placeholder")
                         if (v := source.constants.get(n.name)) is not None)
    ctx.quantized = quantize.plan(source, spec.quantize)
    if ctx.compute_dtype != torch.float32:
        ctx.float32_kept = kept_float32(source.graph, set(ctx.constants))
    for node in source.graph.nodes:
        first = network.num_layers
        if node.op == "placeholder":
            ctx.values[node] = _placeholder(ctx, node, bindings, profiles)
        elif node.op == "call_function":
            ctx.values[node] = _convert(ctx, node)
        elif node.op == "output":
            _mark_outputs(ctx, node, bindings)
        _name_layers(network, first, node.name)
    return NetworkDefinition(network, ctx, tuple(bindings), profiles if profiles[0] else [])


def _name_layers(network: Any, first: int, name: str) -> None:
    """Name the layers from `first` on after the program node that made them (`name`, `name/1`, ...):
    engine inspectors, kernel profiles and TensorRT-RTX's plans then say which op each came from."""
    for i in range(first, network.num_layers):
        network.get_layer(i).name = name if i == first else f"{name}/{i - first}"


def _check_profiles(spec: TensorRTCompileSpec, ranges: dict[Any, Any]) -> None:
    """Every dim a further optimization profile names is a symbolic dim of the program.

    Raises:
        CompileSpecError: one that is not (a static dim, or a name from elsewhere).
    """
    symbols = sorted(str(s) for s in ranges)
    for i, profile in enumerate(spec.profiles):
        for name in profile:
            if name not in symbols:
                raise CompileSpecError(f"compile profiles[{i}] names {name!r}, which is not a dynamic dim of the program "
                                       f"(its symbolic dims: {symbols})")


def _input_sources(program: ExportedProgram) -> dict[str, torch.Tensor | None]:
    """Placeholder name -> constant tensor for parameters/buffers/constants, None for user inputs."""
    out: dict[str, torch.Tensor | None] = {}
    for spec in program.graph_signature.input_specs:
        name = spec.arg.name
        if spec.kind == InputKind.USER_INPUT:
            out[name] = None
        elif spec.target in program.state_dict:
            out[name] = program.state_dict[spec.target]
        elif spec.target in program.constants:
            out[name] = program.constants[spec.target]  # type: ignore[assignment]
        else:
            raise UnsupportedOperatorError(f"input {name!r} ({spec.kind.name}) has no value in the program")
    return out


def _placeholder(ctx: ConversionContext, node: torch.fx.Node, bindings: list[IOBinding],
                 profiles: list[dict[str, ShapeRange]]) -> Any:
    if node in ctx.constants:
        return quantize.constant_weight(ctx, node, ctx.constants[node])
    val = node.meta["val"]
    if not isinstance(val, torch.Tensor):
        raise UnsupportedOperatorError(f"input {node.name!r} is a {type(val).__name__}; engines take tensors only")
    ranges = [_dim_range(d, ctx, ctx.spec.symbol_ranges, node.name, i) for i, d in enumerate(val.shape)]
    shape = tuple(-1 if lo != hi else lo for lo, _, hi in ranges)
    tensor = ctx.network.add_input(node.name, torch_to_trt(val.dtype), shape)
    layout = _layout(ctx, tensor, node.name, val.dtype)
    for i, d in enumerate(val.shape):
        expr = known_size(d) if isinstance(d, torch.SymInt) else None
        if expr is not None and expr.is_Symbol:
            ctx.symbols.setdefault(expr, (tensor, i))
    bounds = (tuple(r[0] for r in ranges), tuple(r[2] for r in ranges)) if -1 in shape else ((), ())
    bindings.append(IOBinding.of(node.name, val.dtype, shape, True, *bounds, layout=layout))
    if -1 in shape:
        profiles[0][node.name] = _shape_range(ranges)
        for k, extra in enumerate(ctx.spec.profiles, start=1):
            narrowed = [_dim_range(d, ctx, {**ctx.spec.symbol_ranges, **extra}, node.name, i) for i, d in enumerate(val.shape)]
            if any(lo < r[0] or hi > r[2] for (lo, _, hi), r in zip(narrowed, ranges)):
                raise CompileSpecError(f"profiles[{k - 1}] gives input {node.name!r} the range {_bounds(narrowed)}, which is "
                                       f"not inside its range {_bounds(ranges)}; a profile narrows the dims it names")
            profiles[k][node.name] = _shape_range(narrowed)
    return ctx.cast(tensor, ctx.compute(val.dtype))


def _shape_range(ranges: list[DimRange]) -> ShapeRange:
    return (tuple(r[0] for r in ranges), tuple(r[0] if r[1] is None else r[1] for r in ranges), tuple(r[2] for r in ranges))


def _bounds(ranges: list[DimRange]) -> str:
    return "[" + ", ".join(str(lo) if lo == hi else f"{lo}..{hi}" for lo, _, hi in ranges) + "]"


def _dim_range(dim: Any, ctx: ConversionContext, given: Mapping[str, DimRange], name: str, index: int) -> DimRange:
    """A dim's [min, opt, max]: from `given` (symbol name -> range) where it names the dim's
    symbols, else from the program's range constraints."""
    if isinstance(dim, int):
        return (dim, dim, dim)
    expr = known_size(dim)
    env = dim.node.shape_env
    bounds = {}
    for sym in expr.free_symbols:
        # The program's range constraints hold the user's Dim bounds (the shape env assumes >= 2).
        vr = ctx.range_constraints.get(sym) or env.var_to_range.get(sym)
        bounds[sym] = _symbol_range(sym, vr, env, given.get(str(sym)), name, index)
    lo, opt, hi = (int(expr.subs({s: b[k] for s, b in bounds.items()})) for k in range(3))
    return (lo, opt, hi)


def _symbol_range(sym: sympy.Symbol, vr: Any, env: Any, given: DimRange | None, name: str,
                  index: int) -> tuple[int, int, int]:
    if given:
        lo, hi = given[0], given[2]
    else:
        try:
            lo, hi = int(vr.lower), int(vr.upper)
        except (OverflowError, TypeError, AttributeError, ValueError):  # sympy's int_oo
            raise CompileSpecError(
                f"input {name!r} dim {index} ({sym}) has no upper bound; give torch.export Dim a max= or set "
                f"compile dynamic_shapes for that input to [min, opt, max]"
            ) from None
    hints = getattr(env, "backed_var_to_val", None) or env.var_to_val
    hint = hints.get(sym)
    opt = given[1] if given and given[1] is not None else (int(hint) if hint is not None else hi)
    return (int(lo), min(max(int(opt), int(lo)), hi), hi)


def _convert(ctx: ConversionContext, node: torch.fx.Node) -> Any:
    if getattr(node.target, "__name__", "") == "getitem":
        source = ctx.values[node.args[0]]  # type: ignore[index]
        return source[node.args[1]]  # type: ignore[index]
    record = lookup(node.target)
    reason = refusal_reason(node, ctx.spec)
    if record is None or reason:
        raise UnsupportedOperatorError(f"cannot convert node {node.name} ({node.target}): {reason}")
    args = quantize.quantized_args(ctx, node, tuple(torch.fx.node.map_arg(node.args, lambda n: ctx.values[n])))
    kwargs = torch.fx.node.map_arg(node.kwargs, lambda n: ctx.values[n])
    return record.impl(ctx, node, args, dict(kwargs))


def _mark_outputs(ctx: ConversionContext, node: torch.fx.Node, bindings: list[IOBinding]) -> None:
    marked: set[int] = set()
    results = node.args[0]
    for i, arg in enumerate(results if isinstance(results, (tuple, list)) else [results]):
        if not isinstance(arg, torch.fx.Node) or not isinstance(arg.meta.get("val"), torch.Tensor):
            raise UnsupportedOperatorError(f"engine output {i} is {arg!r}; engines return tensors only")
        val = arg.meta["val"]
        tensor = ctx.values[arg]
        if not hasattr(tensor, "shape"):  # a python scalar from symbolic-int arithmetic
            raise UnsupportedOperatorError(f"engine output {i} ({arg.name}) is not a tensor")
        if val.dtype in dtypes.FLOAT_DTYPES or tensor.dtype != torch_to_trt(val.dtype):
            tensor = ctx.cast(tensor, val.dtype)
        aliases = ctx.in_place.pop(arg, "")  # the layer writes its input's memory: it must be the output
        if tensor.is_network_input or id(tensor) in marked or tensor.is_network_output:
            if aliases:
                raise UnsupportedOperatorError(f"engine output {i} ({arg.name}) updates {aliases!r} in place, "
                                               "so it must be the updating layer's own output")
            tensor = ctx.network.add_identity(tensor).get_output(0)
        name = f"output_{i}"
        tensor.name = name
        ctx.network.mark_output(tensor)
        marked.add(id(tensor))
        shape = tuple(d if isinstance(d, int) else -1 for d in val.shape)
        if aliases and name in ctx.channels_last:  # the state it updates in place keeps the program's order
            raise UnsupportedOperatorError(f"engine output {i} ({arg.name}) updates {aliases!r} in place, so it cannot "
                                           "also pass to other engines channels last")
        layout = _layout(ctx, tensor, name, val.dtype)
        bindings.append(IOBinding.of(name, val.dtype, shape, False, aliases=aliases, layout=layout))


def holds_channels_last(val: Any) -> bool:
    """Whether an engine input or output of this value can be held channels last: a float N, C, H, W
    tensor whose H, W are not known to be 1 x 1 (there both orders are one), in fp32 (TensorRT's HWC),
    or in fp16/bf16 with a channel count of eights (HWC8, which pads channels to eights otherwise)."""
    if not isinstance(val, torch.Tensor) or val.dim() != 4 or val.dtype not in dtypes.FLOAT_DTYPES:
        return False
    if val.shape[2] == 1 and val.shape[3] == 1:
        return False
    return val.dtype == torch.float32 or (isinstance(val.shape[1], int) and val.shape[1] % 8 == 0)


def _layout(ctx: ConversionContext, tensor: Any, name: str, dtype: torch.dtype) -> str:
    """Hold an input or output only engines touch channels last (`holds_channels_last`), so that
    neither engine at the boundary turns its convolutions' layout into the program's and back."""
    if name not in ctx.channels_last:
        return ""
    formats = trt().TensorFormat
    tensor.allowed_formats = 1 << int(formats.HWC if dtype == torch.float32 else formats.HWC8)
    return CHANNELS_LAST

