"""The compile step: `torch.export` a method, build a TensorRT engine for every maximal supported
subgraph, and return an engine-bearing `ExportedProgram` in which each engine is one call of
`torch.ops.tensorrt.execute_engine` whose engine bytes are a uint8 constant of the program."""

from __future__ import annotations

import contextlib
import io
import logging
import operator
import os
import re
import traceback
from collections.abc import Collection, Iterable, Iterator, Sequence
from dataclasses import replace
from typing import Any

import sympy
import torch
from torch.export import ExportedProgram
from torch.fx.passes.utils.fuser_utils import fuse_by_partitions

from pipeline.delegate import blob
from pipeline.delegate.input_values import set_input_values, value_bounds
from pipeline.engine import calibration, quantize
from pipeline.engine.builder import build_engine, profile_count
from pipeline.engine.cache import EngineCache
from pipeline.engine.compile_spec import TensorRTCompileSpec
from pipeline.engine.network import GraphSource, holds_channels_last
from pipeline.errors import ExportError, PipelineError, UnsupportedOperatorError
from pipeline.lowering.complex_pairs import complex_as_pairs
from pipeline.lowering.constant_fold import ENGINE_COMPUTES, attr, content_digest, fold_constants, written_buffers
from pipeline.lowering.decode_attention import take_attention
from pipeline.lowering.decode_products import take_products
from pipeline.lowering.engine_check import checked, example_values
from pipeline.lowering.fused_attention import fuse_attention
from pipeline.lowering.grouped_query import share_kv_heads
from pipeline.lowering.partitioning import RECORD_KEY, is_operator, mark_refused, preserved_ops, propose, symbol_ranges
from pipeline.runtime import engine_op  # noqa: F401  (registers torch.ops.tensorrt.execute_engine)

log = logging.getLogger("pipeline.lowering.compile")


def compile_method(module: torch.nn.Module, example_inputs: Sequence[Any], spec: TensorRTCompileSpec | None = None,
                   dynamic_shapes: Any = None, method: str = "forward", cache: EngineCache | None = None,
                   state: Collection[str] = (), input_values: Sequence[tuple[int, int] | None] = ()) -> ExportedProgram:
    """Export `module` and replace its TensorRT-supported subgraphs by engine calls.

    Args:
        module: the model (its `forward` is exported).
        example_inputs: positional example inputs.
        spec: compile options of every engine (`min_block_size`, precision, dynamic ranges, ...).
        dynamic_shapes: torch.export dynamic shapes for `example_inputs`.
        method: name used in progress messages and engine labels.
        cache: an engine cache to take engines from and put new ones into (`cache.events` says which).
        state: buffers other methods of the same program write (`written_state`): where this
            method only reads them, it still reads them at run time (ExecuTorch keeps a buffer
            any method writes once for all methods), never as constants.
        input_values: per input, the inclusive range of values an integer input may take where no
            indexing op of the model bounds it (`input_values.value_bounds`), or None.
    Returns:
        An engine-bearing `ExportedProgram` (saves with `torch.export.save`); its input placeholders
        carry the bounds of the values they may hold (`INPUT_VALUES` in their meta).
    """
    program = export_method(module, example_inputs, dynamic_shapes)
    return compile_program(program, example_inputs, spec, method, cache, state, input_values)


def export_method(module: torch.nn.Module, example_inputs: Sequence[Any], dynamic_shapes: Any = None) -> ExportedProgram:
    """`torch.export` with the decompositions the converters expect (the ops they take whole are kept).

    Raises:
        ExportError: the module cannot be exported with these inputs (its forward raises, branches on
            tensor values, takes other dtypes), or returns no tensor; one line naming the reason.
    """
    table = torch.export.default_decompositions()
    for op in preserved_ops(table):
        table.pop(op)
    try:
        with _quiet_torch():
            program = torch.export.export(module.eval(), tuple(example_inputs), dynamic_shapes=dynamic_shapes)
    except PipelineError:
        raise
    except Exception as exc:  # torch.export, and the model's own code, fail in every way there is
        raise ExportError(f"torch.export cannot trace the model with its example inputs ({_export_reason(exc)})") from exc
    returned = _outputs(program.graph_module)
    if not any(isinstance(n, torch.fx.Node) and isinstance(n.meta.get("val"), torch.Tensor) for n in returned):
        shown = ", ".join("None" if n is None else type(n).__name__ for n in returned) or "nothing"
        raise ExportError(f"the model's method returns {shown}, no tensor; a program's method returns at least one tensor")
    return program.run_decompositions(table)


