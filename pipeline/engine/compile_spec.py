"""`TensorRTCompileSpec`: every option of one engine build, validated, and lossless to and from
ExecuTorch `CompileSpec` lists (their bytes are the blob contract's, `blob.encode_compile_specs`)."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import TYPE_CHECKING, Any

from pipeline import dtypes
from pipeline.delegate import blob
from pipeline.engine.options import ATTENTION_FORMS, QUANTIZE_LAYERS, QUANTIZE_MODES, CompileOptions, QuantizeOptions
from pipeline.errors import CompileSpecError

if TYPE_CHECKING:
    from executorch.exir.backend.compile_spec_schema import CompileSpec

PRECISIONS = tuple(dtypes.PRECISIONS)  # compile.precision
# Why no mode quantizes convolutions: TensorRT-RTX 1.6 gains nothing there (results/gpu-log.md, 2026-12-04).
_CONVOLUTIONS_STAY_FLOAT = ("convolutions stay float: TensorRT has no 4-bit convolution, TensorRT-RTX turns int8 "
                            "convolution weights back into float when it builds, and its fp8 convolutions ran 8.2x "
                            "slower with a 1.7x larger engine on the H200 (mobilenet_v3_small)")
# A dim range is [min, opt, max]; opt may be None to take the example input's size.
DimRange = tuple[int, int | None, int]

# Compile-spec key that names the method a spec was written for (a partitioner shared across
# methods must not carry another method's spec).
METHOD_KEY = "method"
_OP_NAME = re.compile(r"aten\.[A-Za-z0-9_]+(\.[A-Za-z0-9_]+)?")


@dataclass
class QuantizeSpec(QuantizeOptions):
    """How an engine quantizes weights: the options (`QuantizeOptions`, validated; `layers` and `keep`
    as tuples) and what calibration found (`pipeline/engine/quantize.py` builds the layers).

    Attributes:
        activation_amax: fp8: parameter name of a layer's weight -> the largest magnitude of that
            layer's input over the calibration inputs (the compile step fills it in).
    """

    activation_amax: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "layers", tuple(self.layers))
        object.__setattr__(self, "keep", tuple(self.keep))
        object.__setattr__(self, "activation_amax", {str(k): float(v) for k, v in dict(self.activation_amax).items()})
        if self.mode not in QUANTIZE_MODES:
            raise CompileSpecError(f"quantize.mode={self.mode!r} is not a mode; use one of {list(QUANTIZE_MODES)}")
        if not isinstance(self.group_size, int) or self.group_size < 2 or self.group_size % 2:
            raise CompileSpecError(f"quantize.group_size={self.group_size!r} must be an even integer >= 2 (e.g. 128)")
        if "convolution" in self.layers:
            raise CompileSpecError(f"quantize.layers: {_CONVOLUTIONS_STAY_FLOAT}; drop 'convolution'")
        unknown = [layer for layer in self.layers if layer not in QUANTIZE_LAYERS]
        if unknown:
            raise CompileSpecError(f"quantize.layers names {unknown}; layers are {list(QUANTIZE_LAYERS)}")
        if any(not isinstance(k, str) or not k for k in self.keep):
            raise CompileSpecError(f"quantize.keep={list(self.keep)!r} must be parameter-name patterns like 'lm_head.*'")

    @property
    def active(self) -> bool:
        """Whether any weight may be quantized."""
        return self.mode != "none" and bool(self.layers)

    def with_activation_amax(self, amax: Mapping[str, float]) -> QuantizeSpec:
        """The same options with these calibrated input magnitudes."""
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        return QuantizeSpec(**{**values, "activation_amax": dict(amax)})

    @classmethod
    def of(cls, value: Any) -> QuantizeSpec:
        """A QuantizeSpec from itself, a mapping of its fields (a config section), or None (no quantization).

        Raises:
            CompileSpecError: an unknown field or an invalid value.
        """
        if isinstance(value, QuantizeSpec):
            return value
        if value is None:
            return cls()
        if isinstance(value, QuantizeOptions):
            value = vars(value)
        if not isinstance(value, Mapping):
            raise CompileSpecError(f"quantize={value!r} must be a map like {{mode: int4_weight_only}}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(value) - known)
        if unknown:
            raise CompileSpecError(f"unknown quantize field(s) {unknown}; expected {sorted(known)}")
        return cls(**dict(value))


@dataclass
class TensorRTCompileSpec(CompileOptions):
    """Options of one TensorRT engine build: the options a config gives (`CompileOptions`, validated;
    lists as tuples, ranges as (min, opt, max)) and what the compile step fills in.

    Attributes:
        method: the program method these options are for; None fits any method.
        symbol_ranges: symbolic dim name (e.g. "s0") -> [min, opt, max]; the partitioner fills it in
            from `dynamic_shapes` so each engine's inputs find their ranges.
    """

    quantize: QuantizeSpec = field(default_factory=QuantizeSpec)
    method: str | None = None
    symbol_ranges: Mapping[str, DimRange] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "quantize", QuantizeSpec.of(self.quantize))
        object.__setattr__(self, "target_compute_capabilities", tuple(self.target_compute_capabilities))
        object.__setattr__(self, "torch_executed_ops", tuple(self.torch_executed_ops))
        object.__setattr__(self, "dynamic_shapes", _normalise_ranges(self.dynamic_shapes))
        object.__setattr__(self, "symbol_ranges", _normalise_ranges({"symbol_ranges": self.symbol_ranges}, str, "")["symbol_ranges"])
        if isinstance(self.profiles, (str, bytes)) or not isinstance(self.profiles, Sequence):
            raise CompileSpecError(f"profiles={self.profiles!r} must be a list of {{dim: [min, opt, max]}} maps")
        profiles = _normalise_ranges({f"profiles[{i}]": p for i, p in enumerate(self.profiles)}, str, "")
        object.__setattr__(self, "profiles", tuple(profiles.values()))
        _validate(self)

    def to_compile_specs(self) -> list[CompileSpec]:
        """Encode as ExecuTorch compile specs, one per field."""
        data = asdict(self)
        data["dynamic_shapes"] = {k: {str(d): list(r) for d, r in v.items()} for k, v in self.dynamic_shapes.items()}
        data["target_compute_capabilities"] = list(self.target_compute_capabilities)
        data["torch_executed_ops"] = list(self.torch_executed_ops)
        data["symbol_ranges"] = {k: list(r) for k, r in self.symbol_ranges.items()}
        data["profiles"] = [{k: list(r) for k, r in p.items()} for p in self.profiles]
        data["quantize"] = {**data["quantize"], "layers": list(self.quantize.layers), "keep": list(self.quantize.keep)}
        return blob.encode_compile_specs(data)

    @classmethod
    def from_compile_specs(cls, specs: Sequence[CompileSpec]) -> TensorRTCompileSpec:
        """Decode compile specs written by `to_compile_specs`.

        Raises:
            CompileSpecError: an unknown key, a value that is not JSON, or an invalid value.
        """
        known = {f.name for f in fields(cls)}
        for spec in specs:
            if spec.key not in known:
                raise CompileSpecError(
                    f"unknown TensorRT compile-spec key {spec.key!r}; expected one of {sorted(known)}"
                )
        return cls(**blob.decode_compile_specs(specs))

    def for_method(self, method: str) -> TensorRTCompileSpec:
        """The same options, marked as written for `method`."""
        return _replace(self, method=method)

    def with_symbol_ranges(self, ranges: Mapping[str, DimRange]) -> TensorRTCompileSpec:
        """The same options with resolved ranges of symbolic dims."""
        return _replace(self, symbol_ranges=dict(ranges))

    def with_profiles(self, profiles: Sequence[Mapping[str, DimRange]]) -> TensorRTCompileSpec:
        """The same options with these further optimization profiles (e.g. dim names resolved to symbols)."""
        return _replace(self, profiles=tuple(profiles))

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> TensorRTCompileSpec:
        """Build from a plain mapping (a config section); unknown keys are an error."""
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise CompileSpecError(f"unknown TensorRT compile-spec field(s) {sorted(unknown)}; expected {sorted(known)}")
        return cls(**dict(data))


def _replace(spec: TensorRTCompileSpec, **changes: Any) -> TensorRTCompileSpec:
    values = {f.name: getattr(spec, f.name) for f in fields(spec)}
    values.update(changes)
    return TensorRTCompileSpec(**values)


def _normalise_ranges(ranges: Mapping[str, Mapping[Any, Any]], keys: Any = int,
                      group: str = "dynamic_shapes") -> dict[str, dict[Any, DimRange]]:
    """Ranges as (min, opt, max) ints; `group` names the field in errors (`group[name][dim]`, or
    `name[dim]` when `group` is empty)."""
    out: dict[str, dict[Any, DimRange]] = {}
    for name, dims in (ranges or {}).items():
        out[str(name)] = {}
        if not isinstance(dims, Mapping):
            raise CompileSpecError(f"{group or name}{f'[{name!r}]' if group else ''} = {dims!r}: expected a map of "
                                   "dims to [min, opt, max]")
        for dim, rng in (dims or {}).items():
            values = list(rng) if isinstance(rng, Sequence) and not isinstance(rng, str) else [rng]
            if len(values) != 3:
                where = f"{group}[{name!r}][{dim}]" if group else f"{name}[{dim!r}]"
                raise CompileSpecError(f"{where} = {values}: expected [min, opt, max] (opt may be null)")
            lo, opt, hi = values
            out[str(name)][keys(dim)] = (int(lo), None if opt is None else int(opt), int(hi))
    return out


def _validate(spec: TensorRTCompileSpec) -> None:
    if spec.precision not in PRECISIONS:
        raise CompileSpecError(f"precision={spec.precision!r} is not supported; use one of {list(PRECISIONS)}")
    if not isinstance(spec.decode_kernels, bool):
        raise CompileSpecError(f"decode_kernels={spec.decode_kernels!r} must be true or false")
    if not isinstance(spec.allow_tf32, bool):
        raise CompileSpecError(f"allow_tf32={spec.allow_tf32!r} must be true or false")
    if not isinstance(spec.optimization_level, int) or not 0 <= spec.optimization_level <= 5:
        raise CompileSpecError(f"optimization_level={spec.optimization_level!r} is outside 0..5; pick 0 (fastest build) to 5")
    if spec.workspace_bytes is not None and (not isinstance(spec.workspace_bytes, int) or spec.workspace_bytes <= 0):
        raise CompileSpecError(f"workspace_bytes={spec.workspace_bytes!r} must be a positive integer or null")
    if not isinstance(spec.min_block_size, int) or spec.min_block_size < 1:
        raise CompileSpecError(f"min_block_size={spec.min_block_size!r} must be an integer >= 1")
    for op in spec.torch_executed_ops:
        if not isinstance(op, str) or not _OP_NAME.fullmatch(op):
            raise CompileSpecError(f"torch_executed_ops entry {op!r} must name an ATen op like 'aten.cumsum' or "
                                   "'aten.cumsum.default'")
        _check_op_exists(op)
    if spec.max_aux_streams is not None and (not isinstance(spec.max_aux_streams, int) or spec.max_aux_streams < 0):
        raise CompileSpecError(f"max_aux_streams={spec.max_aux_streams!r} must be an integer >= 0 or null")
    if spec.attention not in ATTENTION_FORMS:
        raise CompileSpecError(f"attention={spec.attention!r} is not a form; use one of {list(ATTENTION_FORMS)}")
    _validate_targets_and_ranges(spec)


def _check_op_exists(name: str) -> None:
    """A misspelt op would keep nothing out of TensorRT, silently: refuse names ATen does not have."""
    import difflib

    import torch

    _, op, *overload = name.split(".")
    packet = getattr(torch.ops.aten, op, None)
    if packet is not None and (not overload or overload[0] in packet.overloads()):
        return
    if packet is not None:
        raise CompileSpecError(f"torch_executed_ops entry {name!r}: aten.{op} has no overload {overload[0]!r} (it has "
                               f"{sorted(packet.overloads())}); name one of them, or aten.{op} for all")
    close = difflib.get_close_matches(op, dir(torch.ops.aten), n=1)
    raise CompileSpecError(f"torch_executed_ops entry {name!r} is not an ATen op"
                           + (f"; did you mean 'aten.{close[0]}'?" if close else ""))


def _validate_targets_and_ranges(spec: TensorRTCompileSpec) -> None:
    for cap in spec.target_compute_capabilities:
        major, _, minor = str(cap).partition(".")
        if not (major.isdigit() and minor.isdigit()):
            raise CompileSpecError(f"target_compute_capabilities entry {cap!r} must look like '8.9' (major.minor)")
    groups: list[tuple[str, Mapping[Any, DimRange]]] = [
        *((f"dynamic_shapes[{name!r}]", dims) for name, dims in spec.dynamic_shapes.items()),
        ("symbol_ranges", spec.symbol_ranges), *((f"profiles[{i}]", p) for i, p in enumerate(spec.profiles))]
    for group, dims in groups:
        for dim, (lo, opt, hi) in dims.items():
            where = f"{group}[{dim}]" if isinstance(dim, int) else f"{group}[{dim!r}]"
            if lo < 0 or (isinstance(dim, int) and dim < 0):
                raise CompileSpecError(f"{where}: dims and sizes must be >= 0, got dim {dim} range {[lo, opt, hi]}")
            if lo > hi or (opt is not None and not lo <= opt <= hi):
                raise CompileSpecError(f"{where} = {[lo, opt, hi]}: expected min <= opt <= max")
