"""The decode-product kernels: the PTX a program carries (NVRTC, on the CPU), their arithmetic and weight
layouts run lane by lane on the CPU from the same source, and on a GPU the PTX itself."""

from __future__ import annotations

import ctypes
import re

import pytest
import torch

from pipeline.engine.quantize import WeightScheme, simulated
from pipeline.kernels import decode_attention, formats, ptx

CASES = [("fp16", 37, 1096), ("int4", 37, 1024), ("int4", 5, 2048), ("fp8", 37, 1072), ("fp8", 3, 16)]


def _run_host(host: ctypes.CDLL, x: torch.Tensor, p: formats.PackedWeight, bias: torch.Tensor | None) -> torch.Tensor:
    y = torch.full((x.shape[0], p.n), float("nan"), dtype=torch.float16)
    address = lambda t: ctypes.c_void_p(t.data_ptr() if t is not None else None)  # noqa: E731
    status = host.dp_host(formats.FORMATS[p.format].id, x.shape[0], address(x), address(p.weight), address(p.scales),
                          address(bias), address(y), p.n, p.k, p.group)
    assert status == 0
    return y


@pytest.mark.parametrize("format,n,k", CASES)
@pytest.mark.parametrize("tokens", [1, 3, 8])
def test_the_kernels_compute_their_reference_on_the_cpu(host: ctypes.CDLL, format: str, n: int, k: int, tokens: int) -> None:
    gen = torch.Generator().manual_seed(tokens)
    weight = torch.randn(n, k, generator=gen) * 0.05
    x = torch.randn(tokens, k, generator=gen).half()
    bias = torch.randn(n, generator=gen).half() if tokens != 3 else None
    p = formats.pack(weight, format)
    y = _run_host(host, x, p, bias)
    ref = formats.reference(x, p, bias)
    # One fp16 rounding of the result, and float sums in another order.
    assert torch.allclose(y.float(), ref, rtol=1e-3, atol=1e-3 * ref.abs().max().item()), (y.float() - ref).abs().max()


def test_the_launch_covers_the_rows_the_kernels_compute(host: ctypes.CDLL) -> None:
    """A warp's rows are the kernel's (its source's) and the grid's (formats): every row, no block idle."""
    for name, (format_id, _, rows) in formats.FORMATS.items():
        assert host.dp_rows(format_id) == rows, name
        per_block = formats.WARPS_PER_BLOCK * rows
        for n in (1, 3, 4, 37, 256, 5632):
            assert (formats.grid(n, name) - 1) * per_block < n <= formats.grid(n, name) * per_block


@pytest.mark.parametrize("format", ["int4", "fp8"])
def test_packed_weights_are_the_engines_rounding(format: str) -> None:
    weight = torch.randn(64, 256, generator=torch.Generator().manual_seed(0))
    scheme = WeightScheme("w", "linear", format, 1 if format == "int4" else None, 128 if format == "int4" else 0)
    engines = simulated(weight, scheme)
    ours = formats.dequantized(formats.pack(weight, format, group=128))
    # int4 scales are fp16, as the engines hold them; `simulated` keeps them in float32.
    assert torch.allclose(ours, engines, rtol=2e-3 if format == "int4" else 0, atol=0)
    assert (ours != 0).float().mean() > 0.8


def test_a_wrong_layout_is_caught_on_the_cpu(host: ctypes.CDLL) -> None:
    weight = torch.randn(8, 256, generator=torch.Generator().manual_seed(2))
    p = formats.pack(weight, "int4")
    swapped = formats.PackedWeight("int4", p.n, p.k, p.group, ((p.weight & 0xF) << 4) | (p.weight >> 4), p.scales)
    x = torch.randn(1, 256).half()
    assert not torch.allclose(_run_host(host, x, swapped, None).float(), formats.reference(x, p), atol=1e-2)


@pytest.mark.parametrize("format,n,k,group", [("fp16", 4, 1001, 0), ("int4", 4, 1024, 48), ("int4", 4, 1000, 40),
                                              ("fp8", 4, 24, 0), ("nf4", 4, 64, 0)])
def test_weights_a_kernel_cannot_take_are_refused_in_one_line(format: str, n: int, k: int, group: int) -> None:
    reason = formats.refusal(format, n, k, group or 128)
    assert reason and "\n" not in reason
    if format in formats.FORMATS:
        with pytest.raises(ValueError, match="cannot pack"):
            formats.pack(torch.ones(n, k), format, group or 128)


def test_the_ptx_holds_every_kernel_for_the_virtual_architecture() -> None:
    text = ptx.kernels_ptx().decode()
    entries = set(re.findall(r"\.entry (\w+)\(", text))
    products = {formats.kernel_name(f, t) for f in formats.FORMATS for t in range(1, formats.MAX_TOKENS + 1)}
    assert entries == products | {decode_attention.SPLIT, decode_attention.COMBINE}
    assert re.search(r"^\.target sm_80\b", text, re.M)
    assert "ld.global.nc.v4" in text  # weights read 16 bytes at a time, through the read-only path
    with pytest.raises(ValueError, match="1 to 8 tokens"):
        formats.kernel_name("fp16", 9)


@pytest.mark.gpu
@pytest.mark.parametrize("format,n,k", CASES)
@pytest.mark.parametrize("tokens", [1, 2, 5, 8])
def test_the_ptx_computes_the_reference_on_the_gpu(format: str, n: int, k: int, tokens: int) -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a GPU")
    from pipeline.kernels import driver

    module = driver.Module(ptx.kernels_ptx())
    gen = torch.Generator().manual_seed(tokens)
    weight = torch.randn(n, k, generator=gen) * 0.05
    x = torch.randn(tokens, k, generator=gen).half()
    bias = torch.randn(n, generator=gen).half()
    p = formats.pack(weight, format)
    out = torch.full((tokens, n), float("nan"), dtype=torch.float16, device="cuda")
    driver.product(module, x.cuda(), p.to("cuda"), out, bias.cuda())
    ref = formats.reference(x, p, bias)
    assert torch.allclose(out.cpu().float(), ref, rtol=1e-3, atol=1e-3 * ref.abs().max().item())
