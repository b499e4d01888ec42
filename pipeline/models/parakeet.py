"""Parakeet CTC (transformers' `ParakeetForCTC`) from a model folder, as a one-method program the way
ExecuTorch's CUDA backend builds speech models: `encoder(features)` runs the FastConformer encoder and
its CTC head over an utterance's log-mel features [1, frames, mels] (the folder's feature extractor
makes them) and returns the logits of every encoder frame [1, frames / 8, vocab]. The program carries
the CTC blank's id; `pipeline.runtime.speech.transcribe_ctc` decodes greedily (the argmax of each frame,
repeats merged, blanks dropped), as transformers' `generate` and tokenizer do."""

from __future__ import annotations

from typing import Any

import torch

from pipeline.errors import ConfigError
from pipeline.models.registry import model_factory
from pipeline.runtime.speech import CTC_BLANK

# The Parakeet kinds transformers has, by model type, and what a program of each is here.
BUILT = {"parakeet_ctc": "ParakeetForCTC"}
NOT_BUILT = {"parakeet_tdt": "ParakeetForTDT", "parakeet_rnnt": "ParakeetForRNNT", "parakeet_encoder": "ParakeetEncoder"}


class ParakeetCTC(torch.nn.Module):
    """A `transformers` `ParakeetForCTC` whose `encoder` method gives the CTC logits of an utterance."""

    folder_loading: dict[str, list[str]] | None = None  # what transformers' loading of the folder left

    def __init__(self, model: Any) -> None:
        super().__init__()
        self.model = model
        self.blank = int(model.config.pad_token_id)

    @property
    def checkpoint_module(self) -> torch.nn.Module:
        """What a checkpoint of this model holds: the `transformers` model's state dict."""
        return self.model

    @property
    def program_constants(self) -> dict[str, int]:
        """What `transcribe_ctc` needs: the blank's id (the CTC head's last class)."""
        return {CTC_BLANK: self.blank}

    def encoder(self, features: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Log-mel features [1, frames, mels] and which frames are the utterance's [1, frames] (the rest
        padding) -> CTC logits [1, frames / 8, vocab] and which of those frames are the utterance's."""
        out = self.model.encoder(input_features=features, attention_mask=mask)
        return self.model.ctc_head(out.last_hidden_state), out.attention_mask

    def forward(self, features: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.encoder(features, mask)


@model_factory
def parakeet(*, folder: str | None = None, **config: Any) -> torch.nn.Module:
    """The Parakeet CTC model of a model `folder` (its `config.json`, fields overridden by `config`,
    its weights loaded as transformers loads them).

    Raises:
        ConfigError: no folder, or a folder of another model or of a Parakeet kind not built here.
    """
    import transformers

    from pipeline.models.hf_folder import folder_config, from_folder

    if folder is None:
        raise ConfigError("pipeline.models.parakeet.parakeet builds from a Hugging Face model folder (model.weights=<folder>) "
                          "that save_pretrained wrote for a ParakeetForCTC; give one")
    cfg = folder_config(folder, None, config)
    if cfg.model_type not in BUILT:
        kind = NOT_BUILT.get(cfg.model_type)
        raise ConfigError(f"model folder {folder!r} is a {kind or cfg.model_type!r} model; pipeline.models.parakeet builds "
                          f"{sorted(BUILT.values())} folders" + (" (a transducer's decoding is not built here yet)"
                                                                 if kind in ("ParakeetForTDT", "ParakeetForRNNT") else ""))
    cfg._attn_implementation = "eager"
    model, loaded = from_folder(getattr(transformers, BUILT[cfg.model_type]), cfg, folder)
    built = ParakeetCTC(model.eval().requires_grad_(False)).eval()
    built.folder_loading = loaded
    return built
