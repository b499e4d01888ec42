"""The composable staged export: engine-bearing programs in, ExecuTorch's `EdgeProgramManager` out.

TensorRT claims every engine call first (one delegate each), then the caller's partitioners run,
per method when given as a mapping. Each program is staged first: graph structure, signature,
state containers, constants and metadata are copied, tensor and engine payloads are shared, so the
caller's program is exactly as it was after success and after any failure. `save` writes the
`.pte` (and `.ptd`) through this same code.
"""

from __future__ import annotations

import copy
import keyword
import os
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from executorch.exir import EdgeCompileConfig, EdgeProgramManager, ExecutorchBackendConfig, to_edge_transform_and_lower
from executorch.exir._serialize._named_data_store import NamedDataStore, NamedDataStoreOutput
from executorch.exir._serialize._program import PTEFile, serialize_pte_binary
from executorch.exir.backend.partitioner import Partitioner
from executorch.exir.passes import MemoryPlanningPass
from torch.export import ExportedProgram

from pipeline import record
from pipeline.errors import ExportError
from pipeline.files import fix_modes, remove_stale_temporaries, temp_prefix, writing
from pipeline.tensorrt import blob
from pipeline.tensorrt.compile_spec import METHOD_KEY, TensorRTCompileSpec
from pipeline.tensorrt.partitioner import TensorRTPartitioner
from pipeline.tensorrt.report import lowering_report
from pipeline.write_back import write_in_place

Source = torch.fx.GraphModule | ExportedProgram | Mapping[str, ExportedProgram]
PerMethod = Any  # a value, or a mapping of method name -> value
# ExecuTorch's tag for external constants (`external_constants_pass`); `.ptd` files are named by tag.
EXTERNAL_TAG = "_default_external_constant"


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
) -> EdgeProgramManager:
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
        The manager; `manager.tensorrt_report` holds the lowering report.
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
    manager.tensorrt_report = lowering_report(manager._edge_programs, {m: trt[m].record for m in methods})  # type: ignore[attr-defined]
    return manager


def save(source: Source, path: str | os.PathLike[str], *, external_data: bool = False, etrecord: bool = False,
         **options: Any) -> dict[str, Path]:
    """Export with `export(**options)` and write the program (see `write_program`).

    Returns:
        The files written, by kind ("pte", "ptd", "etrecord").
    """
    manager = export(source, generate_etrecord=etrecord, **options)
    return write_program(manager, path, external_data=external_data, etrecord=etrecord)


def write_program(manager: EdgeProgramManager, path: str | os.PathLike[str], *, external_data: bool = False,
                  etrecord: bool = False) -> dict[str, Path]:
    """Serialize `manager` to `<path>` (.pte), `<base>.ptd` when data is external and any exists (a
    stale `.ptd` is removed), and `<base>_etrecord.bin` with `etrecord`. TensorRT engines are named
    data, each stored once: `.pte` segments, or with `external_data` the `.ptd` (with the weights
    left outside engines), so the `.pte` keeps only the program and blob metadata. Every file is
    written to a temporary name first: outputs appear complete or not at all. The `.pte` carries its
    program record (`record.py`): its inputs' bounds, its own digest and its `.ptd`'s.

    Returns:
        The files written, by kind ("pte", "ptd", "etrecord").
    """
    sealed = copy.copy(manager)  # the caller's manager keeps its constant methods and named data
    programs = {m: manager.exported_program(m) for m in manager.methods}
    constants = dict(manager._config_methods or {})
    values = constants.pop(record.VALUES, None)  # folded into the record
    sealed._config_methods = {**constants, record.METHOD: record.placeholder(record.inputs_of(programs, values))}
    sealed._named_data_store = _place_engines(manager._named_data_store, external_data)
    config = _backend_config(programs, external_data)
    program = sealed.to_executorch(config)
    if write_in_place(program.executorch_program):
        program._pte_data = _serialized_pte(program, config)
    target = Path(path)
    base = target.with_suffix("")
    written = {"pte": target}
    with writing(target):
        target.parent.mkdir(parents=True, exist_ok=True)
        remove_stale_temporaries(target)
        with tempfile.TemporaryDirectory(dir=target.parent, prefix=temp_prefix(target)) as tmp:
            ptd = _tensor_data(program, Path(tmp))
            (Path(tmp) / "program.pte").write_bytes(record.seal(program.buffer, record.sha256(ptd.read_bytes()) if ptd else None))
            if etrecord:
                _write_etrecord(manager, program, Path(tmp) / "etrecord.bin")
            fix_modes(Path(tmp))
            if ptd is not None:
                os.replace(ptd, base.with_suffix(".ptd"))
                written["ptd"] = base.with_suffix(".ptd")
            elif base.with_suffix(".ptd").exists():
                base.with_suffix(".ptd").unlink()
            if etrecord:
                os.replace(Path(tmp) / "etrecord.bin", Path(f"{base}_etrecord.bin"))
                written["etrecord"] = Path(f"{base}_etrecord.bin")
            os.replace(Path(tmp) / "program.pte", target)
    return written


