"""Evaluate a TensorRT network on the CPU, layer by layer, each once the values it reads exist."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from pipeline.engine.reference import layers, layers_nn  # noqa: F401  (they register their evaluators)
from pipeline.engine.reference.registry import EVALUATORS, ReferenceError, name, torch_dtype
from pipeline.engine.trt_api import trt

__all__ = ["ReferenceError", "run_network"]


def run_network(network: Any, inputs: Mapping[str, torch.Tensor],
                raw_weights: Mapping[str, np.ndarray] | None = None) -> dict[str, torch.Tensor]:
    """The network's outputs, by name, for `inputs` (by network input name): each layer evaluated
    with PyTorch on the CPU, its outputs held in the types the network declares (a float16 network's
    tensors are rounded to float16 after every layer, as TensorRT stores them); floats are computed in
    float32. `raw_weights`: the bytes of constants of types NumPy lacks (`ConversionContext.raw_weights`).
    A value is dropped once no layer will read it.

    Raises:
        ReferenceError: a layer type or attribute the executor does not evaluate, or a missing input.
    """
    values: dict[str, torch.Tensor] = {}
    for i in range(network.num_inputs):
        tensor = network.get_input(i)
        if tensor.name not in inputs:
            raise ReferenceError(f"network input '{tensor.name}' was not given")
        values[tensor.name] = inputs[tensor.name].detach().cpu().to(torch_dtype(tensor.dtype))
    outputs = {network.get_output(i).name for i in range(network.num_outputs)}
    readers = _readers(network)
    raw = dict(raw_weights or {})
    # In the order TensorRT holds them, each layer once all its inputs exist: a layer may be given an
    # input made by a later one (`set_input` after the producer was added).
    pending = list(range(network.num_layers))
    while pending:
        waiting = [i for i in pending if not _evaluated(network.get_layer(i), values, raw, readers, outputs)]
        if len(waiting) == len(pending):
            raise ReferenceError(f"layer '{network.get_layer(waiting[0]).name}' reads a tensor no layer makes")
        pending = waiting
    return {n: values[n] for n in (network.get_output(i).name for i in range(network.num_outputs))}


def _readers(network: Any) -> dict[str, int]:
    """Per tensor, how many layers read it."""
    readers: dict[str, int] = {}
    for i in range(network.num_layers):
        layer = network.get_layer(i)
        for k in range(layer.num_inputs):
            if (x := layer.get_input(k)) is not None:
                readers[x.name] = readers.get(x.name, 0) + 1
    return readers


def _evaluated(layer: Any, values: dict[str, torch.Tensor], raw: dict[str, np.ndarray], readers: dict[str, int],
               outputs: set[str]) -> bool:
    """Evaluate `layer` into `values` if every value it reads exists (then drop those no other layer
    reads); False if one does not yet."""
    given = [layer.get_input(k) for k in range(layer.num_inputs)]
    if any(x is not None and x.name not in values for x in given):
        return False
    kind = name(layer.type)
    if kind not in EVALUATORS:
        raise ReferenceError(f"the reference executor does not evaluate {kind} layers ('{layer.name}'); add it to "
                             "pipeline/engine/reference")
    cls, evaluate = EVALUATORS[kind]
    layer.__class__ = getattr(trt(), cls)
    outs = evaluate(layer, [None if x is None else values[x.name] for x in given], raw)
    for x in given:
        if x is not None:
            readers[x.name] -= 1
            if not readers[x.name] and x.name not in outputs:
                del values[x.name]
    for k, out in enumerate(outs):
        tensor = layer.get_output(k)
        values[tensor.name] = out.to(torch_dtype(tensor.dtype))
    return True