@contextlib.contextmanager
def _quiet_torch() -> Iterator[None]:
    """torch.export prints the partial graph of a model it cannot trace (thousands of lines) and
    logs its own errors; the one line `ExportError` says is what the user sees. `PIPELINE_DEBUG=1`
    keeps torch's output."""
    if os.environ.get("PIPELINE_DEBUG"):
        yield
        return
    logging.disable(logging.ERROR)
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            yield
    finally:
        logging.disable(logging.NOTSET)


def _export_reason(exc: Exception) -> str:
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    where = _where(exc)
    if "data-dependent" in str(exc) or "GuardOnDataDependent" in type(exc).__name__:
        return (f"{type(exc).__name__}: {first[:200]}{where}; the model branches on tensor values there, which a "
                "program cannot: use torch.cond or torch.where there, or build the program from the part before it "
                "(a detector's backbone and heads) and run the rest in Python")
    return (f"{type(exc).__name__}: {first[:300]}{where}; check the model and model.methods.<method>.inputs "
            "(dtypes, shapes)")


def _where(exc: Exception) -> str:
    """` at FILE:LINE in FUNCTION`: the model's code that failed (torch names it for a guard on
    data; else the innermost frame outside torch), or "" when neither says."""
    torch_dir = os.path.dirname(torch.__file__)
    caused = re.search(r"Caused by: \(([^):]+)(:[^)]+)\)", str(exc))
    if caused and not os.path.exists(os.path.join(torch_dir, caused.group(1))):  # torch's own frame says nothing
        return f" at {caused.group(1)}{caused.group(2)}"
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if not f.filename.startswith(torch_dir)]
    inner = frames[-1] if len(frames) > 1 else None  # the first is export_method itself
    return f" at {inner.filename}:{inner.lineno} in {inner.name}" if inner is not None else ""


def written_state(programs: Iterable[ExportedProgram]) -> frozenset[str]:
    """The buffers any of a program's methods writes (a KV cache, a step counter): its state."""
    return frozenset(name for p in programs for name in p.graph_signature.buffers_to_mutate.values())


def compile_program(program: ExportedProgram, example_inputs: Sequence[Any], spec: TensorRTCompileSpec | None = None,
                    method: str = "forward", cache: EngineCache | None = None,
                    state: Collection[str] = (), input_values: Sequence[tuple[int, int] | None] = ()) -> ExportedProgram:
    """`compile_method` from an `export_method` program."""
    bounds = value_bounds(program, input_values)  # read from the ops as written, before any becomes an engine
    spec = (spec or TensorRTCompileSpec()).for_method(method)
    spec = spec.with_symbol_ranges(symbol_ranges(program, spec))
    gm = program.module()
    quantize.check_keep(spec.quantize, [n for n, _ in (*gm.named_parameters(), *gm.named_buffers())], method)
    drop_metadata_asserts(gm)
    complex_as_pairs(gm)
    state = written_buffers(gm) | frozenset(state)  # never constants: what a method reads, another may have written
    given = {name for name, _ in gm.named_buffers()}
    fold_constants(gm, state)
    if spec.attention == "fused":
        fuse_attention(gm)
    if spec.attention != "as_written":
        share_kv_heads(gm)  # what the fusion did not take
    if spec.quantize.mode == "fp8":
        spec = _calibrated(spec, gm, method, example_inputs)
    if spec.quantize.mode == "int4_weight_only" and spec.attention == "as_written":
        log.warning("method %r: with int4 weights and compile.attention=as_written, TensorRT-RTX dequantizes the weights "
                    "of each attention's output product in a kernel of their own at every call; compile.attention=fused "
                    "keeps every product in its int4 kernel (1.25x the decode speed, docs/quantization.md)", method)
    if spec.quantize.mode == "int8_weight_only":
        log.warning("method %r: int8 weights make the file small, but TensorRT-RTX dequantizes them in kernels of their "
                    "own: slower and larger in device memory than fp16 (docs/quantization.md); int4_weight_only is not",
                    method)
    take_products(gm, spec, state, method)
    take_attention(gm, spec, method)
    engines, plans = _replace_partitions(gm, program.range_constraints, spec, method, cache, state, example_inputs)
    quantize.say_what_was_quantized(spec.quantize, plans, method)
    drop_metadata_asserts(gm)  # numbers an engine now computes inside, which only assertions read outside
    gm.graph.eliminate_dead_code()
    gm.recompile()
    _drop_unread(gm, given)
    log.info("method %r: %d TensorRT engine(s)", method, engines)
    flat_args = torch.utils._pytree.tree_leaves(tuple(example_inputs))
    compiled = torch.export.export(gm, tuple(flat_args), dynamic_shapes=_flat_dims(program))
    set_input_values(compiled, bounds)
    return compiled


