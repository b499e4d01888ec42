"""`torch.ops.pipeline.decode_attention`: a decode step's attention over its KV cache, as the compile step
writes it where `compile.decode_kernels` takes an attention out of TensorRT (`lowering/decode_attention.py`):
q [B, H, T, D], k and v [B, KVH, S, D] and the mask (None for none), fp16, the scale, the kernels' PTX
(the constant `decode_product` calls share) and the result's shape: the output as [B, T, H, D] in memory
(the heads merged, as the model's output product reads them), viewed as `shape`. On CUDA it launches
the PTX it is given; on the CPU it computes the kernels' reference (`decode_attention.reference`),
rounded to fp16 as they round."""

from __future__ import annotations

import math

import torch

from pipeline.kernels import decode_attention, driver
from pipeline.kernels.product_op import module_of

OP_NAME = "pipeline::decode_attention"
_LIB = torch.library.Library("pipeline", "FRAGMENT")
_LIB.define("decode_attention(Tensor q, Tensor k, Tensor v, Tensor? mask, float scale, Tensor kernels, int[] shape) -> Tensor")
_LIB.define("decode_attention.out(Tensor q, Tensor k, Tensor v, Tensor? mask, float scale, Tensor kernels, int[] shape, *, "
            "Tensor(a!) out) -> Tensor(a!)")


def _shape(q: torch.Tensor, shape: list[int]) -> list[int]:
    """`shape`, which must hold the [B, T, H, D] output's values."""
    if math.prod(shape) != q.numel():
        raise ValueError(f"decode_attention: shape {list(shape)} does not hold the {q.numel()} values of q {list(q.shape)}")
    return list(shape)


def _compute(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, scale: float,
             kernels: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    if not q.is_cuda:
        return out.copy_(decode_attention.reference(q, k, v, mask, scale).to(out.dtype).reshape(out.shape))
    sizes = decode_attention.sizes(q.shape, k.shape, v.shape, None if mask is None else mask.shape)
    if isinstance(sizes, str):
        raise ValueError(f"decode_attention cannot take these values: {sizes}")
    q, k, v = (t.contiguous() for t in (q, k, v))
    mask = None if mask is None else mask.contiguous()
    workspace = torch.empty(sizes.workspace, dtype=torch.float32, device=q.device)
    result = out if out.is_contiguous() else torch.empty(out.shape, dtype=out.dtype, device=out.device)
    driver.attention(module_of(kernels), q, k, v, mask, workspace, result, scale, sizes)
    return out if result is out else out.copy_(result)


@torch.library.impl(_LIB, "decode_attention", "CompositeExplicitAutograd")
def _functional(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, scale: float,
                kernels: torch.Tensor, shape: list[int]) -> torch.Tensor:
    return _compute(q, k, v, mask, scale, kernels, q.new_empty(_shape(q, shape)))


@torch.library.impl(_LIB, "decode_attention.out", "CompositeExplicitAutograd")
def _out(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, scale: float, kernels: torch.Tensor,
         shape: list[int], *, out: torch.Tensor) -> torch.Tensor:
    return _compute(q, k, v, mask, scale, kernels, out)


@torch.library.register_fake("pipeline::decode_attention")
def _fake(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, scale: float,
          kernels: torch.Tensor, shape: list[int]) -> torch.Tensor:
    return q.new_empty(_shape(q, shape))


def is_decode_attention(node: torch.fx.Node) -> bool:
    """A call of `decode_attention` (ATen, Edge or out form)."""
    return node.op == "call_function" and "pipeline.decode_attention" in str(node.target)
