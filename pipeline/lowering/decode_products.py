"""The compile step's `compile.decode_kernels`: the products of a decode step (1 to 8 tokens of fp16
times a constant weight) leave the engines for the project's kernels (`pipeline.kernels`).

Before partitioning, each such product becomes a `pipeline::decode_product` call reading the weight
packed as the kernel reads it (fp16, or int4/fp8 with `compile.quantize`'s rounding; a weight that
`quantize.keep` names stays fp16); the products that read one input (a layer's q, k and v; its gate and
up) become one call over their weights stacked, whose result slices hand each its part. The
partitioner refuses these calls, so the engines are the blocks between them. Every other product
stays in TensorRT; why one did is logged.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from pipeline.engine import quantize
from pipeline.engine.compile_spec import TensorRTCompileSpec
from pipeline.kernels import formats, ptx
from pipeline.kernels.product_op import OP_NAME  # noqa: F401  (registers torch.ops.pipeline.decode_product)
from pipeline.lowering.constant_fold import attr, content_digest

log = logging.getLogger("pipeline.lowering.compile")
aten = torch.ops.aten


@dataclass
class _Product:
    node: torch.fx.Node
    x: torch.fx.Node
    weight: torch.Tensor  # [n, k], as nn.Linear holds it
    bias: torch.Tensor | None
    name: str
    format: str
    group: int  # int4: values per scale


def take_products(gm: torch.fx.GraphModule, spec: TensorRTCompileSpec, state: frozenset[str], method: str) -> int:
    """Rewrite the decode products of `gm` as `decode_product` calls (see the module); returns how many
    products the kernels took."""
    if not spec.decode_kernels:
        return 0
    found: list[_Product] = []
    skipped: dict[str, str] = {}
    for node in gm.graph.nodes:
        product = _product(gm, node, spec, state, skipped)
        if product is not None:
            found.append(product)
    if skipped:
        log.info("method %r: %d product(s) stay in TensorRT (%s)", method, len(skipped), "; ".join(
            f"{name}: {why}" for name, why in list(skipped.items())[:3]))
    if not found:
        log.info("method %r: no product of 1 to 8 fp16 tokens with a constant weight, so no kernel of ours", method)
        return 0
    kernels = constant(gm, torch.frombuffer(bytearray(ptx.kernels_ptx()), dtype=torch.uint8), "_decode_kernels")
    groups: dict[tuple[torch.fx.Node, str], list[_Product]] = {}
    for product in found:
        groups.setdefault((product.x, product.format), []).append(product)
    for group in groups.values():
        _replace(gm, group, kernels)
    gm.graph.eliminate_dead_code()
    gm.recompile()
    log.info("method %r: %d product(s) run in the project's kernels, as %d call(s)", method, len(found), len(groups))
    return len(found)


def _product(gm: torch.fx.GraphModule, node: torch.fx.Node, spec: TensorRTCompileSpec, state: frozenset[str],
             skipped: dict[str, str]) -> _Product | None:
    """The product `node` makes, where the kernels can take it."""
    if node.op != "call_function" or node.target not in (aten.linear.default, aten.mm.default, aten.addmm.default):
        return None
    x, w, b = _operands(node)
    if not isinstance(x, torch.fx.Node) or not _constant_node(w, state) or (b is not None and not _constant_node(b, state)):
        return None
    value = x.meta.get("val")
    weight = attr(gm, str(w.target))
    weight = weight.T if node.target is not aten.linear.default else weight
    if not isinstance(value, torch.Tensor) or value.dtype != torch.float16:
        skipped[node.name] = f"its input is {getattr(value, 'dtype', 'not a tensor')}, not float16"
        return None
    if any(not isinstance(d, int) for d in value.shape) or not 1 <= math.prod(value.shape[:-1]) <= formats.MAX_TOKENS:
        skipped[node.name] = f"its input {list(value.shape)} is not 1 to {formats.MAX_TOKENS} tokens of a static shape"
        return None
    name = str(w.target)
    format = "fp16" if quantize.kept(name, spec.quantize) or "linear" not in spec.quantize.layers else formats.FORMAT_OF_MODE.get(spec.quantize.mode)
    if format is None:
        skipped[node.name] = f"the kernels take no {spec.quantize.mode} weights"
        return None
    reason = formats.refusal(format, weight.shape[0], weight.shape[1], spec.quantize.group_size)
    if reason:
        skipped[node.name] = reason
        return None
    bias = attr(gm, str(b.target)) if b is not None else None
    return _Product(node, x, weight, bias, name, format, spec.quantize.group_size)


def _operands(node: torch.fx.Node) -> tuple[Any, Any, Any]:
    if node.target is aten.addmm.default:
        bias, x, w = node.args[:3]
        return x, w, bias if not node.kwargs and len(node.args) == 3 else None
    x, w = node.args[:2]
    return x, w, node.args[2] if len(node.args) > 2 else None


def _constant_node(node: object, state: frozenset[str]) -> bool:
    return isinstance(node, torch.fx.Node) and node.op == "get_attr" and str(node.target) not in state


def constant(gm: torch.fx.GraphModule, value: torch.Tensor, prefix: str) -> str:
    name = f"{prefix}_{content_digest(value)}"
    if not hasattr(gm, name):
        gm.register_buffer(name, value)
    return name


def _replace(gm: torch.fx.GraphModule, group: Sequence[_Product], kernels: str) -> None:
    """One call for the products of `group` (one input, one format), its result sliced for each."""
    packed = formats.stacked([formats.pack(p.weight, p.format, p.group) for p in group])
    bias = None
    if any(p.bias is not None for p in group):
        bias = torch.cat([p.bias if p.bias is not None else torch.zeros(p.weight.shape[0]) for p in group])
    names = [constant(gm, packed.weight, "_decode_weight"),
             None if packed.scales is None else constant(gm, packed.scales, "_decode_scales"),
             None if bias is None else constant(gm, bias.to(torch.float16), "_decode_bias"), kernels]
    first = group[0].node
    with gm.graph.inserting_before(first):
        args = [group[0].x, *(None if n is None else gm.graph.get_attr(n) for n in names)]
        call = gm.graph.call_function(torch.ops.pipeline.decode_product.default, tuple(args))
        value = group[0].x.meta["val"]
        call.meta["val"] = value.new_empty([*value.shape[:-1], packed.n])
        start = 0
        for p in group:
            rows = p.weight.shape[0]
            part = call if len(group) == 1 else gm.graph.call_function(aten.slice.Tensor, (call, -1, start, start + rows))
            if part is not call:
                part.meta["val"] = value.new_empty([*value.shape[:-1], rows])
            start += rows
            p.node.replace_all_uses_with(part)
