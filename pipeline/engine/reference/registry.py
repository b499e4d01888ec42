"""The one registry of layer evaluators (`evaluates`), the TensorRT-to-torch dtype table they share,
and the helpers every evaluator uses to read a layer's attributes."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from pipeline.engine.context import trt_to_torch
from pipeline.engine.trt_api import trt
from pipeline.errors import PipelineError


class ReferenceError(PipelineError, ValueError):
    """The reference executor met a layer (or an attribute of one) it does not evaluate."""


# A layer's input values, None for an input not set.
Values = list[torch.Tensor | None]
# An evaluator: (the layer, cast to its class; its input values; the raw bytes of constants NumPy
# lacks) -> its output values.
Evaluator = Callable[[Any, Values, dict[str, np.ndarray]], Sequence[torch.Tensor]]
EVALUATORS: dict[str, tuple[str, Evaluator]] = {}  # LayerType name -> (its class name, evaluator)


def evaluates(kind: str, cls: str) -> Callable[[Evaluator], Evaluator]:
    """Register the evaluator of layer type `kind` (a `trt.LayerType` name), whose layers are `cls`."""
    def register(fn: Evaluator) -> Evaluator:
        assert kind not in EVALUATORS, kind
        EVALUATORS[kind] = (cls, fn)
        return fn
    return register


def torch_dtype(dtype: Any) -> torch.dtype:
    """The torch dtype a TensorRT tensor type is evaluated in (int4 values held in int8)."""
    t = trt()
    if dtype == t.fp8:
        return torch.float8_e4m3fn
    if dtype == t.int4:
        return torch.int8
    return trt_to_torch(dtype)


def dims(value: Any) -> list[int]:
    """A `trt.Dims` (or shape sequence) as a list of ints."""
    return [int(d) for d in value]


def axes_of(mask: int, rank: int) -> list[int]:
    """The axes a TensorRT axis bitmask names."""
    return [a for a in range(rank) if mask >> a & 1]


def name(enum_value: Any) -> str:
    """An enum value's member name (`ElementWiseOperation.SUM` -> "SUM")."""
    return str(enum_value).rpartition(".")[2]


def wide(x: torch.Tensor) -> torch.Tensor:
    """`x` widened for computing: floats in float32, integers in int64, bools as they are."""
    if x.is_floating_point():
        return x.to(torch.float32)
    return x if x.dtype == torch.bool else x.to(torch.int64)


def unknown(layer: Any, what: str, value: Any) -> ReferenceError:
    return ReferenceError(f"the reference executor does not evaluate {name(layer.type)} layer '{layer.name}' with "
                          f"{what} {value}; add it to pipeline/engine/reference")
