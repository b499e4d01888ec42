"""Write an Edge program as a `.pte` (and `.ptd`) whose TensorRT engines are named data: the library
half of the serialize stage (`pipeline/steps/serialize.py`)."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from executorch.exir import EdgeProgramManager, ExecutorchBackendConfig
from executorch.exir.passes import MemoryPlanningPass
from torch.export import ExportedProgram

from pipeline import executorch_api as et
from pipeline.delegate import blob, record
from pipeline.errors import ExportError
from pipeline.files import fix_modes, remove_stale_temporaries, temp_prefix, writing
from pipeline.lowering.export import Source, export
from pipeline.lowering.write_back import write_in_place

# ExecuTorch's tag for external constants (`external_constants_pass`); `.ptd` files are named by tag.
EXTERNAL_TAG = "_default_external_constant"


def save(source: Source, path: str | os.PathLike[str], *, external_data: bool = False, etrecord: bool = False,
         **options: Any) -> dict[str, Path]:
    """Export with `export(**options)` and write the program (see `write_program`).

    Returns:
        The files written, by kind ("pte", "ptd", "etrecord").
    """
    manager = export(source, generate_etrecord=etrecord, **options).manager
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
    programs = {m: manager.exported_program(m) for m in manager.methods}
    constants = et.constant_methods(manager)
    values = constants.pop(record.VALUES, None)  # folded into the record
    sealed = et.with_program_data(manager, {**constants, record.METHOD: record.placeholder(record.inputs_of(programs, values))},
                                  _place_engines(et.named_data(manager), external_data))
    config = _backend_config(programs, external_data)
    program = sealed.to_executorch(config)
    if write_in_place(program.executorch_program):
        et.reserialize(program, config)
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


def _place_engines(data: Any, external: bool) -> et.NamedDataStore:
    """The program's named data with every TensorRT engine in the `.pte` (segments) or, when
    `external`, in the `.ptd` (the tag ExecuTorch gives external constants, so one file holds both)."""
    out = et.NamedDataStore()
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
    if et.carries_etrecord(program):
        program.get_etrecord().save(str(path))
        return
    from executorch.devtools import generate_etrecord

    generate_etrecord(str(path), edge_dialect_program=manager, executorch_program=program)


def _tensor_data(program: Any, tmp: Path) -> Path | None:
    """Write the program's external tensor data into one `.ptd` in `tmp`; None when there is none."""
    if not et.has_tensor_data(program):
        return None
    out = tmp / "data"
    out.mkdir()
    program.write_tensor_data_to_file(str(out))
    files = sorted(out.glob("*.ptd"))
    if len(files) != 1:
        raise ExportError(f"expected one .ptd of external tensor data, ExecuTorch wrote {[f.name for f in files]}")
    return files[0]
