"""The coverage suite: real models from torchvision, timm and Hugging Face `transformers`, each as the
`model` section a config would hold (a plain `_target_` with its own kwargs, seeded random weights
in which every layer changes the output, nothing downloaded) plus its example input; and the
multi-method programs (decoders, speech) as their configs build them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pipeline.errors import ConfigError

# Built in the CI slice (`--slice fast`): one of each family and source, each a few seconds to build.
FAST = ("torchvision/squeezenet1_1", "torchvision/shufflenet_v2_x0_5", "timm/lcnet_050", "timm/vit_tiny_patch16_224",
        "hf/bert_tiny")

TIMM = (
    # CNNs
    "resnet50", "resnetv2_50", "resnext50_32x4d", "seresnet50", "res2net50_26w_4s", "skresnet18", "resnest14d",
    "densenet121", "dla34", "dpn68b", "hrnet_w18_small", "inception_v3", "xception41", "cspdarknet53", "regnety_008",
    "regnetz_b16", "gernet_s", "selecsls42b", "repvgg_a0", "vgg11", "nfnet_l0", "hgnetv2_b0", "convnext_atto",
    "convnextv2_atto", "inception_next_tiny", "rdnet_tiny", "starnet_s1",
    # mobile nets
    "efficientnet_b0", "efficientnetv2_rw_t", "tf_efficientnet_lite0", "mobilenetv3_large_100",
    "mobilenetv4_conv_small", "ghostnet_100", "ghostnetv2_100", "rexnet_100", "lcnet_050", "mixnet_s", "fbnetc_100",
    "mnasnet_100", "mobileone_s0", "repghostnet_050",
    # vision transformers and MLPs
    "vit_tiny_patch16_224", "deit_tiny_patch16_224", "beit_base_patch16_224", "eva02_tiny_patch14_224",
    "swin_tiny_patch4_window7_224", "cait_xxs24_224", "pit_ti_224", "xcit_nano_12_p16_224", "twins_svt_small",
    "pvt_v2_b0", "davit_tiny", "mixer_s16_224", "resmlp_12_224", "poolformer_s12", "caformer_s18",
    # hybrids
    "levit_128s", "mobilevit_xxs", "efficientformer_l1", "edgenext_xx_small", "fastvit_t8", "efficientvit_b0",
    "coatnet_0_rw_224", "coat_lite_tiny", "tiny_vit_5m_224", "visformer_tiny", "maxvit_nano_rw_256",
)

_TEXT = {"shape": [1, 128], "dtype": "int64", "low": 0, "high": 1000}
_IMAGE = {"shape": [1, 3, 224, 224]}
# name -> (architecture, config overrides, input)
HF: dict[str, tuple[str, dict[str, Any], dict[str, Any]]] = {
    "bert": ("bert", {}, _TEXT),
    "bert_tiny": ("bert", {"hidden_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2,
                           "intermediate_size": 512}, _TEXT),
    "roberta": ("roberta", {}, _TEXT),
    "distilbert": ("distilbert", {}, _TEXT),
    "electra_small": ("electra", {}, _TEXT),
    "albert": ("albert", {}, _TEXT),
    "mpnet": ("mpnet", {}, _TEXT),
    "clip_text": ("clip_text", {}, {**_TEXT, "shape": [1, 77]}),
    "t5_small_encoder": ("t5_encoder", {"d_model": 512, "d_ff": 2048, "num_layers": 6, "num_heads": 8}, _TEXT),
    "vit": ("vit", {}, _IMAGE),
    "deit": ("deit", {}, _IMAGE),
    "beit": ("beit", {}, _IMAGE),
    "dinov2_small": ("dinov2", {"hidden_size": 384, "num_attention_heads": 6}, _IMAGE),
    "clip_vision": ("clip_vision", {}, _IMAGE),
    "siglip_vision": ("siglip_vision", {}, _IMAGE),
    "convnext": ("convnext", {}, _IMAGE),
    "swin": ("swin", {}, _IMAGE),
    "whisper_tiny_encoder": ("whisper_encoder", {"d_model": 384, "encoder_layers": 4, "encoder_attention_heads": 6,
                                                  "decoder_layers": 4, "decoder_attention_heads": 6,
                                                  "encoder_ffn_dim": 1536, "decoder_ffn_dim": 1536},
                             {"shape": [1, 80, 3000]}),
}

# Causal decoders (`pipeline.models.hf.decoder`, by transformers model type): one tiny size for all,
# each family taking the fields its config has (GPT-2's `n_embd` is its `hidden_size`), token ids
# inside the tiny vocabulary. Built as the decoder configs are: prefill and decode, one function.
DECODER_SIZE: dict[str, Any] = {
    "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 256, "max_position_embeddings": 128,
    "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2,
    "num_local_experts": 4, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 64,  # mixtures of experts
    "n_shared_experts": 1,  # dots.llm1: its default has none, which its shared expert's size multiplies
    "num_kv_shared_layers": 0,  # Gemma-3n: by default its last 15 layers read earlier ones' caches; 2 layers here
    "rotary_dim": 8,  # GPT-J, CodeGen: rotary dims within a head
    "decoder_layers": 2, "decoder_attention_heads": 4, "decoder_ffn_dim": 128,  # BART-style decoders
    "qk_rope_head_dim": 16, "qk_nope_head_dim": 16, "v_head_dim": 16, "kv_lora_rank": 32, "q_lora_rank": 32,  # latent attention
    "attention_types": [[["global", "local"], 1]]}  # GPT-Neo: one pair of layer kinds for the two layers
DECODERS = ("llama", "qwen2", "qwen3", "mistral", "mixtral", "qwen3_moe", "gemma", "gemma2", "gemma3_text", "phi",
            "phi3", "gpt2", "gpt_neox", "opt", "olmo", "olmo2", "granite", "stablelm", "starcoder2", "smollm3",
            "cohere", "glm", "nemotron", "exaone4", "persimmon")
DECODER_CACHE = 32

# Speech programs, by their model config (`conf/model/<name>.yaml`): the methods a user builds.
SPEECH = ("whisper_tiny", "transducer_tiny")


@dataclass(frozen=True)
class Entry:
    """One suite model: its name, source, `model` config section and input."""

    name: str
    source: str  # torchvision | torchvision-segmentation | timm | hf | hf-decoder | speech
    model: dict[str, Any] = field(hash=False)

    @property
    def inputs(self) -> list[dict[str, Any]]:
        return self.model["methods"]["forward"]["inputs"]


def _entry(name: str, source: str, target: str, kwargs: dict[str, Any], item: dict[str, Any]) -> Entry:
    section = {"name": name.replace("/", "-"), "_target_": target, "kwargs": kwargs, "seed": 0, "init": "every_layer",
               "methods": {"forward": {"inputs": [{"dtype": "float32", "low": 0, "high": 2, **item}]}}}
    return Entry(name, source, section)


def entries() -> list[Entry]:
    """Every suite model, in a fixed order."""
    import torchvision

    out = []
    for name in torchvision.models.list_models(module=torchvision.models):
        size = 299 if name == "inception_v3" else 224
        out.append(_entry(f"torchvision/{name}", "torchvision", f"torchvision.models.{name}", {},
                          {"shape": [1, 3, size, size]}))
    for name in torchvision.models.list_models(module=torchvision.models.segmentation):
        out.append(_entry(f"torchvision/{name}", "torchvision-segmentation", f"torchvision.models.segmentation.{name}",
                          {"weights_backbone": None}, _IMAGE))
    out.extend(_timm(name) for name in TIMM)
    for name, (arch, config, item) in HF.items():
        out.append(_entry(f"hf/{name}", "hf", "pipeline.models.hf.encoder", {"architecture": arch, **config}, item))
    out.extend(_decoder(family) for family in DECODERS)
    out.extend(_speech(name) for name in SPEECH)
    return out


def select(names: list[str] | None = None, slice_: str = "all") -> list[Entry]:
    """Suite entries by slice ("all", "fast", or a source) and then by name (exact, or a prefix such as
    "timm/"); a timm architecture or a causal-LM model type of transformers outside the suite
    (`timm/<name>`, `hf-decoder/<model type>`) is built like the suite's own, so held-out models run
    through the same command. An unknown name is an error naming the suite's sources."""
    chosen = entries()
    if slice_ == "fast":
        chosen = [e for e in chosen if e.name in FAST]
    elif slice_ != "all":
        chosen = [e for e in chosen if e.source == slice_]
    if names:
        picked = [e for e in chosen if any(e.name == n or (n.endswith("/") and e.name.startswith(n)) for n in names)]
        unknown = [n for n in names if not any(e.name == n or (n.endswith("/") and e.name.startswith(n)) for e in chosen)]
        held_out = _held_out(unknown)
        unknown = [n for n in unknown if n not in {e.name for e in held_out}]
        if unknown:
            raise ConfigError(f"not in the suite: {unknown}; names look like 'timm/resnet50' or a prefix like 'hf/' "
                              "(any timm architecture, or any causal-LM model type as 'hf-decoder/<type>', may be named)")
        chosen = picked + held_out
    return chosen


