"""Converter for `aten.embedding` (a gather on the weight's first dim)."""

from __future__ import annotations

from typing import Any

import torch

from pipeline.engine.context import ConversionContext
from pipeline.engine.converters import _validators as v
from pipeline.engine.converters.registry import converter

aten = torch.ops.aten
Node = torch.fx.Node


def _embedding_ok(node: Node, spec: Any) -> str | None:
    weight, indices = node.args[0].meta["val"], node.args[1].meta["val"]  # type: ignore[union-attr]
    if weight.dtype not in v.FLOAT_DTYPES:
        return f"embedding weight dtype {weight.dtype} is not floating point"
    if indices.dtype not in v.INDEX_DTYPES:
        return f"embedding indices dtype {indices.dtype} must be int32 or int64"
    if v.arg(node, 4, "sparse", False):
        return "sparse embedding gradients are not supported"
    return None


@converter(aten.embedding.default, validator=_embedding_ok)
def embedding(ctx: ConversionContext, node: Node, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    weight = ctx.cast(args[0], ctx.node_dtype(node))
    return ctx.network.add_gather(weight, args[1], 0).get_output(0)
