"""The compile step's `compile.decode_kernels` for attention: each attention of a decode step that
`compile.attention=fused` found (one `tensorrt::attention` call on the un-repeated K/V heads) becomes a
`pipeline::decode_attention` call, the project's kernels (`kernels/decode_attention.cu`): each K/V head is
read once for the query heads it serves, and only the cache positions the mask keeps are read. The
kernels write the output with its heads merged ([B, T, H, D]), which is what the model's output product
reads: the layout ops the model spells between them (a transpose, a copy, a reshape, casts to float and
back) are taken into the call, not left to an engine of their own. The partitioner refuses these calls,
so the engines are the blocks around them. An attention the kernels cannot take stays in TensorRT; why
is logged."""

from __future__ import annotations

import logging
from typing import Any

import torch

from pipeline.engine.attention_op import attention as _trt_attention  # noqa: F401  (registers tensorrt::attention)
from pipeline.engine.compile_spec import TensorRTCompileSpec
from pipeline.kernels import decode_attention, ptx
from pipeline.kernels.attention_op import OP_NAME  # noqa: F401  (registers torch.ops.pipeline.decode_attention)
from pipeline.kernels.product_op import is_decode_product
from pipeline.lowering.decode_products import constant

log = logging.getLogger("pipeline.lowering.compile")
aten = torch.ops.aten


def take_attention(gm: torch.fx.GraphModule, spec: TensorRTCompileSpec, method: str) -> int:
    """Rewrite the decode attentions of `gm` as `decode_attention` calls (see the module); returns how many."""
    if not spec.decode_kernels:
        return 0
    calls = gm.graph.find_nodes(op="call_function", target=torch.ops.tensorrt.attention.default)
    taken, skipped = [], {}
    for node in calls:
        reason = _refusal(node)
        if reason:
            skipped[node.name] = reason
        else:
            taken.append(node)
    if skipped:
        log.info("method %r: %d attention(s) stay in TensorRT (%s)", method, len(skipped), "; ".join(
            f"{name}: {why}" for name, why in list(skipped.items())[:3]))
    if not taken:
        if spec.attention != "fused" and any(is_decode_product(n) for n in gm.graph.nodes):  # a decode step
            log.info("method %r: compile.attention=%s, so attention stays in TensorRT; compile.attention=fused hands a "
                     "decode step's attention to the project's kernels", method, spec.attention)
        return 0
    kernels = constant(gm, torch.frombuffer(bytearray(ptx.kernels_ptx()), dtype=torch.uint8), "_decode_kernels")
    for node in taken:
        q, k, v, mask, scale = node.args
        merged = _merged_heads(node)
        value = node.meta["val"]
        shape = list(merged.meta["val"].shape) if merged is not None else [value.shape[0], value.shape[2], value.shape[1], value.shape[3]]
        with gm.graph.inserting_before(node):
            call = gm.graph.call_function(torch.ops.pipeline.decode_attention.default,
                                          (q, k, v, mask, float(scale), gm.graph.get_attr(kernels), shape))
            call.meta["val"] = value.new_empty(shape)
            if merged is None:  # the model reads [B, H, T, D]: a transpose of the kernels' output, in an engine
                back = gm.graph.call_function(aten.transpose.int, (call, 1, 2))
                back.meta["val"] = call.meta["val"].transpose(1, 2)
        (merged or node).replace_all_uses_with(call if merged is not None else back)
    gm.graph.eliminate_dead_code()
    gm.recompile()
    log.info("method %r: %d attention(s) run in the project's kernels", method, len(taken))
    return len(taken)


def _merged_heads(node: torch.fx.Node) -> torch.fx.Node | None:
    """The last of the layout ops that follow the attention `node` (each its one reader) whose value is
    its output in float16 with the heads merged ([B, T, H, D] in memory, dims of size 1 aside), or None.
    Followed: permutes and transposes (the order read), copies to contiguous memory (the order stored),
    casts between float16 and float32 (exact both ways from float16), and a reshape of what is stored in
    the order read (the last op followed)."""
    sizes = node.meta["val"].shape
    laid = lambda order: [d for d in order if sizes[d] != 1]  # noqa: E731
    want = laid([0, 2, 1, 3])
    read, stored, dtype = [0, 1, 2, 3], [0, 1, 2, 3], torch.float16
    found = None
    while len(node.users) == 1:
        user = next(iter(node.users))
        args: Any = user.args
        if user.target in _RESHAPES and user.meta["val"].shape == node.meta["val"].shape:
            pass  # a view of the same shape changes nothing
        elif user.target is aten._to_copy.default and set(user.kwargs) == {"dtype"} and user.kwargs["dtype"] in (torch.float16, torch.float32):
            dtype = torch.float16 if user.kwargs["dtype"] == torch.float16 else torch.float32
        elif user.target is aten.permute.default:
            read = [read[d % 4] for d in args[1]]
        elif user.target is aten.transpose.int:
            a, b = args[1] % 4, args[2] % 4
            read[a], read[b] = read[b], read[a]
        elif user.target is aten.clone.default and user.kwargs.get("memory_format") in (None, torch.contiguous_format):
            stored = list(read)
        elif user.target in _RESHAPES and laid(read) == laid(stored):
            return user if dtype == torch.float16 and laid(stored) == want else found
        else:
            return found
        if dtype == torch.float16 and laid(read) == laid(stored) == want:
            found = user
        node = user
    return found


_RESHAPES = (aten.view.default, aten._unsafe_view.default, aten.reshape.default)


def _refusal(node: torch.fx.Node) -> str | None:
    """Why the kernels cannot take the attention `node` (None: they can)."""
    q, k, v, mask, scale = node.args
    values = [a.meta.get("val") if isinstance(a, torch.fx.Node) else None for a in (q, k, v, mask)]
    if any(not isinstance(t, torch.Tensor) for t in values[:3]) or (mask is not None and values[3] is None):
        return "its operands are not tensors"
    if not isinstance(scale, (int, float)):
        return "its scale is computed at run time"
    tensors = [t for t in values if t is not None]
    if any(t.dtype != torch.float16 for t in tensors):
        return f"it computes in {sorted({str(t.dtype) for t in tensors})}, not float16"
    if any(not isinstance(d, int) for t in tensors for d in t.shape):
        return "it has a dynamic shape (the kernels run a decode step of fixed tokens)"
    q_value, k_value, v_value, mask_value = values
    sizes = decode_attention.sizes(q_value.shape, k_value.shape, v_value.shape,  # type: ignore[union-attr]
                                   mask_value.shape if mask_value is not None else None)
    return sizes if isinstance(sizes, str) else None