def _calibrated(spec: TensorRTCompileSpec, gm: torch.fx.GraphModule, method: str,
                example_inputs: Sequence[Any]) -> TensorRTCompileSpec:
    """`spec` with the input magnitudes of fp8 layers from its calibration file (or the example inputs)."""
    flat = tuple(torch.utils._pytree.tree_leaves(tuple(example_inputs)))
    if spec.quantize.calibration is None:
        log.warning("method %r: fp8 input scales come from the example inputs alone; name representative inputs in "
                    "compile.quantize.calibration (values beyond them saturate)", method)
    shapes = [tuple(d if isinstance(d, int) else None for d in n.meta["val"].shape) for n in gm.graph.nodes
              if n.op == "placeholder" and isinstance(n.meta.get("val"), torch.Tensor)]
    inputs = calibration.samples(spec.quantize.calibration, method, flat, shapes if len(shapes) == len(flat) else None)
    amax = calibration.activation_amax(gm, inputs)
    log.info("method %r: calibrated %d fp8 layer input(s) on %d sample(s)", method, len(amax), len(inputs))
    return replace(spec, quantize=spec.quantize.with_activation_amax(amax))


def _drop_unread(gm: torch.fx.GraphModule, given: set[str]) -> None:
    """Remove the constants the compile step made (folded) that no node reads any more
    (an engine took them in): the program would carry them beside the engine."""
    read = {str(n.target) for n in gm.graph.nodes if n.op == "get_attr"}
    for name in [n for n, _ in gm.named_buffers()]:
        if name not in given and name not in read and "." not in name:
            delattr(gm, name)


def drop_metadata_asserts(gm: torch.fx.GraphModule) -> None:
    """Remove the assertions that guard nothing the program computes: dtype/device ones
    (`_assert_tensor_metadata`: export checked them, they hold for every input the program accepts),
    and those on a number read from a tensor (`item`) that only assertions read (a size whose tensor
    export dropped as unused: OPT's mask of start + T ones, once the positions are given)."""
    for node in list(gm.graph.nodes):
        if node.target is torch.ops.aten._assert_tensor_metadata.default and not node.users:
            gm.graph.erase_node(node)
    for node in list(gm.graph.nodes):
        if node.target in _READS_NUMBER:
            cone = _number_uses(node)
            if cone is not None:
                for user in reversed(cone):
                    gm.graph.erase_node(user)
                gm.graph.erase_node(node)
    gm.recompile()


_READS_NUMBER = (torch.ops.aten._local_scalar_dense.default, torch.ops.aten.item.default)
_ASSERTS = (torch.ops.aten._assert_scalar.default, torch.ops.aten.sym_constrain_range.default,
            torch.ops.aten.sym_constrain_range_for_size.default)


def _number_uses(node: torch.fx.Node) -> list[torch.fx.Node] | None:
    """Every node that reads the number `node` reads, in graph order, when they are only arithmetic on
    numbers and assertions; None when any tensor op reads it."""
    seen: dict[torch.fx.Node, None] = {}
    todo = list(node.users)
    while todo:
        user = todo.pop()
        if user in seen:
            continue
        numeric = user.op == "call_function" and not isinstance(user.target, torch._ops.OpOverload) \
            and isinstance(user.meta.get("val"), (torch.SymInt, torch.SymBool, torch.SymFloat, int, bool))
        if user.target not in _ASSERTS and not numeric:
            return None
        seen[user] = None
        todo.extend(user.users)
    order = {n: i for i, n in enumerate(node.graph.nodes)}
    return sorted(seen, key=order.__getitem__)


def _flat_dims(program: ExportedProgram) -> tuple[dict[int, Any], ...] | None:
    """Dynamic shapes of the flat user inputs, one `Dim` per symbol, so dims shared before stay shared."""
    dims: dict[Any, Any] = {}
    out = []
    nodes = {n.name: n for n in program.graph.nodes}
    for name in program.graph_signature.user_inputs:
        shape = getattr(nodes[name].meta.get("val"), "shape", ())
        spec = {}
        for i, size in enumerate(shape):
            if isinstance(size, int):
                continue
            sym = size.node.expr
            if sym not in dims:
                vr = program.range_constraints[sym]
                dims[sym] = torch.export.Dim(f"d_{sym}", min=int(vr.lower), max=int(vr.upper))
            spec[i] = dims[sym]
        out.append(spec)
    return tuple(out) if dims else None


