"""The composable staged export: engine-bearing programs in, ExecuTorch's `EdgeProgramManager` out.

TensorRT claims every engine call first (one delegate each), then the caller's partitioners run,
per method when given as a mapping. Each program is staged first: graph structure, signature,
state containers, constants and metadata are copied, tensor and engine payloads are shared, so the
caller's program is exactly as it was after success and after any failure. `serialize.save` writes the
`.pte` (and `.ptd`) through this same code.
"""

from __future__ import annotations

import copy
import keyword
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from executorch.exir import EdgeCompileConfig, EdgeProgramManager, to_edge_transform_and_lower
from executorch.exir.backend.partitioner import Partitioner
from torch.export import ExportedProgram

from pipeline.delegate import blob, record
from pipeline.engine.compile_spec import METHOD_KEY, TensorRTCompileSpec
from pipeline.errors import ExportError
from pipeline.executorch_api import edge_programs
from pipeline.lowering.kernel_ops import fewer_kernels
from pipeline.lowering.partitioner import TensorRTPartitioner
from pipeline.lowering.report import lowering_report

Source = torch.fx.GraphModule | ExportedProgram | Mapping[str, ExportedProgram]
PerMethod = Any  # a value, or a mapping of method name -> value


@dataclass(frozen=True)
class Lowered:
    """What `export` returns: the Edge programs (ExecuTorch's manager, which `serialize.write_program`
    writes) and the lowering report of every method (`report.lowering_report`)."""

    manager: EdgeProgramManager
    report: dict[str, Any]


def export(
    source: Source,
    *,
    inputs: Sequence[Any] | None = None,
    partitioners: Sequence[Partitioner] | Mapping[str, Sequence[Partitioner]] | None = None,
    compile_specs: TensorRTCompileSpec | Mapping[str, TensorRTCompileSpec] | None = None,
    transform_passes: Sequence[Any] | Mapping[str, Sequence[Any]] | None = None,
    compile_config: EdgeCompileConfig | None = None,
    constant_methods: Mapping[str, Any] | None = None,
    generate_etrecord: bool = False,
) -> Lowered:
    """Lower engine-bearing programs to an ExecuTorch `EdgeProgramManager`.

    Args:
        source: an engine-bearing `GraphModule` (with `inputs`), `ExportedProgram`, or a mapping of
            method names to independent `ExportedProgram`s.
        inputs: example inputs, required when `source` is a `GraphModule`.
        partitioners: partitioners that run after TensorRT (a list, or a list per method).
        compile_specs: TensorRT options (one, or one per method).
        transform_passes: Edge passes (a list, or a list per method).
        compile_config: Edge compile config; default skips IR validity checks (engine graphs fail them).
        constant_methods: name -> value, stored in the program as methods returning constants.
        generate_etrecord: keep an ETRecord on the returned manager.
    Returns:
        The manager and the lowering report (`Lowered`).
    Raises:
        ExportError: bad input (see messages).
    """
    programs = _programs(source, inputs)
    methods = list(programs)
    specs = _per_method(compile_specs, methods, "compile_specs")
    chains = _per_method(partitioners, methods, "partitioners")
    passes = _per_method(transform_passes, methods, "transform_passes")
    _check_constant_methods(constant_methods, methods)
    trt = {m: TensorRTPartitioner((specs[m] or TensorRTCompileSpec()).for_method(m), claim_ops=False) for m in methods}
    chain = {m: [trt[m], *(chains[m] or [])] for m in methods}
    _check_partitioner_methods(chain)
    staged = {m: stage(p) for m, p in programs.items()}
    constants = {**(constant_methods or {}), **record.values_method(programs)}
    manager = to_edge_transform_and_lower(
        staged,
        transform_passes=passes if any(passes.values()) else None,
        partitioner=chain,
        constant_methods=constants or None,
        compile_config=compile_config or EdgeCompileConfig(_check_ir_validity=False),
        generate_etrecord=generate_etrecord,
    )
    _keep_lower_bounds(manager, staged)
    for program in edge_programs(manager).values():
        fewer_kernels(program)
    return Lowered(manager, lowering_report(edge_programs(manager), {m: trt[m].record for m in methods}))


def _keep_lower_bounds(manager: EdgeProgramManager, sources: Mapping[str, ExportedProgram]) -> None:
    """Edge lowering re-traces each program and narrows dynamic dims declared from 1 to start at 2
    (PyTorch's 0/1 specialization); the program still takes 1, as exported, so its range says so
    again (the program record and the runtime's input checks read these ranges)."""
    for method, source in sources.items():
        ranges = manager.exported_program(method).range_constraints
        for symbol, bound in list(ranges.items()):
            declared = source.range_constraints.get(symbol)
            if declared is not None and declared.lower < bound.lower and declared.upper == bound.upper:
                ranges[symbol] = type(bound)(declared.lower, bound.upper)


