"""Structured-config schemas, one per config group. `register_configs()` puts them in Hydra's
ConfigStore; the YAML options in `conf/` extend them, so an unknown key or a wrong type fails at
composition with Hydra's own message."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from pipeline.engine.options import CompileOptions, QuantizeOptions
from pipeline.errors import ConfigError
from pipeline.runtime.options import RuntimeOptions


@dataclass
class InputSpec:
    """One example input: random values from the model seed (ints in [low, high))."""

    shape: list[int] = MISSING
    dtype: str = "float32"
    low: int = 0
    high: int = 2


@dataclass
class MethodSpec:
    """One program method: the module method it runs, example inputs, dynamic dims."""

    function: str = "forward"
    inputs: list[InputSpec] = MISSING
    # A dynamic dim shared by every input dim that names it: name -> {min, max} (checked by
    # validate.py; untyped here so that one override adds one: `+model.methods.forward.dims.batch={min:1,max:16}`)
    dims: dict[str, Any] = field(default_factory=dict)
    # input index -> dim -> dim name; null: every dim static (`model.methods.forward.dynamic=null`)
    dynamic: dict[int, dict[int, str]] | None = field(default_factory=dict)


@dataclass
class ModelConfig:
    name: str = MISSING
    _target_: str = MISSING
    seed: int = 0
    # "factory": the factory's own initialisation; "every_layer": also set the zero heads, zero
    # residual norms and tiny layer scales that keep layers out of the output, draw linear layers at
    # 1/sqrt(fan_in) and calibrate batch norms on example inputs (pipeline.models.weights).
    init: str = "factory"
    # Trained weights (pipeline/models/checkpoint.py): a safetensors file or its sharded index, a
    # PyTorch or timm checkpoint, or a Hugging Face model folder (which also says what to build);
    # null: seeded random weights. Loaded strictly; `weight_prefixes` maps the file's key prefixes
    # to the model's ({"module.": ""}); `weights_partial` keeps seeded values for keys the file lacks.
    weights: str | None = None
    weight_prefixes: dict[str, str] = field(default_factory=dict)
    weights_partial: bool = False
    kwargs: dict[str, Any] = field(default_factory=dict)
    methods: dict[str, MethodSpec] = MISSING


QuantizeConfig = QuantizeOptions  # compile.quantize


@dataclass
class CompileConfig(CompileOptions):
    """The engine build options (`CompileOptions`: each option, its default and meaning there), and
    `per_method`: overrides of them by method name."""

    per_method: dict[str, dict[str, Any]] = field(default_factory=dict)


@dataclass
class PartitionerEntry:
    """One link of the chain: `tensorrt` (always first), or a partitioner built from `_target_`."""

    name: str = MISSING
    _target_: str | None = None
    kwargs: dict[str, Any] = field(default_factory=dict)
    methods: list[str] | None = None  # None: every method


@dataclass
class PartitionersConfig:
    chain: list[PartitionerEntry] = MISSING


@dataclass
class PassEntry:
    _target_: str = MISSING
    kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass
class TransformsConfig:
    """Edge passes per method (key "*" applies to every method)."""

    passes: dict[str, list[PassEntry]] = field(default_factory=dict)

    def __post_init__(self) -> None:  # OmegaConf 2.3 leaves the items of a list inside a dict as plain dicts
        self.passes = {method: [e if isinstance(e, PassEntry) else PassEntry(**e) for e in entries]
                       for method, entries in self.passes.items()}


@dataclass
class SerializeConfig:
    external_data: bool = False
    etrecord: bool = False
    output_name: str | None = None  # default: the model name
    # A program calling kernels ExecuTorch's runtime library lacks (pipeline/runtime/library_kernels.py):
    # "warn" writes it and says so, "error" refuses it.
    runtime_kernels: str = "warn"


@dataclass
class RuntimeConfig(RuntimeOptions):
    """How the validate step and the benchmark run programs: which runtime (`executor`, one of
    `EXECUTORS`: pipeline.runtime, or ExecuTorch's runtime with the native delegate) and the engine
    options (`RuntimeOptions`)."""

    executor: str = "pipeline"
    validation_seed: int = 1
    max_rel_error: float = 0.02  # an autotune counts only builds within this of eager PyTorch


@dataclass
class CacheConfig:
    """The engine cache every compile looks engines up in (`pipeline/engine/cache.py`)."""

    enabled: bool = True
    url: str | None = None  # None: $PIPELINE_ENGINE_CACHE or ~/.cache/trt-executorch-pipeline/engines
    max_gb: float = 20.0


@dataclass
class TargetConfig:
    """One target of the build matrix: a model and a compile variant (the other groups are shared)."""

    model: ModelConfig = MISSING
    compile: CompileConfig = MISSING


@dataclass
class PipelineConfig:
    model: ModelConfig = MISSING
    compile: CompileConfig = MISSING
    partitioners: PartitionersConfig = MISSING
    transforms: TransformsConfig = MISSING
    serialize: SerializeConfig = MISSING
    runtime: RuntimeConfig = MISSING
    cache: CacheConfig = MISSING
    targets: dict[str, TargetConfig] = field(default_factory=dict)  # the build matrix (conf/matrix/)
    output_dir: str = "build"


GROUPS = {
    "model": ModelConfig,
    "compile": CompileConfig,
    "partitioners": PartitionersConfig,
    "transforms": TransformsConfig,
    "serialize": SerializeConfig,
    "runtime": RuntimeConfig,
    "cache": CacheConfig,
}


def register_configs() -> None:
    """Register every schema with Hydra's ConfigStore (call before composing)."""
    cs = ConfigStore.instance()
    cs.store(name="pipeline_schema", node=PipelineConfig)
    for group, schema in GROUPS.items():
        cs.store(group=group, name=f"{group}_schema", node=schema)


def typed(cfg: DictConfig) -> PipelineConfig:
    """A validated config (composed, or `params.yaml` as read) as the schema's objects: what the steps,
    the stages and the benchmarks take, every value a plain Python value.

    Raises:
        ConfigError: a key the schema does not have, or a value of the wrong type (a hand-edited file).
    """
    try:
        if OmegaConf.get_type(cfg) is not PipelineConfig:
            cfg = OmegaConf.merge(OmegaConf.structured(PipelineConfig), cfg)  # type: ignore[assignment]
        return OmegaConf.to_object(cfg)  # type: ignore[return-value]
    except OmegaConfBaseException as exc:
        reason = str(exc).strip().splitlines()[0]
        raise ConfigError(f"the config does not fit its schema ({reason}); write params.yaml with "
                          "`python -m pipeline.config.compose [OVERRIDES]`") from exc