def _replace_partitions(gm: torch.fx.GraphModule, ranges: dict[Any, Any], spec: TensorRTCompileSpec, method: str,
                        cache: EngineCache | None, state: frozenset[str],
                        example_inputs: Sequence[Any] = ()) -> tuple[int, list[quantize.QuantizationPlan]]:
    """Each claimable block becomes one engine call; the buffers in `state` (those the program
    writes) reach engines as inputs at run time, the other buffers and weights are built in. Each
    engine's network is checked by the reference executor on the values the example inputs give it
    (its build statistics' `reference`). Returns the number of engines and what each quantizes."""
    blocks, refused = propose(gm, spec)
    if _constant_work_left(gm, blocks, state):
        fold_constants(gm, state, computes=())
        blocks, refused = propose(gm, spec)
    mark_refused(gm, refused)
    fused = fuse_by_partitions(gm, [dict.fromkeys(block) for block in blocks], prefix="fused_")
    calls = [n for n in fused.graph.nodes if n.op == "call_module" and n.target.startswith("fused_")]
    channels_last = _between_engines(fused, calls)
    values = example_values(fused, calls, example_inputs, bool(state))  # before any call is replaced: its arguments as made
    plans = [_replace_with_engine(fused, node, ranges, spec, f"engine {count + 1}/{len(calls)} of method {method!r}",
                                  cache, state, channels_last[node], values.get(node))
             for count, node in enumerate(calls)]  # the label is the progress line: "engine 3/12 of method ..."
    fused.graph.eliminate_dead_code()
    fused.delete_all_unused_submodules()
    fused.recompile()
    return len(calls), plans


def _between_engines(gm: torch.fx.GraphModule, calls: list[torch.fx.Node]) -> dict[torch.fx.Node, frozenset[str]]:
    """Per engine call, the bindings (placeholder names, `output_<i>`) of its 4-D float values that
    pass from one engine to others only (no kernel, no method output reads them): their memory is
    the engines' own, held channels last as the engines' convolutions hold it."""
    engines = set(calls)
    names: dict[torch.fx.Node, set[str]] = {call: set() for call in calls}
    for call in calls:
        sub: torch.fx.GraphModule = getattr(gm, call.target)  # type: ignore[arg-type]
        tuple_out = isinstance(next(n for n in sub.graph.nodes if n.op == "output").args[0], (tuple, list))
        items = [u for u in call.users if u.target is operator.getitem]
        values = {u: int(u.args[1]) for u in items} if tuple_out else {call: 0}  # type: ignore[arg-type]
        for value, index in values.items():
            if not value.users or not set(value.users) <= engines or not holds_channels_last(value.meta.get("val")):
                continue
            names[call].add(f"output_{index}")
            for reader in value.users:
                sub_reader: torch.fx.GraphModule = getattr(gm, reader.target)  # type: ignore[arg-type]
                placeholders = [n for n in sub_reader.graph.nodes if n.op == "placeholder"]
                names[reader] |= {ph.name for ph, arg in zip(placeholders, reader.args) if arg is value}
    return {call: frozenset(found) for call, found in names.items()}


def _constant_work_left(gm: torch.fx.GraphModule, blocks: list[list[torch.fx.Node]], state: frozenset[str]) -> bool:
    """Whether an operator that folding left to the engines (`ENGINE_COMPUTES`) is in no block that reads
    a runtime value: an engine without inputs, or a portable kernel recomputing a constant each call."""
    def runtime(node: torch.fx.Node) -> bool:
        return node.op != "get_attr" or str(node.target) in state

    left = {n for n in gm.graph.nodes if n.target in ENGINE_COMPUTES and not any(map(runtime, n.all_input_nodes))}
    for block in blocks:
        inside = set(block)
        if any(runtime(i) for n in block for i in n.all_input_nodes if i not in inside):
            left -= inside
    return bool(left)