# ---- staging ------------------------------------------------------------------------------------
def stage(program: ExportedProgram) -> ExportedProgram:
    """An independent copy of `program`'s structure that shares its tensor and engine payloads."""
    graph = torch.fx.Graph()
    copies: dict[torch.fx.Node, torch.fx.Node] = {}
    out = graph.graph_copy(program.graph, copies)
    graph.output(out)
    for old, new in copies.items():
        new.name = old.name  # the copy's namespace may rename builtins such as `input`; the signature names them
    root = torch.fx.GraphModule(program.graph_module, graph)
    return ExportedProgram(
        root=root,
        graph=root.graph,
        graph_signature=copy.deepcopy(program.graph_signature),
        state_dict=dict(program.state_dict),
        range_constraints=dict(program.range_constraints),
        module_call_graph=copy.deepcopy(program.module_call_graph),
        example_inputs=program.example_inputs,
        constants=dict(program.constants),
        verifiers=[program.verifier],
    )


# ---- validation -----------------------------------------------------------------------------------
def _programs(source: Source, inputs: Sequence[Any] | None) -> dict[str, ExportedProgram]:
    if isinstance(source, ExportedProgram):
        return {"forward": source}
    if isinstance(source, torch.fx.GraphModule):
        if inputs is None:
            raise ExportError("a GraphModule source needs example `inputs=` to be exported; pass the inputs it was compiled with")
        return {"forward": torch.export.export(source, tuple(inputs))}
    if isinstance(source, torch.nn.Module):
        raise ExportError(
            f"source is a plain {type(source).__name__}; compile it first (pipeline.lowering.compile.compile_method) and pass "
            "the engine-bearing ExportedProgram, or a mapping of method names to ExportedPrograms"
        )
    if not isinstance(source, Mapping) or not source:
        raise ExportError(f"source must be a GraphModule, an ExportedProgram or a non-empty mapping, got {type(source).__name__}")
    seen: dict[int, str] = {}
    for name, program in source.items():
        if not isinstance(program, ExportedProgram):
            raise ExportError(f"method {name!r} maps to a {type(program).__name__}; expected an ExportedProgram")
        if id(program) in seen:
            raise ExportError(
                f"methods {seen[id(program)]!r} and {name!r} are the same ExportedProgram object; methods must be "
                "independent programs (export each method separately)"
            )
        seen[id(program)] = name
    _check_constant_names(source)
    return dict(source)


def _check_constant_names(programs: Mapping[str, ExportedProgram]) -> None:
    """Equal names, equal data: a program keeps one entry per constant name for all its methods (in
    the `.ptd` one entry per name), so a name that holds different data in two methods would have
    one method silently read the other's. The pipeline's own constants are named by content.

    Raises:
        ExportError: two methods hold different data under one name.
    """
    seen: dict[str, tuple[str, torch.Tensor]] = {}
    for method, program in programs.items():
        for name, value in [*program.state_dict.items(), *program.constants.items()]:
            if not isinstance(value, torch.Tensor):
                continue
            first = seen.setdefault(name, (method, value))
            other = first[1]
            if other is value or (other.dtype == value.dtype and other.shape == value.shape and torch.equal(other, value)):
                continue
            raise ExportError(f"constant {name!r} holds different data in methods {first[0]!r} and {method!r}; a program "
                              "stores constants by name for all its methods, so one would read the other's (give them "
                              "distinct names, or build each method from one module)")


def _per_method(value: PerMethod, methods: list[str], what: str) -> dict[str, Any]:
    if isinstance(value, Mapping):
        unknown = sorted(set(value) - set(methods))
        if unknown:
            raise ExportError(f"{what} names unknown method(s) {unknown}; the program's methods are {methods}")
        return {m: value.get(m) for m in methods}
    return dict.fromkeys(methods, value)


def _check_constant_methods(constants: Mapping[str, Any] | None, methods: list[str]) -> None:
    for key in constants or {}:
        if not isinstance(key, str) or not key.isidentifier() or keyword.iskeyword(key):
            raise ExportError(f"constant method name {key!r} is not a Python identifier; rename it (e.g. 'max_seq_len')")
        if key in methods or key in (record.METHOD, record.VALUES):
            raise ExportError(f"constant method {key!r} has the name of a program method or of the pipeline's "
                              "record; pick another name")


def _check_partitioner_methods(chains: Mapping[str, Sequence[Partitioner]]) -> None:
    for method, chain in chains.items():
        for partitioner in chain:
            named = _spec_method(partitioner)
            if named is not None and named != method:
                raise ExportError(
                    f"a {type(partitioner).__name__} whose compile specs name method {named!r} is used for method "
                    f"{method!r}; give each method its own partitioner instance"
                )


def _spec_method(partitioner: Partitioner) -> str | None:
    spec = getattr(partitioner, "delegation_spec", None)
    entries = [e for e in getattr(spec, "compile_specs", None) or [] if e.key == METHOD_KEY]
    if not entries or getattr(spec, "backend_id", blob.BACKEND_ID) != blob.BACKEND_ID:
        return None
    method = blob.decode_compile_specs(entries)[METHOD_KEY]
    return None if method is None else str(method)


