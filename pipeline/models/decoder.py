"""A small decoder-only transformer with two methods: `prefill` (a prompt of fixed length, returns
logits and the KV cache) and `decode` (one token against a cache of dynamic length)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from pipeline.models.registry import model_factory


class Block(torch.nn.Module):
    """Pre-norm attention + MLP block that takes and returns its keys and values."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1 = torch.nn.LayerNorm(dim)
        self.qkv = torch.nn.Linear(dim, 3 * dim)
        self.proj = torch.nn.Linear(dim, dim)
        self.norm2 = torch.nn.LayerNorm(dim)
        self.fc1 = torch.nn.Linear(dim, 4 * dim)
        self.fc2 = torch.nn.Linear(4 * dim, dim)

    def split(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        return x.view(b, t, self.heads, d // self.heads).transpose(1, 2)

    def forward(self, x: torch.Tensor, past_k: torch.Tensor | None, past_v: torch.Tensor | None,
                causal: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        q, k, v = self.qkv(self.norm1(x)).chunk(3, dim=-1)
        q, k, v = self.split(q), self.split(k), self.split(v)
        if past_k is not None and past_v is not None:
            k, v = torch.cat([past_k, k], dim=2), torch.cat([past_v, v], dim=2)
        att = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        b, _, t, _ = att.shape
        x = x + self.proj(att.transpose(1, 2).reshape(b, t, -1))
        x = x + self.fc2(F.gelu(self.fc1(self.norm2(x))))
        return x, k, v


class TinyDecoder(torch.nn.Module):
    """Token embedding, learned positions, `layers` blocks, tied-free LM head."""

    def __init__(self, vocab: int = 256, dim: int = 64, heads: int = 4, layers: int = 2, max_len: int = 128) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, dim)
        self.pos = torch.nn.Embedding(max_len, dim)
        self.blocks = torch.nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.norm = torch.nn.LayerNorm(dim)
        self.head = torch.nn.Linear(dim, vocab)

    def prefill(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """tokens [B, T] -> logits [B, T, V], keys and values [L, B, H, T, D/H]."""
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.embed(tokens) + self.pos(positions)
        ks, vs = [], []
        for block in self.blocks:
            x, k, v = block(x, None, None, causal=True)
            ks.append(k)
            vs.append(v)
        return self.head(self.norm(x)), torch.stack(ks), torch.stack(vs)

    def decode(self, token: torch.Tensor, position: torch.Tensor, keys: torch.Tensor,
               values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One step: token [B, 1], position [1] (int), cache [L, B, H, S, D/H] -> logits, grown cache."""
        x = self.embed(token) + self.pos(position)
        ks, vs = [], []
        for i, block in enumerate(self.blocks):
            x, k, v = block(x, keys[i], values[i], causal=False)
            ks.append(k)
            vs.append(v)
        return self.head(self.norm(x)), torch.stack(ks), torch.stack(vs)

    forward = prefill


class MethodView(torch.nn.Module):
    """Exposes one method of a module as `forward` (torch.export exports `forward`)."""

    def __init__(self, module: torch.nn.Module, method: str) -> None:
        super().__init__()
        self.module = module
        self.method = method

    def forward(self, *args: torch.Tensor) -> object:
        return getattr(self.module, self.method)(*args)


@model_factory
def tiny_decoder(seed: int = 0, vocab: int = 256, dim: int = 64, heads: int = 4, layers: int = 2) -> TinyDecoder:
    """A `TinyDecoder` with weights from `seed`, in eval mode."""
    torch.manual_seed(seed)
    return TinyDecoder(vocab, dim, heads, layers).eval()
