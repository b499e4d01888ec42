"""The options of an engine build as a config gives them: `CompileOptions` and `QuantizeOptions`,
each option and its default written once. The config schema extends them (`compile`,
`compile.quantize`); `TensorRTCompileSpec` and `QuantizeSpec` (`compile_spec.py`) are them validated,
with what the compile step fills in. Imports nothing heavy: the config schema is built on it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# quantize.mode: how an engine stores the weights of the layers it quantizes (and, for fp8,
# quantizes those layers' inputs); see QuantizeOptions.
QUANTIZE_MODES = ("none", "int4_weight_only", "int8_weight_only", "fp8")
QUANTIZE_LAYERS = ("linear", "embedding")
ATTENTION_FORMS = ("fused", "grouped", "as_written")  # CompileOptions.attention


@dataclass
class QuantizeOptions:
    """Which weights an engine stores quantized, and how.

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
        calibration: fp8: a file of example inputs (`pipeline/engine/calibration.py`) whose largest
            magnitudes at each quantized layer's input set that input's scale; None: the method's
            example inputs.
    """

    mode: str = "none"
    group_size: int = 128
    layers: list[str] = field(default_factory=lambda: list(QUANTIZE_LAYERS))
    keep: list[str] = field(default_factory=list)
    calibration: str | None = None


@dataclass
class CompileOptions:
    """Options of one TensorRT engine build.

    Attributes:
        precision: compute precision of float tensors inside the engine (fp32, fp16, bf16); engine
            inputs and outputs keep the program's dtypes. fp16 and bf16 keep float32 where the model
            computes float32 from integers (rotary angles) or normalization statistics
            (`engine/kept_float32.py`).
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
        profiles: further optimization profiles of every engine, each a map from a symbolic dim (or,
            in a Hydra config, a dim name of the method, which the compile step resolves) to a
            [min, opt, max] inside its range; dims a profile does not name keep their range. An
            engine is built once and tuned for each profile (TensorRT-RTX may keep a second layout
            of some weights for a profile's kernels); at run time
            each call runs on the narrowest profile that takes its shapes (a decoder's one-token
            decode on a `{tokens: [1, 1, 1]}` profile, its prompts on the first).
        quantize: which weights the engine stores quantized, and how (`QuantizeSpec`).
        decode_kernels: products of a constant weight with 1 to 8 tokens of fp16 (a decode step's) run
            in the project's own kernels (`pipeline.kernels`: the weight as fp16, or int4 or fp8 as
            `quantize` stores it) between engines, instead of in TensorRT's product kernels.
    """

    precision: str = "fp32"
    allow_tf32: bool = True
    optimization_level: int = 3
    workspace_bytes: int | None = None
    min_block_size: int = 1
    torch_executed_ops: list[str] = field(default_factory=list)
    timing_cache_path: str | None = None
    target_compute_capabilities: list[str] = field(default_factory=list)
    dynamic_shapes: dict[str, dict[int, Any]] = field(default_factory=dict)  # each range [min, opt, max]
    max_aux_streams: int | None = None
    attention: str = "fused"
    profiles: list[dict[str, Any]] = field(default_factory=list)  # each range [min, opt, max]
    quantize: QuantizeOptions = field(default_factory=QuantizeOptions)
    decode_kernels: bool = False