def _held_out(names: list[str]) -> list[Entry]:
    """Entries for the timm architectures and causal-LM model types among `names` that the suite lacks."""
    timm_names = _timm_architectures() if any(n.startswith("timm/") for n in names) else set()
    decoder_types = _causal_lm_types() if any(n.startswith("hf-decoder/") for n in names) else set()
    out = [_timm(n[5:]) for n in names if n.startswith("timm/") and n[5:] in timm_names]
    out += [_decoder(n[11:]) for n in names if n.startswith("hf-decoder/") and n[11:] in decoder_types]
    return out


def first_output(out: Any) -> Any:
    """The output of a suite model that checks compare: a tuple's or list's first, a dict's first
    value (segmentation models return {"out": ...})."""
    if isinstance(out, dict):
        return out[next(iter(out))]
    return out[0] if isinstance(out, (list, tuple)) else out


def _decoder(family: str) -> Entry:
    import transformers
    from transformers.utils import logging as hf_logging

    config_class = transformers.CONFIG_MAPPING[family]
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # a default config's own complaints (OPT's token ids) are not the suite's
    try:
        known = {*config_class().to_dict(), *getattr(config_class, "attribute_map", {})}
    finally:
        hf_logging.set_verbosity(verbosity)
    if "kv_lora_rank" in known:  # latent attention: keys and values per head, however many there are
        known.discard("num_key_value_heads")
    kwargs = {"architecture": family, "max_cache_len": DECODER_CACHE,
              **{k: v for k, v in DECODER_SIZE.items() if k in known}}
    step = {"function": "step", "dims": {"tokens": {"min": 1, "max": DECODER_CACHE}}, "dynamic": {0: {1: "tokens"}},
            "inputs": [{"shape": [1, 8], "dtype": "int64", "low": 0, "high": DECODER_SIZE["vocab_size"]},
                       {"shape": [1], "dtype": "int64", "low": 0, "high": 1}]}
    section = {"name": f"hf-decoder-{family}", "_target_": "pipeline.models.hf.decoder", "kwargs": kwargs, "seed": 0,
               "methods": {"prefill": step, "decode": step}}
    return Entry(f"hf-decoder/{family}", "hf-decoder", section)


def _causal_lm_types() -> set[str]:
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return set(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)


def _speech(name: str) -> Entry:
    """The model section `model=<name>` composes (its config may extend another, as whisper_tiny does)."""
    from omegaconf import OmegaConf

    from pipeline.config.compose import compose

    section = OmegaConf.to_container(compose([f"model={name}"]).model)
    assert isinstance(section, dict)
    return Entry(f"speech/{name}", "speech", {str(key): value for key, value in section.items()})


def _timm(name: str) -> Entry:
    return _entry(f"timm/{name}", "timm", "timm.create_model", {"model_name": name}, {"shape": [1, *_timm_input(name)]})


def _timm_architectures() -> set[str]:
    import timm

    return set(timm.list_models())


def _timm_input(name: str) -> list[int]:
    from timm.models import get_pretrained_cfg

    cfg = get_pretrained_cfg(name)
    if cfg is None:
        raise ConfigError(f"timm has no default config for {name!r}")
    return list(cfg.input_size)
