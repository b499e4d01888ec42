"""Parakeet (transformers' Parakeet classes) from a model folder, as programs the way ExecuTorch's CUDA
backend builds speech models. Every kind's `encoder(features, mask)` runs the FastConformer encoder over
an utterance's log-mel features [1, frames, mels] (the folder's feature extractor makes them) padded to
the program's frames, the mask saying which are the utterance's, and returns the mask of the encoder
frames (one per 8 feature frames).

- CTC (`ParakeetForCTC`, `model=parakeet`): the encoder also returns the CTC head's logits of each
  frame; the program carries the blank's id; `pipeline.runtime.speech.transcribe_ctc` decodes (each
  frame's argmax, runs merged, blanks dropped).
- RNN-T and TDT (`ParakeetForRNNT`, `ParakeetForTDT`, `model=parakeet_transducer`): the encoder writes
  the projected frames into the program's state (and resets the prediction network), `decoder_step(token)`
  advances the prediction network (its LSTM state is the program's state) by one token, `joint(index)`
  gives the logits of the frame at `index` against the last prediction (TDT: the tokens', then the
  durations'); `pipeline.runtime.speech.transcribe_transducer` decodes as transformers' `generate` does."""

from __future__ import annotations

import json
from typing import Any

import torch

from pipeline.errors import ConfigError
from pipeline.models.registry import model_factory
from pipeline.runtime.speech import CTC_BLANK

# The Parakeet kinds transformers has, by model type, and the model config that builds each.
BUILT = {"parakeet_ctc": "ParakeetForCTC", "parakeet_rnnt": "ParakeetForRNNT", "parakeet_tdt": "ParakeetForTDT",
         "parakeet_encoder": "ParakeetEncoder"}
CONFIGS = {"parakeet_ctc": "parakeet", "parakeet_rnnt": "parakeet_transducer", "parakeet_tdt": "parakeet_transducer",
           "parakeet_encoder": "hf_encoder"}  # the encoder alone has no decoding: an encoder program


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


