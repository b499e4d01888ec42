"""Whisper as a two-method program, the way ExecuTorch's CUDA backend builds speech models:
`encoder(features)` runs the audio encoder once per utterance and writes every decoder layer's
cross-attention keys and values into the program's state; `text_decoder(tokens, start)` runs tokens
at positions start..start+T-1 through the decoder, its self-attention cache in the program's state
(written where it lives) and the cross-attention keys and values read from it, and returns their
logits. `transcribe` (`pipeline.runtime.speech`) runs the two greedily."""

from __future__ import annotations

from typing import Any

import torch

from pipeline.errors import ConfigError
from pipeline.models.registry import model_factory
from pipeline.runtime.speech import SUPPRESS_METHOD

# What `transcribe` reads from the model's config: the tokens that start and end a transcript, and
# the tokens generation never picks (`suppress_tokens`) or never picks first (`begin_suppress_tokens`).
_TOKENS = ("decoder_start_token_id", "eos_token_id")
_SUPPRESS = ("suppress_tokens", "begin_suppress_tokens")


class Whisper(torch.nn.Module):
    """A `transformers` `WhisperForConditionalGeneration` with its caches as buffers (batch 1)."""

    folder_loading: dict[str, list[str]] | None = None  # from a model folder: what transformers' loading left

    def __init__(self, model: Any, max_cache_len: int) -> None:  # a WhisperForConditionalGeneration
        super().__init__()
        self.model = model
        cfg = model.config
        self.max_cache_len = max_cache_len
        self.heads = cfg.decoder_attention_heads
        self.head_dim = cfg.d_model // self.heads
        dtype = next(model.parameters()).dtype
        for i in range(cfg.decoder_layers):
            for name, length in (("self", max_cache_len), ("cross", cfg.max_source_positions)):
                for kv in ("k", "v"):
                    self.register_buffer(f"{name}_{kv}_{i}", torch.zeros(1, self.heads, length, self.head_dim, dtype=dtype))

    @property
    def program_constants(self) -> dict[str, int | str]:
        """What `transcribe` needs: the cache's length, the tokens that start and end a transcript, and
        the tokens it suppresses (as `transformers`' Whisper `generate` does)."""
        import json

        cfg = self.model.config
        suppress = {name: [int(t) for t in getattr(cfg, name, None) or []] for name in _SUPPRESS}
        return {"max_cache_len": self.max_cache_len, **{name: int(getattr(cfg, name)) for name in _TOKENS},
                SUPPRESS_METHOD: json.dumps(suppress, separators=(",", ":"))}

    @property
    def checkpoint_module(self) -> torch.nn.Module:
        """What a checkpoint of this model holds: the `transformers` model's state dict."""
        return self.model

    def _split(self, x: torch.Tensor) -> torch.Tensor:
        return x.view(x.shape[0], x.shape[1], self.heads, self.head_dim).transpose(1, 2)

    def encoder(self, features: torch.Tensor) -> torch.Tensor:
        """Log-mel features [1, mels, frames] -> the encoder's last hidden state; each decoder layer's
        cross-attention keys and values written into the program's state."""
        hidden = self.model.model.encoder(features).last_hidden_state
        for i, layer in enumerate(self.model.model.decoder.layers):
            getattr(self, f"cross_k_{i}").copy_(self._split(layer.encoder_attn.k_proj(hidden)))
            getattr(self, f"cross_v_{i}").copy_(self._split(layer.encoder_attn.v_proj(hidden)))
        return hidden

    def text_decoder(self, tokens: torch.Tensor, start: torch.Tensor) -> torch.Tensor:
        """Tokens [1, T] at positions start..start+T-1 (`start`: [1]) -> their logits [1, T, vocab]."""
        decoder = self.model.model.decoder
        positions = torch.arange(tokens.shape[1], device=tokens.device) + start
        x = decoder.embed_tokens(tokens) + decoder.embed_positions.weight[positions]
        keys = torch.arange(self.max_cache_len, device=tokens.device)
        causal = keys[None, None, None, :] <= positions[None, None, :, None]  # [1, 1, T, cache]
        for i, layer in enumerate(decoder.layers):
            x = x + self._self_attention(layer, i, layer.self_attn_layer_norm(x), positions, causal)
            attn = layer.encoder_attn
            q = self._split(attn.q_proj(layer.encoder_attn_layer_norm(x)) * attn.scaling)
            out = torch.nn.functional.scaled_dot_product_attention(q, getattr(self, f"cross_k_{i}"),
                                                                   getattr(self, f"cross_v_{i}"), scale=1.0)
            x = x + attn.out_proj(out.transpose(1, 2).reshape(x.shape))
            x = x + layer.fc2(layer.activation_fn(layer.fc1(layer.final_layer_norm(x))))
        return self.model.proj_out(decoder.layer_norm(x))

    def _self_attention(self, layer: Any, i: int, h: torch.Tensor, positions: torch.Tensor,
                        causal: torch.Tensor) -> torch.Tensor:
        attn = layer.self_attn
        q = self._split(attn.q_proj(h) * attn.scaling)
        keys, values = getattr(self, f"self_k_{i}"), getattr(self, f"self_v_{i}")
        keys.index_copy_(2, positions, self._split(attn.k_proj(h)))  # the cache written where it lives
        values.index_copy_(2, positions, self._split(attn.v_proj(h)))
        out = torch.nn.functional.scaled_dot_product_attention(q, keys, values, attn_mask=causal, scale=1.0)
        return attn.out_proj(out.transpose(1, 2).reshape(h.shape))

    def forward(self, tokens: torch.Tensor, start: torch.Tensor) -> torch.Tensor:
        return self.text_decoder(tokens, start)


