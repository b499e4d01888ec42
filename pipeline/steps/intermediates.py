"""Stage intermediates, written and read here only: one `.pt2` per method after compile (torch's
export archive) and one `.edge` per method after export and transform (ExecuTorch's serde, with
its engines beside it in `data/` by content), and beside them the program's constant methods
(`constants.json`, e.g. a decoder's `max_cache_len`). Reading never runs code: an archive that asks for unpickling is refused before torch reads it, and every
`torch.load` inside runs weights-only."""

from __future__ import annotations

import io
import json
import os
import struct
import zipfile
import zlib
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch.export import ExportedProgram

from pipeline.delegate import record
from pipeline.delegate.input_values import Bounds, input_values, set_input_values
from pipeline.errors import ArtifactError
from pipeline.files import write_json

if TYPE_CHECKING:  # ExecuTorch loads in the stages that read or write Edge programs only
    from executorch.exir import EdgeProgramManager

# The constant methods a program carries, {name: value}, beside a step's per-method files.
CONSTANTS = "constants.json"
# Large payloads of lowered modules (engines), by SHA-256, beside the `.edge` files, which name them
# in `<method>.data.json`; `_LARGE` bytes and up go there.
DATA = "data"
_LARGE = 1 << 20
# The inputs' value bounds (`input_values.py`), an extra file of a `.pt2`.
_VALUES_FILE = "pipeline_input_values.json"
# Archive members torch's loader unpickles (torchbind and opaque constants), by name prefix.
_PICKLED = ("custom_obj_", "opaque_obj_")


def save_exported(program: ExportedProgram, path: Path) -> None:
    """Save a compiled method's `.pt2`, byte for byte the same for the same program (so DVC's
    run-cache can restore every stage after it)."""
    _strip_provenance(program)
    buffer = io.BytesIO()
    values = json.dumps(input_values(program), sort_keys=True)  # torch's archive keeps no placeholder meta of ours
    torch.export.save(program, buffer, extra_files={_VALUES_FILE: values})
    path.write_bytes(_fixed_serialization_id(buffer.getvalue()))


def load_exported(path: str | Path) -> ExportedProgram:
    """A compiled method's `.pt2`, refusing archives whose payloads need pickle.

    Raises:
        ArtifactError: the file is not a readable export archive, or asks for unpickling.
    """
    _check_archive(Path(path))
    extra = {_VALUES_FILE: ""}
    try:
        with _weights_only():
            program = torch.export.load(path, extra_files=extra)
        values = json.loads(extra[_VALUES_FILE] or "[]")
        set_input_values(program, [None if v is None else Bounds.from_json(v) for v in values]
                         + [None] * (len(program.graph_signature.user_inputs) - len(values)))
    except Exception as exc:  # torch's loader raises many kinds on damaged archives
        raise ArtifactError(f"{path} cannot be loaded as an exported program ({type(exc).__name__}: "
                            f"{str(exc).splitlines()[0] if str(exc) else ''}); run the compile stage again") from exc
    return program


def save_edge(manager: EdgeProgramManager, methods: list[str], out_dir: Path) -> None:
    """Each method's `.edge` program, and the manager's constant methods (`CONSTANTS`) if any. The
    large payloads of its lowered modules (engines) go to `DATA` by content, once for all methods."""
    from executorch.exir.serde.serialize import save

    from pipeline.executorch_api import constant_methods

    save_constants(constant_methods(manager), out_dir)
    for m in methods:
        program = manager.exported_program(m)
        _strip_provenance(program)
        buffer = io.BytesIO()
        with _payloads_apart(program, out_dir / DATA) as index:
            save(program, buffer)
        (out_dir / f"{m}.edge").write_bytes(_fixed_zip_times(buffer.getvalue()))
        if index:
            write_json(out_dir / f"{m}.data.json", index)


