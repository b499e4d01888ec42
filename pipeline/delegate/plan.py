"""The plan blob, written and read here only: a TensorRT delegate that runs an ordered plan of steps,
TensorRT engines and the project's kernels (`compile.decode_kernels`), on one CUDA stream, with the
values between steps in device memory the delegate keeps.

Layout: `blob.HEADER` with magic b"TP01" (eng_offset and eng_size 0), then compact UTF-8 JSON:

    io_bindings  the delegate's inputs (argument order), then its outputs, as `blob.IOBinding` JSON,
                 static shapes; named "input_<i>" and "output_<j>"; an output the plan writes into an
                 input's memory (a KV cache an engine updates in place) names that input in `aliases`.
    values       [{name, dtype, shape}]: the device buffers between steps ("value_<k>").
    steps        in order; each is an engine step {"engine": a TR03 blob's metadata (`blob.engine_doc`),
                 "inputs": [name per engine input], "outputs": [name per engine output]} (an output the
                 engine writes into an input carries that input's name), or a kernel step {"kernel": the
                 PTX entry (`formats.kernel_name`), "module", "weight", "scales", "bias": named data
                 (scales and bias may be null), "n", "k", "group", "grid", "block", "inputs": [x],
                 "outputs": [y]}, or an attention step {"kernel": "decode_attention", "module": the PTX,
                 "scale_bits": the scale's float32 bits, "inputs": [q, k, v] or [q, k, v, mask], "outputs":
                 [o, workspace]}, whose sizes are its values' (`kernels/decode_attention.py`: q float16
                 [B, H, T, D], k and v [B, KVH, S, D], mask [1 or B, 1, T, S]; o float16 of q's count of
                 values, written as [B, T, H, D]; the workspace float32 of at least the values a launch
                 writes).

Named data: engines as in `blob.py` ("tensorrt.engine.<sha256>"); the PTX under "pipeline.kernels.<sha256>"
(NUL-terminated, as the driver loads it) and each packed weight, scales and bias under
"pipeline.weight.<sha256>", each given as {"key", "sha256", "size"} and checked where it is read. Every
name a step reads is a delegate input or written by an earlier step; every delegate output is written.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import struct
from dataclasses import dataclass
from typing import Any

from pipeline.delegate import blob
from pipeline.delegate.blob import BlobMetadata, EngineRef, IOBinding
from pipeline.errors import BlobFormatError
from pipeline.kernels import decode_attention, formats

MAGIC = b"TP01"
KERNELS_PREFIX = "pipeline.kernels."
WEIGHT_PREFIX = "pipeline.weight."
_KERNEL = re.compile(r"dp_(fp16|int4|fp8)_t[1-8]")
ATTENTION = "decode_attention"  # an attention step's "kernel"


@dataclass(frozen=True)
class DataRef:
    """A named-data entry a kernel step reads."""

    key: str
    sha256: str
    size: int

    @classmethod
    def of(cls, data: bytes | memoryview, prefix: str) -> DataRef:
        digest = hashlib.sha256(data).hexdigest()
        return cls(prefix + digest, digest, len(data))

    def to_json(self) -> dict[str, Any]:
        return {"key": self.key, "sha256": self.sha256, "size": self.size}

    @classmethod
    def from_json(cls, doc: Any) -> DataRef:
        ref = cls(str(doc["key"]), str(doc["sha256"]), int(doc["size"]))
        if not ref.key.startswith((KERNELS_PREFIX, WEIGHT_PREFIX)) or ref.key.rsplit(".", 1)[-1] != ref.sha256:
            raise BlobFormatError(f"TensorRT plan names data {ref.key!r}, which is not a key of its digest {ref.sha256}")
        return ref

    def check(self, data: bytes | memoryview) -> None:
        """Raises BlobFormatError where `data` is not this entry's."""
        if len(data) != self.size or hashlib.sha256(data).hexdigest() != self.sha256:
            raise BlobFormatError(f"named data {self.key!r} does not match its size and SHA-256 (a damaged or altered "
                                  ".pte or .ptd); copy it again or rebuild the program")


