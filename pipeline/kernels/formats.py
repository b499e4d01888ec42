"""The weight layouts the decode-product kernels read (`decode_products.cu` states them), written from a
linear layer's float weight with `compile.quantize`'s own rounding, and the float weight each layout
stands for (the kernels' reference)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import NamedTuple

import torch


class Layout(NamedTuple):
    """A format as the kernels read it (`decode_products.cu`'s `Format`)."""

    id: int  # the kernels' format id
    values: int  # values in a 16-byte chunk
    rows: int  # output rows one warp computes


FORMATS = {"fp16": Layout(0, 8, 1), "int4": Layout(1, 32, 1), "fp8": Layout(2, 16, 1)}
FORMAT_OF_MODE = {"none": "fp16", "int4_weight_only": "int4", "fp8": "fp8"}  # compile.quantize.mode -> the format
MAX_TOKENS = 8  # the kernels take 1 to 8 tokens
WARPS_PER_BLOCK = 4
THREADS = 32 * WARPS_PER_BLOCK


@dataclass(frozen=True)
class PackedWeight:
    """A [n, k] weight as one kernel format stores it: `weight` (fp16 [n, k], or uint8 bytes), `scales`
    (int4: fp16 [n, k / group]; fp8: float32 [n]; fp16: None)."""

    format: str
    n: int
    k: int
    group: int
    weight: torch.Tensor
    scales: torch.Tensor | None

    def to(self, device: torch.device | str) -> PackedWeight:
        return replace(self, weight=self.weight.to(device), scales=None if self.scales is None else self.scales.to(device))

    @property
    def nbytes(self) -> int:
        """Bytes the kernel reads for the weight (scales included)."""
        return self.weight.nbytes + (self.scales.nbytes if self.scales is not None else 0)


def refusal(format: str, n: int, k: int, group: int = 128) -> str | None:
    """Why a kernel of `format` cannot take an [n, k] weight (None: it can)."""
    if format not in FORMATS:
        return f"format {format!r} is not one of {sorted(FORMATS)}"
    chunk = FORMATS[format].values
    if k % chunk:
        return f"its input dim ({k}) is not a multiple of {chunk} (the {format} kernel reads {chunk} values at a time)"
    if format == "int4" and (group % 32 or k % group):
        return f"int4 groups of {group} do not divide its input dim ({k}) in multiples of 32"
    return None if n > 0 else "it has no output rows"


def pack(weight: torch.Tensor, format: str, group: int = 128) -> PackedWeight:
    """`weight` ([n, k] float, a linear layer's) stored as `format`: int4 and fp8 rounded exactly as
    `compile.quantize` stores them in engines (int4 in groups of `group` along k, fp8 with one scale).

    Raises:
        ValueError: the kernel cannot take this weight (`refusal` says why).
    """
    from pipeline.engine.quantize import WeightScheme, stored_values  # noqa: PLC0415  (the build's side only)

    n, k = weight.shape
    reason = refusal(format, n, k, group)
    if reason:
        raise ValueError(f"cannot pack a [{n}, {k}] weight for the decode-product kernels: {reason}")
    if format == "fp16":
        return PackedWeight(format, n, k, 0, weight.detach().to(torch.float16).contiguous(), None)
    if format == "int4":
        levels, scale = stored_values(weight, WeightScheme("", "linear", "int4", 1, group))
        nibbles = (levels.to(torch.int16) + 8).to(torch.uint8)
        packed = nibbles[:, 0::2] | (nibbles[:, 1::2] << 4)
        return PackedWeight(format, n, k, group, packed.contiguous(), scale.to(torch.float16).contiguous())
    values, scale = stored_values(weight, WeightScheme("", "linear", "fp8", None, 0))
    stored = values.to(torch.float8_e4m3fn).view(torch.uint8).contiguous()
    return PackedWeight(format, n, k, 0, stored, scale.to(torch.float32).expand(n).contiguous())


def stacked(parts: list[PackedWeight]) -> PackedWeight:
    """Packed weights of one format and input width as one, their rows in order (each keeps its own
    scales: stacking changes no stored value)."""
    first = parts[0]
    if any((p.format, p.k, p.group) != (first.format, first.k, first.group) for p in parts):
        raise ValueError("only weights of one format, input width and group stack")
    scales = None if first.scales is None else torch.cat([p.scales for p in parts])  # type: ignore[misc]
    return PackedWeight(first.format, sum(p.n for p in parts), first.k, first.group,
                        torch.cat([p.weight for p in parts]).contiguous(), scales)


def dequantized(p: PackedWeight) -> torch.Tensor:
    """The [n, k] float32 weight the kernel computes with."""
    w = p.weight.cpu()
    if p.format == "fp16":
        return w.to(torch.float32)
    scales = p.scales.cpu().to(torch.float32) if p.scales is not None else torch.ones(1)
    if p.format == "int4":
        levels = torch.stack([w & 0xF, w >> 4], dim=-1).reshape(p.n, p.k).to(torch.float32) - 8
        return levels * scales.repeat_interleave(p.group, dim=1)
    return w.view(torch.float8_e4m3fn).to(torch.float32) * scales.reshape(-1, 1)


def reference(x: torch.Tensor, p: PackedWeight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [t, k] (fp16) @ the weight^T (+ bias), in float32 on the CPU: what the kernel computes before
    its fp16 rounding."""
    y = x.cpu().to(torch.float32) @ dequantized(p).T
    return y + bias.cpu().to(torch.float32) if bias is not None else y


def kernel_name(format: str, tokens: int) -> str:
    """The PTX entry that multiplies `tokens` tokens with a `format` weight."""
    if not 1 <= tokens <= MAX_TOKENS:
        raise ValueError(f"the decode-product kernels take 1 to {MAX_TOKENS} tokens, not {tokens}")
    return f"dp_{format}_t{tokens}"


def grid(n: int, format: str) -> int:
    """Thread blocks of `THREADS` threads for `n` output rows of `format`."""
    return -(-n // (WARPS_PER_BLOCK * FORMATS[format].rows))
