"""`TensorRTCompileSpec`: every option of one engine build, validated, and lossless to and from
ExecuTorch `CompileSpec` lists (their bytes are the blob contract's, `blob.encode_compile_specs`)."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from executorch.exir.backend.compile_spec_schema import CompileSpec

from pipeline import dtypes
from pipeline.errors import CompileSpecError
from pipeline.tensorrt import blob

PRECISIONS = tuple(dtypes.PRECISIONS)  # compile.precision
# compile.quantize.mode: how an engine stores the weights of the layers it quantizes (and, for fp8,
# quantizes those layers' inputs); see QuantizeSpec.
QUANTIZE_MODES = ("none", "int4_weight_only", "int8_weight_only", "fp8")
QUANTIZE_LAYERS = ("linear", "embedding")
# Why no mode quantizes convolutions: TensorRT-RTX 1.6 gains nothing there (docs/gpu-results.md, 2026-12-04).
_CONVOLUTIONS_STAY_FLOAT = ("convolutions stay float: TensorRT has no 4-bit convolution, TensorRT-RTX turns int8 "
                            "convolution weights back into float when it builds, and its fp8 convolutions ran 8.2x "
                            "slower with a 1.7x larger engine on the H200 (mobilenet_v3_small)")
ATTENTION_FORMS = ("fused", "grouped", "as_written")  # compile.attention, see TensorRTCompileSpec
# A dim range is [min, opt, max]; opt may be None to take the example input's size.
DimRange = tuple[int, int | None, int]

# Compile-spec key that names the method a spec was written for (a partitioner shared across
# methods must not carry another method's spec).
METHOD_KEY = "method"
_OP_NAME = re.compile(r"aten\.[A-Za-z0-9_]+(\.[A-Za-z0-9_]+)?")


@dataclass(frozen=True)
class QuantizeSpec:
    """How an engine quantizes weights (`pipeline/tensorrt/quantize.py` builds the layers).

    Attributes:
        mode: "none"; "int4_weight_only" (4-bit weights, one scale per `group_size` weights along the
            input dim); "int8_weight_only" (8-bit weights, one scale per output channel); "fp8" (fp8
            E4M3 weights, one scale per weight, and each quantized layer's input in fp8 with
            one scale from calibration). Weight-only modes compute in the compile precision.
        group_size: int4 weights per scale along a layer's input dim (a dim it does not divide stays float).
        layers: which layers quantize: "linear" (linear and matrix products with a constant weight),
            and "embedding" (its table, as the weight-only modes store it; int8 in fp8 mode).
            Convolutions stay float in every mode (`_CONVOLUTIONS_STAY_FLOAT`).
        keep: weights kept in float, as glob patterns over the model's parameter names ("lm_head.*"
            names "model.lm_head.weight": a pattern matches the whole name or its end from a dot on).
        calibration: fp8: a file of example inputs (`pipeline/tensorrt/calibration.py`) whose largest
            magnitudes at each quantized layer's input set that input's scale; None: the method's
            example inputs.
        activation_amax: fp8: parameter name of a layer's weight -> the largest magnitude of that
            layer's input over the calibration inputs (the compile step fills it in).
    """

    mode: str = "none"
    group_size: int = 128
    layers: tuple[str, ...] = ("linear", "embedding")
    keep: tuple[str, ...] = ()
    calibration: str | None = None
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
        if not isinstance(value, Mapping):
            raise CompileSpecError(f"quantize={value!r} must be a map like {{mode: int4_weight_only}}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(value) - known)
        if unknown:
            raise CompileSpecError(f"unknown quantize field(s) {unknown}; expected {sorted(known)}")
        return cls(**dict(value))


@dataclass(frozen=True)
class TensorRTCompileSpec:
    """Options of one TensorRT engine build.

    Attributes:
        precision: compute precision of float tensors inside the engine (fp32, fp16, bf16); engine
            inputs and outputs keep the program's dtypes.
        allow_tf32: let fp32 matmuls and convolutions use TF32 (TensorRT-RTX ignores the flag: only
            NVIDIA_TF32_OVERRIDE=0 where the program is built and run switches TF32 off, so false is
            refused there without it; see `build_env.py`).
        optimization_level: builder optimization level, 0..5.
        workspace_bytes: workspace memory-pool limit; None leaves TensorRT's default.
        min_block_size: smallest number of compute nodes worth an engine of their own.
        torch_executed_ops: ATen ops kept out of TensorRT, as "aten.<op>" (every overload) or
            "aten.<op>.<overload>"; the next partitioner in the chain, or a portable kernel, runs them.
        timing_cache_path: timing cache file read before and written after each build.
        target_compute_capabilities: e.g. ["8.9", "9.0"] (TensorRT-RTX only); empty: builder default.
        dynamic_shapes: program input name -> {dim index -> [min, opt, max]}.
        max_aux_streams: auxiliary streams TensorRT may use; None leaves its default.
        attention: how the compile step builds attention (softmax(q k^T * scale + mask) v):
            "fused": TensorRT's attention layer (`fused_attention`: fused kernels for prompts,
            grouped-query K/V heads read once); "grouped": products per K/V head over its group
            of query heads stacked (`grouped_query`: the fastest one-token decode, long prompts
            unfused); "as_written": the graph's own ops (K/V heads repeated as the model does).
            "fused" and "grouped" leave what they do not recognise as written.
        method: the program method these options are for; None fits any method.
        symbol_ranges: symbolic dim name (e.g. "s0") -> [min, opt, max]; the partitioner fills it in
            from `dynamic_shapes` so each engine's inputs find their ranges.
        profiles: further optimization profiles of every engine, each a map from a symbolic dim (or,
            in a Hydra config, a dim name of the method, which the compile step resolves) to a
            [min, opt, max] inside its range; dims a profile does not name keep their range. An
            engine is built once and tuned for each profile (TensorRT-RTX may keep a second layout
            of some weights for a profile's kernels); at run time
            each call runs on the narrowest profile that takes its shapes (a decoder's one-token
            decode on a `{tokens: [1, 1, 1]}` profile, its prompts on the first).
        quantize: which weights the engine stores quantized, and how (`QuantizeSpec`).
    """

    precision: str = "fp32"
    allow_tf32: bool = True
    optimization_level: int = 3
    workspace_bytes: int | None = None
    min_block_size: int = 1
    torch_executed_ops: tuple[str, ...] = ()
    timing_cache_path: str | None = None
    target_compute_capabilities: tuple[str, ...] = ()
    dynamic_shapes: Mapping[str, Mapping[int, DimRange]] = field(default_factory=dict)
    max_aux_streams: int | None = None
    attention: str = "fused"
    method: str | None = None
    symbol_ranges: Mapping[str, DimRange] = field(default_factory=dict)
    profiles: tuple[Mapping[str, DimRange], ...] = ()
    quantize: QuantizeSpec = field(default_factory=QuantizeSpec)

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