@dataclass(frozen=True)
class EngineStep:
    meta: BlobMetadata
    engine: EngineRef
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]


@dataclass(frozen=True)
class KernelStep:
    kernel: str
    module: DataRef
    weight: DataRef
    scales: DataRef | None
    bias: DataRef | None
    n: int
    k: int
    group: int
    grid: int
    block: int
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]


@dataclass(frozen=True)
class AttentionStep:
    module: DataRef
    scale_bits: int  # the scale as float32 bits: both readers take it exactly
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]

    @property
    def scale(self) -> float:
        return float(struct.unpack("<f", struct.pack("<I", self.scale_bits))[0])

    @staticmethod
    def bits(scale: float) -> int:
        return int(struct.unpack("<I", struct.pack("<f", scale))[0])


Step = EngineStep | KernelStep | AttentionStep


@dataclass(frozen=True)
class Plan:
    io_bindings: tuple[IOBinding, ...]
    values: tuple[IOBinding, ...]
    steps: tuple[Step, ...]

    @property
    def inputs(self) -> tuple[IOBinding, ...]:
        return tuple(b for b in self.io_bindings if b.is_input)

    @property
    def outputs(self) -> tuple[IOBinding, ...]:
        return tuple(b for b in self.io_bindings if not b.is_input)

    @property
    def engines(self) -> list[EngineStep]:
        return [s for s in self.steps if isinstance(s, EngineStep)]


def is_plan(payload: bytes | memoryview) -> bool:
    return bytes(payload[:4]) == MAGIC


def encode(plan: Plan) -> bytes:
    """The delegate blob of `plan` (checked as `decode` checks it)."""
    check(plan)
    doc = {"io_bindings": [b.to_json() for b in plan.io_bindings],
           "values": [{"name": v.name, "dtype": v.dtype, "shape": list(v.shape)} for v in plan.values],
           "steps": [_step_doc(s) for s in plan.steps]}
    js = json.dumps(doc, separators=(",", ":")).encode()
    return blob.HEADER.pack(MAGIC, blob.HEADER.size, len(js), 0, 0, b"\x01" + b"\x00" * 7) + js


def _step_doc(step: Step) -> dict[str, Any]:
    if isinstance(step, EngineStep):
        return {"engine": blob.engine_doc(step.engine, step.meta), "engine_size": step.engine.size,
                "inputs": list(step.inputs), "outputs": list(step.outputs)}
    if isinstance(step, AttentionStep):
        return {"kernel": ATTENTION, "module": step.module.to_json(), "scale_bits": step.scale_bits,
                "inputs": list(step.inputs), "outputs": list(step.outputs)}
    return {"kernel": step.kernel, "module": step.module.to_json(), "weight": step.weight.to_json(),
            "scales": step.scales.to_json() if step.scales else None, "bias": step.bias.to_json() if step.bias else None,
            "n": step.n, "k": step.k, "group": step.group, "grid": step.grid, "block": step.block,
            "inputs": list(step.inputs), "outputs": list(step.outputs)}


def decode(payload: bytes | memoryview) -> Plan:
    """Unpack and check a plan blob.

    Raises:
        BlobFormatError: one message per broken rule (header, JSON, bindings, a name read before it is
            written, an output never written, an unknown kernel).
    """
    if len(payload) < blob.HEADER.size:
        raise BlobFormatError(f"TensorRT plan blob is {len(payload)} bytes, shorter than its {blob.HEADER.size}-byte header")
    magic, meta_offset, meta_size, eng_offset, eng_size, _ = blob.HEADER.unpack_from(payload)
    if magic != MAGIC or meta_offset != blob.HEADER.size or meta_offset + meta_size != len(payload) or eng_offset or eng_size:
        raise BlobFormatError(f"TensorRT plan blob header (magic {magic!r}, metadata at {meta_offset}+{meta_size} of "
                              f"{len(payload)} bytes) is not layout {MAGIC!r}; rebuild the program")
    try:
        doc = json.loads(bytes(payload[meta_offset:]).decode())
        plan = Plan(tuple(IOBinding.from_json(b) for b in doc["io_bindings"]),
                    tuple(IOBinding(str(v["name"]), str(v["dtype"]), tuple(int(d) for d in v["shape"]), False)
                          for v in doc["values"]),
                    tuple(_step(s) for s in doc["steps"]))
    except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError) as exc:
        raise BlobFormatError(f"TensorRT plan metadata is not the expected JSON ({type(exc).__name__}: {exc})") from exc
    check(plan)
    return plan


