"""Hugging Face `transformers` encoders built from a config with seeded random weights (nothing is
downloaded): the model class and its config class are looked up by architecture name."""

from __future__ import annotations

from typing import Any

import torch

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
    cfg = getattr(transformers, config_name)(**config)
    cfg._attn_implementation = "eager"  # plain ops: the graph TensorRT sees does not depend on the machine
    model = getattr(transformers, model_name)(cfg)
    if architecture == "whisper_encoder":
        model = model.get_encoder()
    return Encoder(model.eval(), takes)
