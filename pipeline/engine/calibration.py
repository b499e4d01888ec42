"""Calibration of fp8 programs (`compile.quantize.mode=fp8`): the largest magnitude each quantizable
layer's input reaches over a set of example inputs, which sets the scale of that input's fp8 form.

A calibration file is a PyTorch file read weights-only (no pickled code): a list of samples, each a
tensor or a list of tensors in the method's input order, or a map from method name to such a list.
Its inputs must have the method's input count and dtypes; shapes may vary where the method's dims do."""

from __future__ import annotations

import copy
import io
import logging
import math
from collections.abc import Sequence
from typing import Any

import torch

from pipeline.engine.converters.registry import aten_op
from pipeline.engine.quantize import SLOTS
from pipeline.errors import CompileSpecError
from pipeline.files import read_regular

log = logging.getLogger(__name__)

LIMIT = 1 << 32  # bytes of a calibration file
# The largest magnitude a calibration input, or a layer input it gives, may have: float16's range.
# Beyond it an fp8 scale (amax / 448) stands for values no fp16 engine holds: a sample of 1e30 once
# gave a scale of 2e27 and a normal-looking build.
VALUE_MAX = 65504.0


def samples(path: str | None, method: str, example_inputs: Sequence[torch.Tensor],
            shapes: Sequence[tuple[int | None, ...]] | None = None) -> list[tuple[torch.Tensor, ...]]:
    """The calibration samples of `method`: those of the file at `path`, or the example inputs alone.
    `shapes`: per input, each dim's size, None where the method's dim is dynamic (default: the
    example inputs' shapes).

    Raises:
        CompileSpecError: the file is missing, not a regular file of at most `LIMIT` bytes, not a
            weights-only PyTorch file, has no samples for the method, or a sample does not match the
            method's inputs (count, dtypes, ranks, static dims) or holds a value that is not finite or
            beyond `VALUE_MAX`.
    """
    if path is None:
        return [tuple(example_inputs)]
    where = f"compile.quantize.calibration={path!r}"
    data = read_regular(path, "compile.quantize.calibration", LIMIT, CompileSpecError)
    try:
        loaded = torch.load(io.BytesIO(data), weights_only=True, map_location="cpu")
    except Exception as exc:  # noqa: BLE001 - any unreadable file is the same mistake
        raise CompileSpecError(f"{where} is not a PyTorch file of tensors ({type(exc).__name__}); save a list of "
                               "samples with torch.save") from None
    if isinstance(loaded, dict):
        if method not in loaded:
            raise CompileSpecError(f"{where} has samples for {sorted(map(str, loaded))}, not for method {method!r}")
        loaded = loaded[method]
    if not isinstance(loaded, (list, tuple)) or not loaded:
        raise CompileSpecError(f"{where} must hold a non-empty list of samples (or a map of method -> list)")
    out = [tuple(s) if isinstance(s, (list, tuple)) else (s,) for s in loaded]
    want = [t.dtype for t in example_inputs]
    dims = list(shapes) if shapes is not None else [tuple(t.shape) for t in example_inputs]
    for i, sample in enumerate(out):
        got = [t.dtype if isinstance(t, torch.Tensor) else type(t).__name__ for t in sample]
        if got != want:
            raise CompileSpecError(f"{where}: sample {i} has inputs {got}; method {method!r} takes {want}")
        for k, (t, shape) in enumerate(zip(sample, dims)):
            if len(t.shape) != len(shape) or any(d is not None and d != n for d, n in zip(shape, t.shape)):
                shown = "[" + ", ".join("*" if d is None else str(d) for d in shape) + "]"
                raise CompileSpecError(f"{where}: sample {i} input {k} has shape {list(t.shape)}; method {method!r} takes "
                                       f"{shown} (* where its dims vary)")
            if t.is_floating_point() and t.numel() and not bool(t.abs().le(VALUE_MAX).all()):  # NaN fails le too
                raise CompileSpecError(f"{where}: sample {i} input {k} holds NaN, inf or a magnitude beyond {VALUE_MAX:g}; "
                                       "calibrate with inputs the model really takes")
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
                    seen = float(args[slots.input].detach().abs().amax()) if args[slots.input].numel() else 0.0
                    amax[name] = seen if math.isnan(seen) else max(amax.get(name, 0.0), seen)  # a NaN stays seen
            return super().call_function(target, args, kwargs)

        def run_node(self, n: torch.fx.Node) -> Any:
            self._node = n
            return super().run_node(n)

    with torch.no_grad():
        for i, sample in enumerate(inputs):
            try:
                Recorder(module).run(*sample)
            except Exception as exc:  # noqa: BLE001 - the method's own error on this sample
                reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
                raise CompileSpecError(f"calibration sample {i} does not run through the method ({reason}); give "
                                       "samples of the shapes and values the method takes") from None
    for name, value in amax.items():
        if not value <= VALUE_MAX:  # NaN and inf too
            raise CompileSpecError(f"calibration gives the input of the layer of {name!r} a largest magnitude of {value:g}, "
                                   f"no scale for fp8 (it must be finite and at most {VALUE_MAX:g}); calibrate with "
                                   "samples that reach that layer with the values the model really takes")
        if value == 0.0:
            log.warning("calibration never gives the layer of %r a non-zero input: its fp8 input scale is a guess; "
                        "calibrate with samples that reach it", name)
    return amax