def _step(doc: Any) -> Step:
    inputs, outputs = tuple(str(n) for n in doc["inputs"]), tuple(str(n) for n in doc["outputs"])
    if "engine" in doc:
        meta, ref = blob.engine_from_doc(doc["engine"], int(doc["engine_size"]))
        return EngineStep(meta, ref, inputs, outputs)
    if doc["kernel"] == ATTENTION:
        bits = doc["scale_bits"]
        if type(bits) is not int or not 0 <= bits < 2**32:
            raise ValueError(f"scale_bits {bits!r} are not a float32's bits")
        return AttentionStep(DataRef.from_json(doc["module"]), bits, inputs, outputs)
    optional = {name: DataRef.from_json(doc[name]) if doc[name] is not None else None for name in ("scales", "bias")}
    return KernelStep(str(doc["kernel"]), DataRef.from_json(doc["module"]), DataRef.from_json(doc["weight"]),
                      optional["scales"], optional["bias"], int(doc["n"]), int(doc["k"]), int(doc["group"]),
                      int(doc["grid"]), int(doc["block"]), inputs, outputs)


def check(plan: Plan) -> None:
    """Refuse a plan no writer of this contract makes (see the module)."""
    blob.check_coherent(BlobMetadata(plan.io_bindings))
    shapes = {b.name: b for b in (*plan.io_bindings, *plan.values)}
    if len(shapes) != len(plan.io_bindings) + len(plan.values):
        raise BlobFormatError("TensorRT plan names a value twice")
    if any(d < 0 for b in shapes.values() for d in b.shape):
        raise BlobFormatError("TensorRT plan has a value of a dynamic shape; a plan's values are static")
    known = {b.name for b in plan.inputs}
    for i, step in enumerate(plan.steps):
        where = f"TensorRT plan step {i}"
        missing = [n for n in step.inputs if n not in known]
        if missing:
            raise BlobFormatError(f"{where} reads {missing}, which no input or earlier step gives")
        _check_arity(where, step)
        unknown = [n for n in step.outputs if n not in shapes]
        if unknown:
            raise BlobFormatError(f"{where} writes {unknown}, which the plan does not declare")
        _check_sizes(where, step, shapes)
        known.update(step.outputs)
    unwritten = [b.name for b in plan.outputs if b.name not in known and not b.aliases]
    if unwritten:
        raise BlobFormatError(f"TensorRT plan never writes its outputs {unwritten}")


def _check_arity(where: str, step: Step) -> None:
    """A step binds as many names as it reads and writes: an engine its bindings (an output written in
    place named as the input it updates), an attention q, k, v (a mask) -> o and its workspace, a product
    one x -> one y."""
    if isinstance(step, EngineStep):
        if (len(step.inputs), len(step.outputs)) != (len(step.meta.inputs), len(step.meta.outputs)):
            raise BlobFormatError(f"{where} binds {len(step.inputs)} + {len(step.outputs)} names to an engine of "
                                  f"{len(step.meta.inputs)} inputs and {len(step.meta.outputs)} outputs")
        aliased = {b.aliases: n for b, n in zip(step.meta.outputs, step.outputs) if b.aliases}
        bound = dict(zip((b.name for b in step.meta.inputs), step.inputs))
        if any(bound[a] != n for a, n in aliased.items()):
            raise BlobFormatError(f"{where}: an output written in place is not named as the input it updates")
    elif isinstance(step, AttentionStep):
        if len(step.inputs) not in (3, 4) or len(step.outputs) != 2:
            raise BlobFormatError(f"{where} runs the decode attention with {list(step.inputs)} -> {list(step.outputs)}; "
                                  "it takes q, k, v and perhaps a mask, and writes o and its workspace")
    elif not _KERNEL.fullmatch(step.kernel) or len(step.inputs) != 1 or len(step.outputs) != 1:
        raise BlobFormatError(f"{where} runs kernel {step.kernel!r} with {list(step.inputs)} -> {list(step.outputs)}; "
                              "a kernel of this project takes one x and writes one y")