@model_factory
def whisper(max_cache_len: int = 0, dtype: str = "float32", *, folder: str | None = None, **config: Any) -> torch.nn.Module:
    """Whisper with a self-attention cache of `max_cache_len` positions, its `WhisperConfig`'s
    defaults overridden by `config` (d_model, encoder_layers, decoder_layers, num_mel_bins, ...), or
    from a model `folder` (its `config.json`, its weights loaded as transformers loads them).

    Raises:
        ConfigError: a cache of no positions or longer than the model's positions, a dtype that is
            not a float, a field WhisperConfig does not have, a folder that is not a Whisper model, or
            neither a folder nor sizes.
    """
    import transformers

    from pipeline import dtypes
    from pipeline.models.hf_folder import config_with, folder_config, from_folder

    if folder is not None:
        cfg = folder_config(folder, "whisper", config)
    elif not config:
        raise ConfigError("pipeline.models.whisper.whisper builds from a Hugging Face model folder (model.weights=<folder>) "
                          "or from the sizes model.kwargs gives (model=whisper_tiny); give one")
    else:
        cfg = config_with(transformers.WhisperConfig, config)
    if not 1 <= int(max_cache_len) <= cfg.max_target_positions:
        raise ConfigError(f"model.kwargs.max_cache_len = {max_cache_len} must be within 1..{cfg.max_target_positions} "
                          "(the decoder's positions, max_target_positions)")
    row = dtypes.by_name(dtype)
    if row is None or not row.torch.is_floating_point:
        raise ConfigError(f"model.kwargs.dtype = {dtype!r} is not a floating-point dtype")
    cfg._attn_implementation = "eager"
    loaded = None
    if folder is not None:
        model, loaded = from_folder(transformers.WhisperForConditionalGeneration, cfg, folder, row.torch)
    else:
        model = transformers.WhisperForConditionalGeneration(cfg)
    model = model.to(row.torch).eval().requires_grad_(False)
    built = Whisper(model, int(max_cache_len)).eval()
    built.folder_loading = loaded
    return built
