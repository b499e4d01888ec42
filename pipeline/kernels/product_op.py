"""`torch.ops.pipeline.decode_product`: a product of 1 to 8 tokens with a packed constant weight, as the
compile step writes it where `compile.decode_kernels` takes a product out of TensorRT. Its arguments
are tensors, so ExecuTorch carries them as constants of the program: x [..., k] fp16, the packed
weight and its scales (`formats`; None for fp16), the bias (None for none) and the kernels' PTX
(uint8, one constant every call shares). On CUDA it launches the PTX it is given; on the
CPU it computes the kernels' reference (`formats.reference`), rounded to fp16 as they round.
"""

from __future__ import annotations

from typing import Any

import torch

from pipeline.kernels import driver, formats

OP_NAME = "pipeline::decode_product"
_LIB = torch.library.Library("pipeline", "DEF")
_LIB.define("decode_product(Tensor x, Tensor weight, Tensor? scales, Tensor? bias, Tensor kernels) -> Tensor")
_LIB.define("decode_product.out(Tensor x, Tensor weight, Tensor? scales, Tensor? bias, Tensor kernels, *, "
            "Tensor(a!) out) -> Tensor(a!)")


def packed_of(x: Any, weight: torch.Tensor, scales: torch.Tensor | None) -> formats.PackedWeight:
    """The packed weight the op's tensors hold, its format read from them (fp16 weight: fp16; bytes
    half as wide as x: int4; as wide: fp8)."""
    k = x.shape[-1]
    if weight.dtype == torch.float16:
        format = "fp16"
    elif weight.dtype == torch.uint8 and weight.shape[-1] * 2 == k:
        format = "int4"
    elif weight.dtype == torch.uint8 and weight.shape[-1] == k:
        format = "fp8"
    else:
        raise ValueError(f"decode_product: a {weight.dtype} weight {list(weight.shape)} is no packed weight for x of width {k}")
    group = k // scales.shape[-1] if format == "int4" and scales is not None else 0
    return formats.PackedWeight(format, weight.shape[0], k, group, weight, scales)


def _shape(x: torch.Tensor, weight: torch.Tensor) -> list[int]:
    return [*x.shape[:-1], weight.shape[0]]


def _compute(x: torch.Tensor, weight: torch.Tensor, scales: torch.Tensor | None, bias: torch.Tensor | None, kernels: torch.Tensor,
             out: torch.Tensor) -> torch.Tensor:
    packed = packed_of(x, weight, scales)
    rows = x.reshape(-1, x.shape[-1])
    if x.is_cuda:
        driver.product(module_of(kernels), rows.contiguous(), packed, out.view(-1, packed.n), bias)
    else:
        out.copy_(formats.reference(rows, packed, bias).to(out.dtype).reshape(out.shape))
    return out


_MODULES: dict[tuple[int, int, str], Any] = {}


def module_of(kernels: torch.Tensor) -> Any:
    """The PTX constant's module, looked up by the constant (its bytes are read and hashed once, not at
    every call of a decode step)."""
    key = (kernels.data_ptr(), kernels.numel(), str(kernels.device))
    if key not in _MODULES:
        _MODULES[key] = driver.load(kernels.cpu().numpy().tobytes())
    return _MODULES[key]


@torch.library.impl(_LIB, "decode_product", "CompositeExplicitAutograd")
def _functional(x: torch.Tensor, weight: torch.Tensor, scales: torch.Tensor | None, bias: torch.Tensor | None,
                kernels: torch.Tensor) -> torch.Tensor:
    return _compute(x, weight, scales, bias, kernels, x.new_empty(_shape(x, weight)))


@torch.library.impl(_LIB, "decode_product.out", "CompositeExplicitAutograd")
def _out(x: torch.Tensor, weight: torch.Tensor, scales: torch.Tensor | None, bias: torch.Tensor | None, kernels: torch.Tensor, *,
         out: torch.Tensor) -> torch.Tensor:
    return _compute(x, weight, scales, bias, kernels, out)


@torch.library.register_fake("pipeline::decode_product")
def _fake(x: torch.Tensor, weight: torch.Tensor, scales: torch.Tensor | None, bias: torch.Tensor | None,
          kernels: torch.Tensor) -> torch.Tensor:
    return x.new_empty(_shape(x, weight))


def is_decode_product(node: torch.fx.Node) -> bool:
    """A call of `decode_product` (ATen, Edge or out form)."""
    return node.op == "call_function" and "pipeline.decode_product" in str(node.target)