def _replace_with_engine(gm: torch.fx.GraphModule, call: torch.fx.Node, ranges: dict[Any, Any],
                         spec: TensorRTCompileSpec, label: str, cache: EngineCache | None, state: frozenset[str],
                         channels_last: frozenset[str], values: dict[str, Any] | None) -> quantize.QuantizationPlan:
    sub: torch.fx.GraphModule = getattr(gm, call.target)  # type: ignore[arg-type]
    for ph, arg in zip([n for n in sub.graph.nodes if n.op == "placeholder"], call.args):
        assert isinstance(arg, torch.fx.Node)
        ph.meta.setdefault("val", arg.meta.get("val"))
    _sizes_inside(sub, call)
    placeholders = [n for n in sub.graph.nodes if n.op == "placeholder"]
    constants: dict[str, torch.Tensor | None] = {}
    names: dict[str, str] = {}  # placeholder -> the model's name of the constant it reads
    runtime_args = []
    for ph, arg in zip(placeholders, call.args):
        assert isinstance(arg, torch.fx.Node)
        if arg.op == "get_attr" and str(arg.target) not in state:
            constants[ph.name] = attr(gm, str(arg.target))
            names[ph.name] = str(arg.target)
        else:
            constants[ph.name] = None
            runtime_args.append(arg)
    _rematerialize_symints(gm, call, sub, dict(zip(placeholders, call.args)))
    source = GraphSource(sub.graph, constants, ranges, names, channels_last)
    built = build_engine(source, spec, label=label, cache=cache)
    inputs = [ph for ph in placeholders if constants[ph.name] is None]
    outputs = _outputs(sub)
    shapes = [[_dim_expr(d, inputs) for d in o.meta["val"].shape] for o in outputs]
    # Only what the build determines: timings would make cached stage outputs differ run to run.
    plan = quantize.plan(source, spec.quantize)
    stats = {"num_layers": built.num_layers, "engine_bytes": len(built.engine),
             "profiles": profile_count(built.metadata, spec), "quantized": plan.summary(),
             "reference": checked(source, spec, sub, values, label, built)}
    metadata = blob.encode_op_metadata(built.metadata, shapes, stats)
    engine = torch.frombuffer(bytearray(built.engine), dtype=torch.uint8)
    name = f"_tensorrt_engine_{content_digest(engine)}"  # by content, as every constant the compile step makes
    gm.register_buffer(name, engine)
    with gm.graph.inserting_before(call):
        engine_node = gm.graph.get_attr(name)
        result = gm.graph.call_function(torch.ops.tensorrt.execute_engine.default, (runtime_args, engine_node, metadata))
        result.meta["val"] = [o.meta["val"] for o in outputs]
        result.meta["custom"] = {RECORD_KEY: {"claimed": [n.name for n in sub.graph.nodes if is_operator(n)]}}
    _rewire(gm, call, result, sub)
    return plan


def _sizes_inside(sub: torch.fx.GraphModule, call: torch.fx.Node) -> None:
    """Sizes the subgraph would take as inputs (one computed for an earlier engine or a kernel
    between) are computed inside from the dims of its tensor inputs instead: engines take tensors.
    A size no input's dims express stays an input (and the build names it)."""
    placeholders = [n for n in sub.graph.nodes if n.op == "placeholder"]
    dims: dict[Any, tuple[torch.fx.Node, int]] = {}
    for ph in placeholders:
        val = ph.meta.get("val")
        for i, size in enumerate(val.shape if isinstance(val, torch.Tensor) else ()):
            if isinstance(size, torch.SymInt) and size.node.expr.is_Symbol:
                dims.setdefault(size.node.expr, (ph, i))
    args = list(call.args)
    first = next(n for n in sub.graph.nodes if n.op != "placeholder")
    for ph in placeholders:  # all before the first computation (torch 2.11 interleaves them), sizes after
        first.prepend(ph)
    for index in reversed(range(len(placeholders))):
        ph = placeholders[index]
        if not isinstance(ph.meta.get("val"), torch.SymInt):
            continue
        with sub.graph.inserting_before(first):
            value = _size_of(sub.graph, ph.meta["val"].node.expr, dims)
        if value is None:
            continue
        ph.replace_all_uses_with(value)
        sub.graph.erase_node(ph)
        del args[index]
    call.args = tuple(args)
    sub.graph.eliminate_dead_code()  # the parts of a size that could not be computed whole
    sub.graph.lint()
    sub.recompile()


