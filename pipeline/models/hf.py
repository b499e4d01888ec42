"""Hugging Face `transformers` models built from a config with seeded random weights (nothing is
downloaded): encoders, and causal decoders with a static KV cache; the model class and its config
class are looked up by architecture name."""

from __future__ import annotations

from typing import Any

import torch

from pipeline import dtypes
from pipeline.errors import ConfigError
from pipeline.models.registry import model_factory

# architecture -> (model class, config class, what forward takes)
ENCODERS = {
    "bert": ("BertModel", "BertConfig", "tokens"),
    "roberta": ("RobertaModel", "RobertaConfig", "tokens"),
    "distilbert": ("DistilBertModel", "DistilBertConfig", "tokens"),
    "electra": ("ElectraModel", "ElectraConfig", "tokens"),
    "albert": ("AlbertModel", "AlbertConfig", "tokens"),
    "mpnet": ("MPNetModel", "MPNetConfig", "tokens"),
    "clip_text": ("CLIPTextModel", "CLIPTextConfig", "tokens"),
    "t5_encoder": ("T5EncoderModel", "T5Config", "tokens"),
    "vit": ("ViTModel", "ViTConfig", "pixels"),
    "deit": ("DeiTModel", "DeiTConfig", "pixels"),
    "beit": ("BeitModel", "BeitConfig", "pixels"),
    "dinov2": ("Dinov2Model", "Dinov2Config", "pixels"),
    "clip_vision": ("CLIPVisionModel", "CLIPVisionConfig", "pixels"),
    "siglip_vision": ("SiglipVisionModel", "SiglipVisionConfig", "pixels"),
    "convnext": ("ConvNextModel", "ConvNextConfig", "pixels"),
    "swin": ("SwinModel", "SwinConfig", "pixels"),
    "whisper_encoder": ("WhisperModel", "WhisperConfig", "features"),
}


class Encoder(torch.nn.Module):
    """A `transformers` encoder whose forward takes one tensor and returns its last hidden state."""

    def __init__(self, model: torch.nn.Module, takes: str) -> None:
        super().__init__()
        self.model = model
        self.takes = takes

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.takes == "features":
            return self.model(x).last_hidden_state
        key = "input_ids" if self.takes == "tokens" else "pixel_values"
        return self.model(**{key: x}).last_hidden_state


@model_factory
def encoder(architecture: str, **config: Any) -> torch.nn.Module:
    """The encoder of `architecture` (a key of `ENCODERS`), its config's defaults overridden by `config`.

    Raises:
        ConfigError: an unknown architecture.
    """
    if architecture not in ENCODERS:
        raise ConfigError(f"model.kwargs.architecture = {architecture!r} is not one of {sorted(ENCODERS)}")
    import transformers

    model_name, config_name, takes = ENCODERS[architecture]
    cfg = _config(config_name, config)
    cfg._attn_implementation = "eager"  # plain ops: the graph TensorRT sees does not depend on the machine
    model = getattr(transformers, model_name)(cfg)
    if architecture == "whisper_encoder":
        model = model.get_encoder()
    return Encoder(model.eval(), takes)


# architecture -> (causal LM class, config class)
DECODERS = {
    "llama": ("LlamaForCausalLM", "LlamaConfig"),
    "qwen2": ("Qwen2ForCausalLM", "Qwen2Config"),
}


FLOATS = ("float32", "float16", "bfloat16")


