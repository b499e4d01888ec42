"""A Conformer transducer (Parakeet-style RNN-T) as a three-method program: `encoder(features)` runs
the Conformer encoder once per utterance (and resets the prediction network's state), `decoder_step(token)`
advances the prediction network (an LSTM whose state is the program's state) by one token, and
`joint(frame, prediction)` gives the logits of one encoder frame against the last prediction
(`vocab` tokens and the blank, last). `pipeline.runtime.speech.transcribe_transducer` runs them greedily."""

from __future__ import annotations

import torch
from torch import nn

from pipeline.errors import ConfigError
from pipeline.models.registry import model_factory


class _FeedForward(nn.Sequential):
    def __init__(self, d: int) -> None:
        super().__init__(nn.LayerNorm(d), nn.Linear(d, 4 * d), nn.SiLU(), nn.Linear(4 * d, d))


class ConformerBlock(nn.Module):
    """Half-step feed-forward, self-attention, convolution module, half-step feed-forward, norm."""

    def __init__(self, d: int, heads: int, kernel: int) -> None:
        super().__init__()
        self.ff1, self.ff2 = _FeedForward(d), _FeedForward(d)
        self.attn_norm = nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, heads, batch_first=True)
        self.conv_norm = nn.LayerNorm(d)
        self.pointwise_in = nn.Conv1d(d, 2 * d, 1)
        self.depthwise = nn.Conv1d(d, d, kernel, padding=kernel // 2, groups=d)
        self.batch_norm = nn.BatchNorm1d(d)
        self.pointwise_out = nn.Conv1d(d, d, 1)
        self.norm = nn.LayerNorm(d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + 0.5 * self.ff1(x)
        h = self.attn_norm(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        h = nn.functional.glu(self.pointwise_in(self.conv_norm(x).transpose(1, 2)), dim=1)
        x = x + self.pointwise_out(nn.functional.silu(self.batch_norm(self.depthwise(h)))).transpose(1, 2)
        return self.norm(x + 0.5 * self.ff2(x))


class Transducer(nn.Module):
    """Conv subsampling by 4, Conformer blocks, an LSTM prediction network and a joint network."""

    hidden: torch.Tensor  # the prediction network's state (buffers)
    cell: torch.Tensor

    def __init__(self, mels: int, d_model: int, layers: int, heads: int, kernel: int, vocab: int,
                 predictor: int, joint: int) -> None:
        super().__init__()
        self.vocab, self.predictor = vocab, predictor
        self.subsample = nn.Sequential(nn.Conv2d(1, d_model, 3, stride=2), nn.ReLU(), nn.Conv2d(d_model, d_model, 3, stride=2),
                                       nn.ReLU())
        self.project = nn.Linear(d_model * (((mels - 1) // 2 - 1) // 2), d_model)
        self.blocks = nn.ModuleList(ConformerBlock(d_model, heads, kernel) for _ in range(layers))
        self.embed = nn.Embedding(vocab + 1, predictor)  # the blank (id `vocab`) also starts a transcript
        self.gates = nn.Linear(2 * predictor, 4 * predictor)  # the LSTM cell: input and hidden state to its gates
        self.register_buffer("hidden", torch.zeros(1, predictor))
        self.register_buffer("cell", torch.zeros(1, predictor))
        self.joint_encoder, self.joint_predictor = nn.Linear(d_model, joint), nn.Linear(predictor, joint)
        self.joint_out = nn.Linear(joint, vocab + 1)

    @property
    def program_constants(self) -> dict[str, int]:
        """What `transcribe_transducer` needs: the blank token's id (the last logit)."""
        return {"blank_id": self.vocab}

    def encoder(self, features: torch.Tensor) -> torch.Tensor:
        """Log-mel features [1, mels, frames] -> encoder frames [1, frames / 4, d_model]; the prediction
        network's state reset for a new utterance."""
        x = self.subsample(features.unsqueeze(1))  # [1, d, mels', frames']
        x = self.project(x.permute(0, 3, 1, 2).flatten(2))
        for block in self.blocks:
            x = block(x)
        self.hidden.zero_()
        self.cell.zero_()
        return x

    def decoder_step(self, token: torch.Tensor) -> torch.Tensor:
        """One token [1] through the prediction network, its state updated in place -> its output [1, predictor]."""
        gates = self.gates(torch.cat([self.embed(token), self.hidden], -1))
        i, f, g, o = gates.chunk(4, -1)
        cell = torch.sigmoid(f) * self.cell + torch.sigmoid(i) * torch.tanh(g)
        hidden = torch.sigmoid(o) * torch.tanh(cell)
        self.cell.copy_(cell)
        self.hidden.copy_(hidden)
        return hidden

    def joint(self, frame: torch.Tensor, prediction: torch.Tensor) -> torch.Tensor:
        """One encoder frame [1, d_model] and a prediction [1, predictor] -> logits [1, vocab + 1]."""
        return self.joint_out(torch.relu(self.joint_encoder(frame) + self.joint_predictor(prediction)))

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.encoder(features)


@model_factory
def transducer(mels: int = 80, d_model: int = 144, layers: int = 2, heads: int = 4, kernel: int = 15, vocab: int = 64,
               predictor: int = 128, joint: int = 128) -> nn.Module:
    """A Conformer transducer of these sizes (seeded random weights, or a checkpoint of this module).

    Raises:
        ConfigError: a size below 1, heads that do not divide d_model, or an even convolution kernel.
    """
    sizes = {"mels": mels, "d_model": d_model, "layers": layers, "heads": heads, "vocab": vocab, "predictor": predictor,
             "joint": joint}
    small = next((k for k, v in sizes.items() if int(v) < 1), None)
    if small is not None or mels < 7:
        raise ConfigError(f"model.kwargs.{small or 'mels'} = {sizes[small or 'mels']} is too small (mels at least 7, "
                          "every other size at least 1)")
    if d_model % heads or kernel % 2 == 0:
        raise ConfigError(f"model.kwargs: heads ({heads}) must divide d_model ({d_model}) and kernel ({kernel}) be odd")
    return Transducer(mels, d_model, layers, heads, kernel, vocab, predictor, joint).eval()