def load_edge(methods: list[str], in_dir: str | Path) -> EdgeProgramManager:
    """The `.edge` programs of `methods` as one manager (ExecuTorch's loader reads weights-only),
    their lowered modules' payloads put back from `DATA`.

    Raises:
        ArtifactError: a file is unreadable, or a payload is missing or not what its name says.
    """
    from executorch.exir import EdgeCompileConfig, EdgeProgramManager
    from executorch.exir.serde.serialize import load

    import pipeline.lowering.backend  # noqa: F401  (delegates deserialize by backend id)

    programs = {}
    for m in methods:
        path = Path(in_dir) / f"{m}.edge"
        try:
            with _weights_only():
                programs[m] = load(str(path))
        except Exception as exc:
            raise ArtifactError(f"{path} cannot be loaded as an Edge program ({type(exc).__name__}); run the "
                                "stage that writes it again") from exc
        index = Path(in_dir) / f"{m}.data.json"
        if index.exists():
            _put_back(programs[m], json.loads(index.read_text()), Path(in_dir) / DATA)
    return EdgeProgramManager(programs, constant_methods=load_constants(in_dir),
                              compile_config=EdgeCompileConfig(_check_ir_validity=False))


@contextmanager
def _payloads_apart(program: ExportedProgram, folder: Path) -> Iterator[dict[str, Any]]:
    """While ExecuTorch's serde writes `program`: each large named-data buffer of its lowered
    modules is an empty one, and each large constant of their original modules a one-byte stand-in
    of its shape (serde would write both into the JSON as base64: an engine twice, at about 10 s per
    100 MB). The payloads go to `folder` under their SHA-256, the index of what went where is
    yielded, and everything is put back after."""
    index: dict[str, Any] = {}
    undo: list[Any] = []
    for name, module in _lowered(program):
        named, state = {}, {}
        store = module.named_data_store_output
        for i, data in enumerate(store.buffers if store is not None else []):
            if len(data) >= _LARGE:
                named[str(i)] = _put(folder, memoryview(data))
                store.buffers[i] = b""
                undo.append(lambda b=store.buffers, i=i, d=data: b.__setitem__(i, d))
        original = module.original_module.state_dict
        for key, tensor in list(original.items()):
            if tensor.dtype == torch.uint8 and tensor.dim() == 1 and tensor.numel() >= _LARGE:
                state[key] = _put(folder, tensor.contiguous().numpy().data)
                original[key] = torch.zeros(1, dtype=torch.uint8).expand(tensor.numel())
                undo.append(lambda o=original, k=key, t=tensor: o.__setitem__(k, t))
        if named or state:
            index[name] = {"named_data": named, "state": state}
    try:
        yield index
    finally:
        for restore in undo:
            restore()


def _put_back(program: ExportedProgram, index: dict[str, Any], folder: Path) -> None:
    modules = dict(_lowered(program))
    for name, entry in index.items():
        module = modules.get(name)
        if module is None:
            raise ArtifactError(f"{folder.parent} names payloads of {name!r}, which its program does not have; "
                                "run the stage that writes it again")
        for i, digest in entry["named_data"].items():
            module.named_data_store_output.buffers[int(i)] = _get(folder, digest)
        for key, digest in entry["state"].items():
            module.original_module.state_dict[key] = torch.frombuffer(bytearray(_get(folder, digest)), dtype=torch.uint8)


def _lowered(program: ExportedProgram) -> list[tuple[str, Any]]:
    """The lowered (delegate) modules of a program's graph, by attribute name."""
    return [(n, m) for n, m in program.graph_module.named_children() if hasattr(m, "named_data_store_output")]


def _put(folder: Path, data: memoryview) -> str:
    digest = record.sha256(data)
    path = folder / digest
    if not path.exists():  # equal payloads (prefill's and decode's engine) are stored once
        folder.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return digest


def _get(folder: Path, digest: str) -> bytes:
    path = folder / digest
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ArtifactError(f"{path} is missing ({exc.strerror}); run the stage that writes it again") from exc
    if record.sha256(data) != digest:
        raise ArtifactError(f"{path} is not the data its name says (damaged); run the stage that writes it again")
    return data