def _backend_config(programs: Mapping[str, ExportedProgram], external_data: bool) -> ExecutorchBackendConfig:
    """How to emit the program: constants external or not. A program with state (buffers its
    methods write, such as a KV cache) keeps each state buffer once for all methods (planned at
    the same place in every method) and under its name, so that what prefill writes decode reads.

    Raises:
        ExportError: a state buffer does not start at zero (programs start their state at zero).
    """
    state = {fqn for p in programs.values() for fqn in p.graph_signature.buffers_to_mutate.values()}
    if not state:
        return ExecutorchBackendConfig(external_constants=external_data)
    for method, p in programs.items():
        for fqn in set(p.graph_signature.buffers_to_mutate.values()):
            value = p.state_dict.get(fqn)
            value = value if value is not None else p.constants.get(fqn)  # a non-persistent buffer
            if value is not None and bool(value.any()):
                raise ExportError(f"buffer {fqn!r}, which method {method!r} writes, does not start at zero; a "
                                  "program's state starts at zero: set its first value in a method instead")
    # A method that only reads a state buffer would otherwise keep it as a constant, in the .ptd when
    # data is external, and never see what the others write: state stays state in every method.
    held = {name for p in programs.values() for name, fqn in p.graph_signature.inputs_to_buffers.items() if fqn in state}
    return ExecutorchBackendConfig(
        external_constants=(lambda node: None if node.name in held else EXTERNAL_TAG) if external_data else False,
        emit_mutable_buffer_names=True, memory_planning_pass=MemoryPlanningPass(share_mutable_buffers=True))


def _serialized_pte(program: Any, config: ExecutorchBackendConfig) -> Any:
    """The `.pte` bytes of `program` serialized again (after `write_in_place` changed it), as
    `to_executorch` serialized them: its named data that stays in the `.pte`, nothing external."""
    named = program._named_data
    if named is not None and named.external_data:
        named = NamedDataStoreOutput(buffers=named.buffers, pte_data=named.pte_data, external_data={})
    pte_file = PTEFile(program=program.executorch_program, mutable_data=program._emitter_output.mutable_data,
                       named_data=named if named is not None and named.pte_data else None)
    return serialize_pte_binary(pte_file=pte_file, extract_delegate_segments=config.extract_delegate_segments,
                                segment_alignment=config.segment_alignment,
                                constant_tensor_alignment=config.constant_tensor_alignment,
                                delegate_alignment=config.delegate_alignment)


def _place_engines(store: NamedDataStore, external: bool) -> NamedDataStore:
    """The program's named data with every TensorRT engine in the `.pte` (segments) or, when
    `external`, in the `.ptd` (the tag ExecuTorch gives external constants, so one file holds both)."""
    data = store.get_named_data_store_output()
    out = NamedDataStore()
    entries = [(k, e, None) for k, e in data.pte_data.items()]
    entries += [(k, e, tag) for tag, group in data.external_data.items() for k, e in group.items()]
    for key, entry, tag in entries:
        if blob.is_engine_key(key):
            tag = EXTERNAL_TAG if external else None
        out.add_named_data(key, data.buffers[entry.buffer_index], entry.alignment, external_tag=tag,
                           tensor_layout=entry.tensor_layout)
    return out


def _write_etrecord(manager: EdgeProgramManager, program: Any, path: Path) -> None:
    # A manager exported with generate_etrecord carries one; one reloaded between stages does not.
    if getattr(program, "_etrecord", None) is not None:
        program.get_etrecord().save(str(path))
        return
    from executorch.devtools import generate_etrecord

    generate_etrecord(str(path), edge_dialect_program=manager, executorch_program=program)


def _tensor_data(program: Any, tmp: Path) -> Path | None:
    """Write the program's external tensor data into one `.ptd` in `tmp`; None when there is none."""
    if not getattr(program, "_tensor_data", None):
        return None
    out = tmp / "data"
    out.mkdir()
    program.write_tensor_data_to_file(str(out))
    files = sorted(out.glob("*.ptd"))
    if len(files) != 1:
        raise ExportError(f"expected one .ptd of external tensor data, ExecuTorch wrote {[f.name for f in files]}")
    return files[0]


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
            f"source is a plain {type(source).__name__}; compile it first (pipeline.compile.compile_method) and pass "
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