def _check_sizes(where: str, step: Step, shapes: dict[str, IOBinding]) -> None:
    """What a step reads and writes is sized from its values: an engine's bindings take them; a
    kernel's x and y are [T, k] and [T, n] in float16 for its T, and its grid covers n rows; an
    attention's values are of sizes its kernels take, and its workspace holds what they write."""
    if isinstance(step, EngineStep):
        for b, name in zip((*step.meta.inputs, *step.meta.outputs), (*step.inputs, *step.outputs)):
            value, spec = shapes[name], b.spec  # a dynamic dim without bounds takes any size
            if value.dtype != b.dtype or len(value.shape) != len(b.shape) or any(
                    not lo <= d <= hi for d, lo, hi in zip(value.shape, spec.min, spec.max)):
                raise BlobFormatError(f"{where} binds {name!r} to an engine binding of another dtype or shape")
        return
    if isinstance(step, AttentionStep):
        q, k, v, *mask = (shapes[n] for n in step.inputs)
        o, workspace = (shapes[n] for n in step.outputs)
        sizes = decode_attention.sizes(q.shape, k.shape, v.shape, mask[0].shape if mask else None)
        if isinstance(sizes, str) or any(b.dtype != "float16" for b in (q, k, v, *mask, o)) or \
                math.prod(o.shape) != math.prod(q.shape) or \
                workspace.dtype != "float32" or math.prod(workspace.shape) < sizes.workspace:
            raise BlobFormatError(f"{where} runs the decode attention on values it does not take "
                                  f"({sizes if isinstance(sizes, str) else 'their dtypes, o or the workspace'})")
        return
    x, y = shapes[step.inputs[0]], shapes[step.outputs[0]]
    tokens = math.prod(x.shape) // step.k if x.shape and x.shape[-1] == step.k else 0
    rows = step.grid * step.block // 32 * formats.FORMATS[step.kernel.split("_")[1]].rows  # a warp's rows
    if (x.dtype, y.dtype) != ("float16", "float16") or not y.shape or y.shape[-1] != step.n or \
            math.prod(y.shape) != tokens * step.n or step.kernel[-1] != str(tokens) or rows < step.n:
        raise BlobFormatError(f"{where} runs kernel {step.kernel} on values that are not its [T, k] -> [T, n] in float16")


def delegate_view(payload: bytes | memoryview) -> tuple[BlobMetadata, list[EngineRef | DataRef]]:
    """A TensorRT delegate of either layout (an engine's blob, or a plan): its bindings, and the named
    data it reads (engines, then the kernels' data).

    Raises:
        BlobFormatError: as `blob.decode` or `decode`.
    """
    if not is_plan(payload):
        meta, ref = blob.decode(payload)
        return meta, [ref]
    plan = decode(payload)
    refs: list[EngineRef | DataRef] = [s.engine for s in plan.engines]
    for step in plan.steps:
        if isinstance(step, KernelStep):
            refs += [r for r in (step.module, step.weight, step.scales, step.bias) if r is not None]
        elif isinstance(step, AttentionStep):
            refs.append(step.module)
    return BlobMetadata(plan.io_bindings), list({r.key: r for r in refs}.values())


def check_data(refs: list[EngineRef | DataRef], named: Any, checked: bool = False) -> None:
    """Each named entry `refs` name is in `named` with its size and (unless `checked`) its digest.

    Raises:
        BlobFormatError: naming the entry.
    """
    for ref in refs:
        if isinstance(ref, EngineRef):
            blob.engine_bytes(ref, named, checked=checked)
            continue
        data = named.get(ref.key)
        if data is None:
            raise BlobFormatError(f"named data {ref.key!r} (the project's kernels) is not in the program's data: pass the "
                                  ".ptd written with the program, or rebuild it")
        if len(data) != ref.size or not checked:
            ref.check(data)
