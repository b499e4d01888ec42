"""The program record: what a `.pte` written by this pipeline says about itself, and the one place
that writes and reads it. It is an ExecuTorch constant method, `pipeline_record`, returning one
JSON string (ExecuTorch's runtime loads it like any constant method):

    {"pipeline_record":1,"ptd":"<64 hex or 64 '-'>","pte":"<64 hex>","inputs":{method: [spec|null]}}

`inputs` holds each method input's dtype and per-dim [min, max] (`TensorSpec`; null for non-tensor
inputs), and for integer inputs that index, the values they may hold (`input_values.py`); `ptd` is
the SHA-256 of the `.ptd` written with the program ('-' * 64: none); `pte` is the
SHA-256 of the whole `.pte` file with these 64 characters read as '0' * 64. The JSON has a fixed
length, so `seal` fills both digests into the serialized bytes in place, and `verify` checks a file
before any parser reads it.
"""

from __future__ import annotations

import hashlib
import json
import mmap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pipeline.delegate.tensor_spec import TensorSpec
from pipeline.errors import ArtifactError

METHOD = "pipeline_record"
# Between the export step and serialization, the inputs' value bounds travel as this constant method
# (a JSON string {method: [bounds or null]}, through every stage's intermediates); `write_program`
# folds it into the record, so a program has no such method.
VALUES = "pipeline_input_values"
PREFIX = b'{"pipeline_record":1,"ptd":"'
_DIGEST = 64
_NO_PTD = "-" * _DIGEST
_PTE_AT = len(PREFIX) + _DIGEST + len('","pte":"')  # offset of the pte digest inside the record


@dataclass(frozen=True)
class Record:
    """A program's record, read back."""

    inputs: Mapping[str, tuple[TensorSpec | None, ...]]
    ptd_sha256: str | None


def placeholder(inputs: Mapping[str, Sequence[TensorSpec | None]]) -> str:
    """The record with both digests unset, for `constant_methods` before serialization."""
    specs = {m: [s.to_json() if s is not None else None for s in v] for m, v in inputs.items()}
    text = PREFIX.decode() + _NO_PTD + '","pte":"' + "0" * _DIGEST + '","inputs":' + json.dumps(specs, separators=(",", ":")) + "}"
    assert text[_PTE_AT - 1] == '"' and text[_PTE_AT + _DIGEST] == '"'
    return text


def seal(pte: bytes, ptd_sha256: str | None) -> bytes:
    """`pte` (serialized with `placeholder`) with the `.ptd` digest and its own digest filled in."""
    start = _find(pte, "the program being written")
    data = bytearray(pte)
    ptd = (ptd_sha256 or _NO_PTD).encode()
    data[start + len(PREFIX) : start + len(PREFIX) + _DIGEST] = ptd
    data[start + _PTE_AT : start + _PTE_AT + _DIGEST] = _digest(data, start).encode()
    return bytes(data)


def verify(pte: bytes | mmap.mmap, where: str, program_size: int | None = None) -> Record | None:
    """The record of `pte`, after checking the file's digest against it; None when it has none.

    Raises:
        ArtifactError: the record is malformed, or the file is not what the record says.
    """
    try:
        start = _find(pte, where, program_size)
    except LookupError:
        return None
    size = int.from_bytes(pte[start - 4 : start], "little")  # flatbuffer strings are length-prefixed
    if size < _PTE_AT + _DIGEST or start + size > len(pte):
        raise ArtifactError(f"{where}: its program record is cut off (truncated or corrupt file); rebuild it")
    if pte[start + _PTE_AT : start + _PTE_AT + _DIGEST].decode("ascii", "replace") != _digest(pte, start):
        raise ArtifactError(f"{where} is corrupt: its contents do not match the SHA-256 in its program record "
                            "(damaged copy or edited file); copy it again or rebuild it")
    try:
        doc = json.loads(pte[start : start + size].decode())
        inputs = {str(m): tuple(None if s is None else TensorSpec.from_json(s) for s in specs)
                  for m, specs in doc["inputs"].items()}
        ptd = str(doc["ptd"])
    except (UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ArtifactError(f"{where}: its program record is malformed ({exc}); rebuild it") from exc
    return Record(inputs, None if ptd == _NO_PTD else ptd)


def sha256(data: bytes | mmap.mmap | memoryview) -> str:
    return hashlib.sha256(data).hexdigest()


def _find(pte: bytes | bytearray | mmap.mmap, where: str, end: int | None = None) -> int:
    end = len(pte) if end is None else end
    start = pte.find(PREFIX, 0, end)
    if start < 4:
        raise LookupError(where)
    if pte.find(PREFIX, start + 1, end) != -1:
        raise ArtifactError(f"{where} holds more than one program record; rebuild it")
    return start


def _digest(data: bytes | bytearray | mmap.mmap, start: int) -> str:
    view = memoryview(data)
    digest = hashlib.sha256(view[: start + _PTE_AT])
    digest.update(b"0" * _DIGEST)
    digest.update(view[start + _PTE_AT + _DIGEST :])
    return digest.hexdigest()


def values_method(programs: Mapping[str, Any]) -> dict[str, str]:
    """The `VALUES` constant method for compiled programs whose inputs carry value bounds (none if none do)."""
    from pipeline.delegate.input_values import input_values

    found = {m: input_values(p) for m, p in programs.items()}
    return {VALUES: json.dumps(found, sort_keys=True, separators=(",", ":"))} if any(any(v) for v in found.values()) else {}


def inputs_of(programs: Mapping[str, Any], values: str | None = None) -> dict[str, list[TensorSpec | None]]:
    """Each method's input specs, from its (Edge) `ExportedProgram`: placeholders' fake values and
    the program's range constraints, with the value bounds of `values` (the `VALUES` method's JSON),
    each clipped to what the input's dtype holds."""
    import torch

    bounds = json.loads(values) if values else {}
    out: dict[str, list[TensorSpec | None]] = {}
    for method, program in programs.items():
        nodes = {n.name: n for n in program.graph.nodes if n.op == "placeholder"}
        given = bounds.get(method) or []
        specs: list[TensorSpec | None] = []
        for i, name in enumerate(program.graph_signature.user_inputs):
            val = nodes[name].meta.get("val")
            spec = TensorSpec.of(val, program.range_constraints) if hasattr(val, "shape") else None
            found = given[i] if i < len(given) else None
            if spec is not None and found is not None:
                info = torch.iinfo(val.dtype)
                low, high = found["values"]
                end = found.get("end")
                spec = spec.with_values((max(low, info.min), min(high, info.max)), None if end is None else tuple(end))
            specs.append(spec)
        out[method] = specs
    return out
