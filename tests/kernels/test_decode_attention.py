"""The decode-attention kernels: their code run thread by thread on the CPU (`da_host`, the source NVRTC
compiles) against their reference and torch's attention, the positions a mask leaves out never read,
the sizes they refuse in one line; on a GPU, the PTX itself."""

from __future__ import annotations

import ctypes
import math

import pytest
import torch

from pipeline.kernels import decode_attention
from pipeline.kernels.decode_attention import Sizes

# batch, heads, kv_heads, tokens, positions, dim, mask batch (0: none): GQA of 8 and 1 query heads a K/V
# head, several tokens, positions short of a chunk and over several, a mask a batch row.
CASES = [Sizes(1, 32, 4, 1, 300, 64, 1), Sizes(2, 8, 2, 3, 130, 32, 2), Sizes(1, 4, 4, 2, 64, 128, 0),
         Sizes(1, 8, 1, 4, 200, 16, 1), Sizes(3, 6, 3, 8, 40, 8, 1)]


def _values(s: Sizes, seed: int = 0) -> tuple[torch.Tensor, ...]:
    """q, k, v and a causal mask (each token keeps the positions up to its own, after a prompt of 23)."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(s.batch, s.heads, s.tokens, s.dim, generator=gen).half()
    k, v = (torch.randn(s.batch, s.kv_heads, s.positions, s.dim, generator=gen).half() for _ in range(2))
    last = torch.minimum(torch.arange(s.tokens) + 23, torch.tensor(s.positions - 1))
    keep = torch.arange(s.positions)[None, :] <= last[:, None]
    mask = torch.where(keep, torch.randn(s.tokens, s.positions, generator=gen) * 0.5, -math.inf)
    mask = mask.expand(max(s.mask_batch, 1), 1, s.tokens, s.positions).half().contiguous()
    return q, k, v, (mask if s.mask_batch else None)


def _run_host(host: ctypes.CDLL, s: Sizes, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
              scale: float) -> torch.Tensor:
    workspace = torch.full((s.workspace,), math.nan)
    out = torch.full((s.batch, s.tokens, s.heads, s.dim), math.nan, dtype=torch.float16)
    address = lambda t: ctypes.c_void_p(t.data_ptr() if t is not None else None)  # noqa: E731
    status = host.da_host(address(q), address(k), address(v), address(mask), address(workspace), address(out), *s,
                          ctypes.c_float(scale))
    assert status == 0
    return out


@pytest.mark.parametrize("s", CASES, ids=str)
def test_the_kernels_compute_their_reference_and_torchs_attention_on_the_cpu(host: ctypes.CDLL, s: Sizes) -> None:
    q, k, v, mask = _values(s)
    scale = s.dim ** -0.5
    out = _run_host(host, s, q, k, v, mask, scale)
    ref = decode_attention.reference(q, k, v, mask, scale)
    assert torch.allclose(out.float(), ref, rtol=1e-3, atol=1e-3), (out.float() - ref).abs().max()
    group = s.heads // s.kv_heads  # torch's own attention, the K/V heads repeated for it
    torchs = torch.nn.functional.scaled_dot_product_attention(
        q.float(), k.float().repeat_interleave(group, 1), v.float().repeat_interleave(group, 1),
        attn_mask=None if mask is None else mask.float(), scale=scale).transpose(1, 2)
    assert torch.allclose(ref, torchs, atol=1e-5), (ref - torchs).abs().max()


def test_positions_the_mask_leaves_out_are_never_read(host: ctypes.CDLL) -> None:
    """NaN in the cache past each token's position (a cache not yet written) changes nothing: a chunk of
    only such positions is skipped, and a partly kept chunk reads no left-out K or V."""
    s = Sizes(1, 8, 2, 2, 300, 32, 1)
    q, k, v, mask = _values(s)
    assert mask is not None
    want = _run_host(host, s, q, k, v, mask, 0.2)
    k[:, :, 25:], v[:, :, 25:] = math.nan, math.nan  # the last token keeps positions up to 24
    assert torch.equal(_run_host(host, s, q, k, v, mask, 0.2), want)


def test_a_query_that_keeps_no_position_gives_zeros(host: ctypes.CDLL) -> None:
    s = Sizes(1, 4, 2, 2, 70, 16, 1)
    q, k, v, mask = _values(s)
    assert mask is not None
    mask[0, 0, 1] = -math.inf
    out = _run_host(host, s, q, k, v, mask, 0.25)
    assert torch.equal(out[0, 1], torch.zeros_like(out[0, 1])) and out[0, 0].abs().max() > 0
    assert torch.equal(decode_attention.reference(q, k, v, mask, 0.25)[0, 1], torch.zeros(s.heads, s.dim))


def test_a_wrong_head_grouping_is_caught_on_the_cpu(host: ctypes.CDLL) -> None:
    """Query heads read from the wrong K/V head (repeated instead of interleaved) differ from the reference."""
    s = Sizes(1, 8, 2, 1, 100, 16, 1)
    q, k, v, mask = _values(s)
    swapped = q.reshape(1, 2, 4, 1, 16).transpose(1, 2).reshape(1, 8, 1, 16)  # head j -> K/V head j % 2
    ref = decode_attention.reference(q, k, v, mask, 0.25)
    assert not torch.allclose(_run_host(host, s, swapped.contiguous(), k, v, mask, 0.25).float(), ref, atol=1e-2)


def test_the_limits_are_the_sources(host: ctypes.CDLL) -> None:
    assert [host.da_limit(i) for i in range(4)] == [decode_attention.CHUNK, decode_attention.MAX_QUERIES,
                                                   decode_attention.MAX_QUERY_VALUES, decode_attention.THREADS]
    s = CASES[0]
    assert s.chunks == 5 and s.workspace == 32 * 5 * 66 and s.grids == ((5, 4, 1), (32, 1, 1))


@pytest.mark.parametrize("q,k,mask,why", [
    ((1, 32, 9, 64), (1, 4, 64, 64), None, "1 to 8 tokens"),
    ((1, 32, 1, 60), (1, 4, 64, 60), None, "multiple of 8"),
    ((1, 30, 1, 64), (1, 4, 64, 64), None, "does not serve"),
    ((1, 64, 1, 64), (1, 1, 64, 64), None, "32 and 4096"),
    ((1, 32, 4, 256), (1, 4, 64, 256), None, "32 and 4096"),
    ((1, 32, 1, 64), (1, 4, 64, 64), (1, 32, 1, 64), "one mask for every head"),
    ((1, 32, 1, 64), (1, 4, 0, 64), None, "empty dim"),
    ((1, 32, 1, 64), (1, 4, 64), None, "not [B, H, T, D]"),
])
def test_sizes_the_kernels_cannot_take_are_refused_in_one_line(q: tuple[int, ...], k: tuple[int, ...],
                                                               mask: tuple[int, ...] | None, why: str) -> None:
    reason = decode_attention.sizes(q, k, k, mask)
    assert isinstance(reason, str) and why in reason and "\n" not in reason


@pytest.mark.gpu
@pytest.mark.parametrize("s", CASES, ids=str)
def test_the_ptx_computes_the_reference_on_the_gpu(s: Sizes) -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a GPU")
    from pipeline.kernels import driver, ptx

    module = driver.Module(ptx.kernels_ptx())
    q, k, v, mask = _values(s)
    out = torch.full((s.batch, s.tokens, s.heads, s.dim), math.nan, dtype=torch.float16, device="cuda")
    workspace = torch.empty(s.workspace, device="cuda")
    driver.attention(module, q.cuda(), k.cuda(), v.cuda(), None if mask is None else mask.cuda(), workspace, out, 0.125, s)
    ref = decode_attention.reference(q, k, v, mask, 0.125)
    assert torch.allclose(out.float().cpu(), ref, rtol=2e-3, atol=2e-3), (out.float().cpu() - ref).abs().max()