def _size_of(graph: torch.fx.Graph, expr: Any, dims: dict[Any, tuple[torch.fx.Node, int]]) -> Any:
    """Nodes computing the size expression `expr` (sums and products of integers and the symbols of
    `dims`, each the size of a tensor input's dim); None for any other expression."""
    if expr.is_Integer:
        return int(expr)
    if expr.is_Symbol:
        if expr not in dims:
            return None
        tensor, dim = dims[expr]
        node = graph.call_function(torch.ops.aten.sym_size.int, (tensor, dim))
        node.meta["val"] = tensor.meta["val"].shape[dim]
        return node
    combine = {"Add": operator.add, "Mul": operator.mul}.get(type(expr).__name__)
    if combine is None:
        return None
    terms = [_size_of(graph, term, dims) for term in expr.args]
    if any(term is None for term in terms):
        return None
    value = terms[0]
    for term in terms[1:]:
        vals = [t.meta["val"] if isinstance(t, torch.fx.Node) else t for t in (value, term)]
        value = graph.call_function(combine, (value, term))
        value.meta["val"] = combine(*vals)
    return value


def _rematerialize_symints(gm: torch.fx.GraphModule, call: torch.fx.Node, sub: torch.fx.GraphModule,
                           outer: dict[torch.fx.Node, Any]) -> None:
    """Sizes the subgraph computes for nodes outside it are recomputed outside (engines return tensors)."""
    output = next(n for n in sub.graph.nodes if n.op == "output")
    results = output.args[0] if isinstance(output.args[0], (tuple, list)) else (output.args[0],)
    keep = [r for r in results if isinstance(r.meta.get("val"), torch.Tensor)]  # type: ignore[union-attr]
    if len(keep) == len(results):
        return
    copies: dict[torch.fx.Node, Any] = dict(outer)

    def copy(node: torch.fx.Node) -> Any:
        if node not in copies:
            with gm.graph.inserting_before(call):
                copies[node] = gm.graph.node_copy(node, lambda n: copy(n))
        return copies[node]

    for user in list(call.users):
        index = user.args[1] if user.target is operator.getitem else 0
        value = results[index]  # type: ignore[index]
        if not isinstance(value.meta.get("val"), torch.Tensor):  # type: ignore[union-attr]
            user.replace_all_uses_with(copy(value))  # type: ignore[arg-type]
            gm.graph.erase_node(user)
    for user in list(call.users):  # renumber the remaining tensor outputs
        user.args = (call, keep.index(results[user.args[1]]))  # type: ignore[index]
    output.args = (tuple(keep),)
    sub.graph.eliminate_dead_code()
    sub.recompile()


def _outputs(sub: torch.fx.GraphModule) -> list[torch.fx.Node]:
    out = next(n for n in sub.graph.nodes if n.op == "output").args[0]
    return list(out) if isinstance(out, (tuple, list)) else [out]  # type: ignore[arg-type]


def _rewire(gm: torch.fx.GraphModule, call: torch.fx.Node, result: torch.fx.Node, sub: torch.fx.GraphModule) -> None:
    out = next(n for n in sub.graph.nodes if n.op == "output").args[0]
    if isinstance(out, (tuple, list)):
        for user in list(call.users):
            if user.target is operator.getitem:
                with gm.graph.inserting_before(user):
                    item = gm.graph.call_function(operator.getitem, (result, user.args[1]))
                item.meta = dict(user.meta)
                user.replace_all_uses_with(item)
                gm.graph.erase_node(user)
    else:
        with gm.graph.inserting_before(call):
            item = gm.graph.call_function(operator.getitem, (result, 0))
        item.meta = dict(call.meta)
        call.replace_all_uses_with(item)
    gm.graph.erase_node(call)


def _dim_expr(dim: Any, inputs: list[torch.fx.Node]) -> int | str:
    """An output dim as an int, or an expression over input dims that the fake kernel evaluates."""
    if isinstance(dim, int):
        return dim
    expr = dim.node.expr
    names: dict[sympy.Symbol, sympy.Symbol] = {}
    for i, ph in enumerate(inputs):
        for d, size in enumerate(ph.meta["val"].shape):
            if not isinstance(size, int) and isinstance(size.node.expr, sympy.Symbol):
                names.setdefault(size.node.expr, sympy.Symbol(f"in{i}_{d}"))
    if not expr.free_symbols <= set(names):
        raise UnsupportedOperatorError(
            f"an engine output has size {expr}, which is not a function of the engine's input sizes "
            "(data-dependent output shapes need an output allocator, which is not supported)"
        )
    return str(expr.subs(names))