class Decoder(torch.nn.Module):
    """A `transformers` causal LM with its KV cache as buffers, as `transformers` exports for
    ExecuTorch (`TorchExportableModuleWithStaticCache`: a static cache of `max_cache_len` positions,
    the cache position an input). `step(tokens, start)` writes T tokens at positions start..start+T-1
    and returns the logits of each: prefill is a step from 0, decode a step of one token. Configs
    compile both methods from `step` with the same token range, so that they call one engine (the
    weights once, in the files and on the device)."""

    def __init__(self, model: Any, max_cache_len: int) -> None:  # a transformers PreTrainedModel
        super().__init__()
        from transformers import GenerationConfig
        from transformers.integrations.executorch import TorchExportableModuleWithStaticCache

        model.generation_config = GenerationConfig(use_cache=True, cache_implementation="static", max_length=max_cache_len,
                                                   cache_config={"batch_size": 1, "max_cache_len": max_cache_len})
        self.max_cache_len = max_cache_len
        self.model = TorchExportableModuleWithStaticCache(model, batch_size=1, max_cache_len=max_cache_len)

    @property
    def program_constants(self) -> dict[str, int]:
        """Stored in the program as constant methods: what `pipeline.runtime.generate` checks against."""
        return {"max_cache_len": self.max_cache_len}

    def step(self, tokens: torch.Tensor, start: torch.Tensor) -> torch.Tensor:
        """Tokens [1, T] at positions start..start+T-1 (`start`: [1]); their logits [1, T, vocab]."""
        return self._run(tokens, torch.arange(tokens.shape[1], device=tokens.device) + start)

    def prefill(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.step(tokens, torch.zeros(1, dtype=torch.int64, device=tokens.device))

    def decode(self, token: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
        return self.step(token, position)

    def _run(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        # The cache object holds its own references to the tensors registered as buffers; point it
        # at the module's buffers as they are now, so that torch.export (which swaps in its own
        # tensors for buffers) sees the writes as buffer mutations and not as writes to constants.
        layers: list[Any] = list(self.model.static_cache.layers)
        for i, layer in enumerate(layers):
            layer.keys = getattr(self.model, f"key_cache_{i}")
            layer.values = getattr(self.model, f"value_cache_{i}")
            if hasattr(self.model, f"cumulative_length_{i}"):
                layer.cumulative_length = getattr(self.model, f"cumulative_length_{i}")
            if hasattr(layer, "device"):  # set when the cache was made; the module may have moved since
                layer.device = layer.keys.device
        return self.model(input_ids=tokens, cache_position=positions)

    def forward(self, tokens: torch.Tensor, start: torch.Tensor) -> torch.Tensor:
        return self.step(tokens, start)


@model_factory
def decoder(architecture: str, max_cache_len: int, dtype: str = "float32", **config: Any) -> torch.nn.Module:
    """The causal decoder of `architecture` (a key of `DECODERS`) with a KV cache of `max_cache_len`
    positions, weights and cache in `dtype`, its config's defaults overridden by `config`
    (hidden_size, num_hidden_layers, ...). Inference only: no parameter requires grad.

    Raises:
        ConfigError: an unknown architecture or dtype, or a cache of no positions.
    """
    if architecture not in DECODERS:
        raise ConfigError(f"model.kwargs.architecture = {architecture!r} is not one of {sorted(DECODERS)}")
    if int(max_cache_len) < 1:
        raise ConfigError(f"model.kwargs.max_cache_len = {max_cache_len} must be at least 1")
    row = dtypes.by_name(dtype)
    if row is None or not row.torch.is_floating_point:
        raise ConfigError(f"model.kwargs.dtype = {dtype!r} is not a floating-point dtype ({', '.join(FLOATS)})")
    import transformers

    model_name, config_name = DECODERS[architecture]
    cfg = _config(config_name, config)
    cfg._attn_implementation = "sdpa"  # one scaled_dot_product_attention per layer (GQA included)
    model = getattr(transformers, model_name)(cfg).to(row.torch).eval().requires_grad_(False)
    return Decoder(model, int(max_cache_len)).eval()


def _config(config_name: str, fields: dict[str, Any]) -> Any:
    """The `transformers` config with `fields` set. `transformers` keeps any keyword as an attribute,
    so a misspelt field would silently build the default-sized model: unknown fields are refused.

    Raises:
        ConfigError: a field the config class does not have.
    """
    import difflib

    import transformers

    config_class = getattr(transformers, config_name)
    known = set(config_class().to_dict())
    for name in sorted(set(fields) - known):
        close = difflib.get_close_matches(name, known, n=1)
        raise ConfigError(f"model.kwargs.{name} is not a field of {config_name}"
                          + (f" (did you mean {close[0]!r}?)" if close else ""))
    return config_class(**fields)