class ParakeetTransducer(torch.nn.Module):
    """A `transformers` `ParakeetForRNNT` or `ParakeetForTDT` as `encoder`, `decoder_step` and `joint`,
    what they share in the program's state: the projected encoder frames, the prediction network's LSTM
    state (run step by step with its own weights) and its last prediction. So a step moves a token or a
    frame's index in and logits out, and the methods' inputs do not depend on the folder's sizes."""

    folder_loading: dict[str, list[str]] | None = None  # what transformers' loading of the folder left
    frames: torch.Tensor  # state (buffers)
    hidden: torch.Tensor
    cell: torch.Tensor
    prediction: torch.Tensor

    def __init__(self, model: Any, max_frames: int) -> None:
        super().__init__()
        self.model = model
        cfg = model.config
        self.layers, size = cfg.num_decoder_layers, cfg.decoder_hidden_size
        encoded = int(model.encoder._get_subsampling_output_length(torch.tensor([max_frames])).item())
        self.register_buffer("frames", torch.zeros(1, encoded, size))
        self.register_buffer("hidden", torch.zeros(self.layers, 1, size))
        self.register_buffer("cell", torch.zeros(self.layers, 1, size))
        self.register_buffer("prediction", torch.zeros(1, size))
        start = getattr(cfg, "decoder_start_token_id", None)  # what transformers' generate starts the decoder on
        self.constants: dict[str, Any] = {"blank_id": int(cfg.blank_token_id),
                                          "decoder_start_id": int(cfg.blank_token_id if start is None else start),
                                          "max_symbols_per_step": int(cfg.max_symbols_per_step)}
        if hasattr(cfg, "durations"):
            self.constants["tdt_durations"] = json.dumps([int(d) for d in cfg.durations])
            self.constants["tdt_vocab_size"] = int(cfg.vocab_size)

    @property
    def checkpoint_module(self) -> torch.nn.Module:
        return self.model

    @property
    def program_constants(self) -> dict[str, Any]:
        """What `transcribe_transducer` needs: the blank's id, the token the prediction network starts on,
        the symbols a frame may emit, and for TDT the durations (JSON) and where the token logits end."""
        return self.constants

    def encoder(self, features: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Log-mel features [1, frames, mels] and their mask [1, frames]: the projected encoder frames
        written to the state, the prediction network reset -> the encoder frames' mask [1, frames / 8]."""
        out = self.model.get_audio_features(input_features=features, attention_mask=mask, output_attention_mask=True)
        self.frames.copy_(out.pooler_output)
        self.hidden.zero_()
        self.cell.zero_()
        self.prediction.zero_()
        return out.attention_mask

    def decoder_step(self, token: torch.Tensor) -> torch.Tensor:
        """One token [1] through the prediction network, its state and prediction updated in place ->
        the prediction [1, size]."""
        decoder, lstm = self.model.decoder, self.model.decoder.lstm
        x = decoder.embedding(token)
        hidden, cell = [], []
        for k in range(self.layers):
            gates = (x @ getattr(lstm, f"weight_ih_l{k}").T + getattr(lstm, f"bias_ih_l{k}")
                     + self.hidden[k] @ getattr(lstm, f"weight_hh_l{k}").T + getattr(lstm, f"bias_hh_l{k}"))
            i, f, g, o = gates.chunk(4, -1)
            c = torch.sigmoid(f) * self.cell[k] + torch.sigmoid(i) * torch.tanh(g)
            x = torch.sigmoid(o) * torch.tanh(c)
            hidden.append(x)
            cell.append(c)
        self.hidden.copy_(torch.stack(hidden))
        self.cell.copy_(torch.stack(cell))
        prediction = decoder.decoder_projector(x)
        self.prediction.copy_(prediction)
        return prediction

    def joint(self, index: torch.Tensor) -> torch.Tensor:
        """The encoder frame at `index` [1] against the last prediction -> logits [1, vocab (+ durations)]."""
        frame = self.frames.index_select(1, index)[:, 0]
        return self.model.joint(decoder_hidden_states=self.prediction, encoder_hidden_states=frame)

    def forward(self, features: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.encoder(features, mask)


def _folder_model(folder: str | None, config: dict[str, Any], kinds: tuple[str, ...], where: str) -> tuple[Any, Any]:
    """The Parakeet model of `folder` (one of the model types `kinds`) and what its loading left.

    Raises:
        ConfigError: no folder, or a folder of another kind (naming the config that builds it).
    """
    import transformers

    from pipeline.models.hf_folder import folder_config, from_folder

    if folder is None:
        raise ConfigError(f"{where} builds from a Hugging Face model folder (model.weights=<folder>) that save_pretrained "
                          f"wrote for a {' or '.join(BUILT[k] for k in kinds)}; give one")
    cfg = folder_config(folder, None, config)
    if cfg.model_type not in kinds:
        other = CONFIGS.get(cfg.model_type)
        raise ConfigError(f"model folder {folder!r} is a {BUILT.get(cfg.model_type, cfg.model_type)!r} model; "
                          + (f"build it with model={other}" if other else
                             f"{where} builds {' and '.join(BUILT[k] for k in kinds)} folders"))
    cfg._attn_implementation = "eager"
    model, loaded = from_folder(getattr(transformers, BUILT[cfg.model_type]), cfg, folder)
    return model.eval().requires_grad_(False), loaded


@model_factory
def parakeet(*, folder: str | None = None, **config: Any) -> torch.nn.Module:
    """The Parakeet CTC model of a model `folder` (`model=parakeet`: its `config.json`, fields
    overridden by `config`, its weights loaded as transformers loads them).

    Raises:
        ConfigError: no folder, or a folder of another kind.
    """
    model, loaded = _folder_model(folder, config, ("parakeet_ctc",), "pipeline.models.parakeet.parakeet")
    built = ParakeetCTC(model).eval()
    built.folder_loading = loaded
    return built


@model_factory
def parakeet_transducer(max_frames: int = 3000, *, folder: str | None = None, **config: Any) -> torch.nn.Module:
    """The Parakeet RNN-T or TDT model of a model `folder` (`model=parakeet_transducer`), its encoder
    taking `max_frames` feature frames (the encoder method's input).

    Raises:
        ConfigError: no folder, a folder of another kind, or fewer than 16 frames.
    """
    if int(max_frames) < 16:
        raise ConfigError(f"model.kwargs.max_frames = {max_frames}: the encoder takes at least 16 feature frames")
    model, loaded = _folder_model(folder, config, ("parakeet_rnnt", "parakeet_tdt"),
                                  "pipeline.models.parakeet.parakeet_transducer")
    built = ParakeetTransducer(model, int(max_frames)).eval()
    built.folder_loading = loaded
    return built
