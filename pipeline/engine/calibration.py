"""Calibration of fp8 programs (`compile.quantize.mode=fp8`): the largest magnitude each quantizable
layer's input reaches over a set of example inputs, which sets the scale of that input's fp8 form.

A calibration file is a PyTorch file read weights-only (no pickled code): a list of samples, each a
tensor or a list of tensors in the method's input order, or a map from method name to such a list.
Its inputs must have the method's input count and dtypes; shapes may vary where the method's dims do."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from pipeline.engine.converters.registry import aten_op
from pipeline.engine.quantize import SLOTS
from pipeline.errors import CompileSpecError


def samples(path: str | None, method: str, example_inputs: Sequence[torch.Tensor]) -> list[tuple[torch.Tensor, ...]]:
    """The calibration samples of `method`: those of the file at `path`, or the example inputs alone.

    Raises:
        CompileSpecError: the file is missing, not a weights-only PyTorch file, has no samples for the
            method, or a sample does not match the method's inputs.
    """
    if path is None:
        return [tuple(example_inputs)]
    where = f"compile.quantize.calibration={path!r}"
    if not Path(path).is_file():
        raise CompileSpecError(f"{where}: no such file; name a file saved with torch.save([sample, ...])")
    try:
        data = torch.load(path, weights_only=True, map_location="cpu")
    except Exception as exc:  # noqa: BLE001 - any unreadable file is the same mistake
        raise CompileSpecError(f"{where} is not a PyTorch file of tensors ({type(exc).__name__}); save a list of "
                               "samples with torch.save") from None
    if isinstance(data, dict):
        if method not in data:
            raise CompileSpecError(f"{where} has samples for {sorted(map(str, data))}, not for method {method!r}")
        data = data[method]
    if not isinstance(data, (list, tuple)) or not data:
        raise CompileSpecError(f"{where} must hold a non-empty list of samples (or a map of method -> list)")
    out = [tuple(s) if isinstance(s, (list, tuple)) else (s,) for s in data]
    for i, sample in enumerate(out):
        got = [t.dtype if isinstance(t, torch.Tensor) else type(t).__name__ for t in sample]
        want = [t.dtype for t in example_inputs]
        if got != want:
            raise CompileSpecError(f"{where}: sample {i} has inputs {got}; method {method!r} takes {want}")
    return out


def activation_amax(gm: torch.fx.GraphModule, inputs: Sequence[tuple[torch.Tensor, ...]]) -> dict[str, float]:
    """Parameter name of each quantizable layer's weight -> the largest magnitude of that layer's input
    over `inputs` (`gm` runs on a copy: buffers it writes, a decoder's cache, stay as they were)."""
    amax: dict[str, float] = {}
    module = copy.deepcopy(gm)

    class Recorder(torch.fx.Interpreter):
        def call_function(self, target: Any, args: Any, kwargs: Any) -> Any:
            slots = SLOTS.get(aten_op(target))
            if slots is not None and slots.input is not None and isinstance(args[slots.input], torch.Tensor):
                weight = self._node.args[slots.weight]
                if isinstance(weight, torch.fx.Node) and weight.op == "get_attr":
                    name = str(weight.target)
                    amax[name] = max(amax.get(name, 0.0), float(args[slots.input].detach().abs().max()))
            return super().call_function(target, args, kwargs)

        def run_node(self, n: torch.fx.Node) -> Any:
            self._node = n
            return super().run_node(n)

    with torch.no_grad():
        for sample in inputs:
            Recorder(module).run(*sample)
    return amax
