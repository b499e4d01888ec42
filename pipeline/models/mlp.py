"""A small multilayer perceptron (the fastest model to build; the default config's model)."""

from __future__ import annotations

import torch

from pipeline.models.registry import model_factory


class MLP(torch.nn.Module):
    """Linear -> GELU -> Linear -> GELU -> Linear, with a residual around the middle layer."""

    def __init__(self, in_features: int = 64, hidden: int = 128, out_features: int = 10) -> None:
        super().__init__()
        self.inp = torch.nn.Linear(in_features, hidden)
        self.mid = torch.nn.Linear(hidden, hidden)
        self.out = torch.nn.Linear(hidden, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.nn.functional.gelu(self.inp(x))
        h = h + torch.nn.functional.gelu(self.mid(h))
        return self.out(h)


@model_factory
def mlp(seed: int = 0, in_features: int = 64, hidden: int = 128, out_features: int = 10) -> MLP:
    """An `MLP` with weights from `seed`, in eval mode."""
    torch.manual_seed(seed)
    return MLP(in_features, hidden, out_features).eval()