def save_constants(constants: Mapping[str, Any] | None, out_dir: Path) -> None:
    """Write the program's constant methods beside a step's per-method files (nothing if none)."""
    if constants:
        write_json(out_dir / CONSTANTS, dict(constants))


def load_constants(in_dir: str | Path) -> dict[str, Any] | None:
    """The constant methods a step's output folder carries, if any."""
    path = Path(in_dir) / CONSTANTS
    return dict(json.loads(path.read_text())) if path.exists() else None


def _strip_provenance(program: ExportedProgram) -> None:
    """Drop torch's node provenance (`from_node`), which records Python object ids that differ run to run."""
    for module in program.graph_module.modules():
        if isinstance(module, torch.fx.GraphModule):
            for node in module.graph.nodes:
                node.meta.pop("from_node", None)
        original = getattr(module, "original_module", None)
        if isinstance(original, ExportedProgram) and original is not program:
            _strip_provenance(original)


def _fixed_serialization_id(data: bytes) -> bytes:
    """torch's archive writer ends `.data/serialization_id` with 20 random digits; make them zeros
    (in place, fixing the entry's CRC in its local and central headers, alignment untouched)."""
    out = bytearray(data)
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        info = next((i for i in archive.infolist() if i.filename.endswith(".data/serialization_id")), None)
        if info is None or info.compress_type != zipfile.ZIP_STORED:
            return data
        value = archive.read(info)
    fixed = value[:20] + b"0" * (len(value) - 20)
    local = info.header_offset
    name_len, extra_len = struct.unpack_from("<HH", out, local + 26)
    start = local + 30 + name_len + extra_len
    out[start : start + len(value)] = fixed
    crc = struct.pack("<I", zlib.crc32(fixed))
    out[local + 14 : local + 18] = crc
    central = out.find(b"PK\x01\x02" + data[local + 4 : local + 6], 0)
    while central != -1:
        if struct.unpack_from("<I", out, central + 42)[0] == local:
            out[central + 16 : central + 20] = crc
            break
        central = out.find(b"PK\x01\x02", central + 4)
    return bytes(out)


def _fixed_zip_times(data: bytes) -> bytes:
    """The same zip with every entry dated 1980-01-01 (Python's zip writer stamps the current time)."""
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(data)) as src, zipfile.ZipFile(out, "w") as dst:
        for info in src.infolist():
            fixed = zipfile.ZipInfo(info.filename, date_time=(1980, 1, 1, 0, 0, 0))
            fixed.compress_type, fixed.external_attr = info.compress_type, info.external_attr
            dst.writestr(fixed, src.read(info))
    return out.getvalue()


def _check_archive(path: Path) -> None:
    try:
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
            for name in names:
                if name.endswith("_config.json") and "/data/" in name:
                    for fqn, meta in json.loads(archive.read(name)).get("config", {}).items():
                        if meta.get("use_pickle") or str(meta.get("path_name", "")).startswith(_PICKLED):
                            raise ArtifactError(f"{path} stores {fqn!r} as a pickle, which the pipeline never "
                                                "unpickles; rebuild it with the compile stage")
    except (zipfile.BadZipFile, OSError, ValueError, AttributeError, KeyError) as exc:
        if isinstance(exc, ArtifactError):
            raise
        raise ArtifactError(f"{path} is not a readable export archive ({type(exc).__name__}: {exc}); "
                            "run the compile stage again") from exc


@contextmanager
def _weights_only() -> Iterator[None]:
    """Make every `torch.load` in the block weights-only, whatever its caller asks for."""
    saved = {k: os.environ.pop(k, None) for k in ("TORCH_FORCE_WEIGHTS_ONLY_LOAD", "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD")}
    os.environ["TORCH_FORCE_WEIGHTS_ONLY_LOAD"] = "1"
    try:
        yield
    finally:
        for key, value in saved.items():
            os.environ.pop(key, None)
            if value is not None:
                os.environ[key] = value
