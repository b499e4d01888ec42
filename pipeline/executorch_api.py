"""The one module that reaches into ExecuTorch's private API (names with a leading underscore, and
modules under `executorch.exir._serialize`), for the pinned ExecuTorch 1.4.1: the named data store
and `.pte` serializer the delegate writes engines with, the flatbuffer readers `.pte` and `.ptd`
files are read with, an Edge manager's constant methods, named data and programs, Edge lowering's
decomposition table, and the Python runtime (its loader, operator and backend registries). Everything else imports these from here, so an ExecuTorch upgrade is checked here."""

from __future__ import annotations

import copy
import functools
from types import ModuleType
from typing import Any

from executorch.exir import EdgeProgramManager, ExecutorchBackendConfig
from executorch.exir._serialize._named_data_store import NamedDataStore, NamedDataStoreOutput
from executorch.exir._serialize._program import PTEFile, serialize_pte_binary
from executorch.exir._serialize._program import _flatbuffer_to_program as flatbuffer_to_program
from executorch.exir._serialize._program import _restore_segments as restore_segments
from torch.export import ExportedProgram

__all__ = ["NamedDataStore", "flatbuffer_to_program", "restore_segments"]


def flatbuffer_tables() -> ModuleType:
    """ExecuTorch's generated flatbuffer reader package (one module per table)."""
    from executorch.exir._serialize.generated import executorch_flatbuffer

    return executorch_flatbuffer


@functools.cache
def portable_lib() -> ModuleType:
    """ExecuTorch's Python runtime: 1.4.1's `_portable_lib`, else 1.5's `_C` (the same API, which also
    loads under a torch other than the one it was built for, and is what the native delegate is built
    against); raises ImportError naming why neither loads. Chosen once a process: once `_C`'s libraries
    are global (`load_backend`), 1.4.1's `_portable_lib` would load against them and register its
    kernels a second time, which aborts the process (an H100 under torch 2.11, 2026-12-07)."""
    try:
        from executorch.extension.pybindings import _portable_lib as lib
    except ImportError as old:
        try:
            from executorch.extension.pybindings import _C as lib
        except ImportError as new:
            raise ImportError(f"_portable_lib: {old}; _C: {new}") from new
    return lib


def operator_names() -> list[str]:
    """The operators ExecuTorch's runtime library has kernels for; raises where it does not load."""
    return list(portable_lib()._get_operator_names())


def decomposition_table() -> dict[Any, Any]:
    """The decompositions ExecuTorch's Edge lowering applies (what a partitioner may keep whole)."""
    from executorch.exir.tracer import _default_decomposition_table

    return dict(_default_decomposition_table())


def flat_tensor(data: bytes) -> Any:
    """A `.ptd` (FlatTensor) file's flatbuffer, deserialized."""
    from executorch.extension.flat_tensor.serialize.serialize import _deserialize_to_flat_tensor

    return _deserialize_to_flat_tensor(data)


def load_module(pte: str, ptd: str | None = None) -> Any:
    """A program (with its `.ptd`) in ExecuTorch's Python runtime (1.4.1's `Runtime` takes no data file)."""
    return portable_lib()._load_for_executorch(pte, data_path=ptd)


def load_program(pte: str) -> Any:
    """A program in ExecuTorch's Python runtime whose methods load one by one (`load_method(name)`, each
    callable on a list of inputs): what `executorch.runtime.Runtime.load_program` gives, read through
    whichever runtime module loads here."""
    lib = portable_lib()
    return lib._load_program(pte, enable_etdump=False, debug_buffer_size=0,
                             program_verification=lib.Verification.InternalConsistency)


def registered_backends() -> list[str]:
    """The backends ExecuTorch's runtime has registered in this process."""
    return list(portable_lib()._get_registered_backend_names())


def edge_programs(manager: EdgeProgramManager) -> dict[str, ExportedProgram]:
    """The manager's lowered program of every method."""
    return dict(manager._edge_programs)


def constant_methods(manager: EdgeProgramManager) -> dict[str, Any]:
    """The manager's constant methods (name -> value)."""
    return dict(manager._config_methods or {})


def named_data(manager: EdgeProgramManager) -> NamedDataStoreOutput:
    """The named data (engines, external tensors) the manager's delegates stored."""
    return manager._named_data_store.get_named_data_store_output()


def with_program_data(manager: EdgeProgramManager, constants: dict[str, Any], store: NamedDataStore) -> EdgeProgramManager:
    """A shallow copy of `manager` carrying these constant methods and this named data (the caller's
    manager keeps its own)."""
    out = copy.copy(manager)
    out._config_methods = constants
    out._named_data_store = store
    return out


def reserialize(program: Any, config: ExecutorchBackendConfig) -> None:
    """Serialize an `ExecutorchProgramManager` again after its program was changed in place, as
    `to_executorch` serialized it: its named data that stays in the `.pte`, nothing external."""
    named = program._named_data
    if named is not None and named.external_data:
        named = NamedDataStoreOutput(buffers=named.buffers, pte_data=named.pte_data, external_data={})
    pte_file = PTEFile(program=program.executorch_program, mutable_data=program._emitter_output.mutable_data,
                       named_data=named if named is not None and named.pte_data else None)
    program._pte_data = serialize_pte_binary(pte_file=pte_file, extract_delegate_segments=config.extract_delegate_segments,
                                             segment_alignment=config.segment_alignment,
                                             constant_tensor_alignment=config.constant_tensor_alignment,
                                             delegate_alignment=config.delegate_alignment)


def carries_etrecord(program: Any) -> bool:
    """Whether an `ExecutorchProgramManager` kept an ETRecord (exported with generate_etrecord)."""
    return getattr(program, "_etrecord", None) is not None


def has_tensor_data(program: Any) -> bool:
    """Whether an `ExecutorchProgramManager` has external tensor data to write (a `.ptd`)."""
    return bool(getattr(program, "_tensor_data", None))
