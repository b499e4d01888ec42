"""One engine's network against the graph it was made from: both run on the same values (the
example inputs as they reach that engine), the network by the reference executor, the graph by eager
PyTorch. What the compile step records for each engine, and the validate step reports on a machine
without a GPU (TensorRT's own kernels are then not run: this checks what the converters built)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from pipeline.engine.compile_spec import TensorRTCompileSpec
from pipeline.engine.network import GraphSource, define_network
from pipeline.engine.reference.registry import ReferenceError
from pipeline.engine.reference.run import run_network
from pipeline.engine.trt_api import trt

# The error each precision allows, relative to the reference's largest magnitude: the converter
# tests' and the compile step's check of every engine (README).
TOLERANCE = {"fp32": 1e-3, "fp16": 1e-2, "bf16": 6e-2}
# What TensorRT's own kernels may differ from the reference by, whole engines and models: TensorRT-RTX's
# fp32 convolutions run at TF32-level error whether or not the TF32 flag is cleared (MobileNetV3-Small
# on the H200: 1.41e-2 either way, fp16 4.2e-3; results/gpu-log.md).
KERNEL_TOLERANCE = {"fp32": 2e-2, "fp16": 2e-2, "bf16": 6e-2}


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    """Largest difference relative to the largest magnitude of `want` (integers and bools: 0 if equal, else 1)."""
    if got.shape != want.shape:
        return float("inf")
    if not want.is_floating_point():
        return 0.0 if torch.equal(got.to(want.dtype), want) else 1.0
    scale = float(want.float().abs().max()) if want.numel() else 0.0
    error = float((got.float() - want.float()).abs().max()) if want.numel() else 0.0
    return error / scale if scale else error


def check_engine(source: GraphSource, spec: TensorRTCompileSpec, module: torch.nn.Module, args: Sequence[Any],
                 engine: Callable[[dict[str, Any]], dict[str, torch.Tensor]] | None = None) -> dict[str, Any]:
    """{"max_rel_error": e, "layers": n}: the engine's network (made from `source` as the build makes
    it) run by the reference executor on `args`, against `module` (the same graph) run eagerly; or
    {"skipped": why} where the executor does not evaluate a layer of it. With `engine` (the built
    engine run by TensorRT: inputs by name -> outputs by name), also "tensorrt_rel_error": TensorRT's
    kernels against the reference executor on the same inputs."""
    placeholders = [n for n in source.graph.nodes if n.op == "placeholder"]
    values = {ph.name: arg for ph, arg in zip(placeholders, args)}
    try:
        definition = define_network(trt().Builder(trt().Logger(trt().Logger.ERROR)), source, spec)
        feed = {b.name: values[b.name] for b in definition.bindings if b.is_input}
        outs = run_network(definition.network, feed, definition.ctx.raw_weights)
    except ReferenceError as exc:
        return {"skipped": str(exc)}
    with torch.no_grad():
        eager = module(*args)
    expected = [x for x in torch.utils._pytree.tree_leaves(eager) if isinstance(x, torch.Tensor)]
    got = [outs[b.name] for b in definition.bindings if not b.is_input]
    errors = [relative_error(g, e) for g, e in zip(got, expected)]
    found = {"max_rel_error": max(errors, default=0.0), "layers": definition.network.num_layers}
    if engine is not None:
        try:
            ran = engine(feed)
        except Exception as exc:  # noqa: BLE001 - TensorRT's runtime on this machine: the build goes on, the record says why
            found["tensorrt_skipped"] = f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0][:200]}"
            return found
        found["tensorrt_rel_error"] = max((relative_error(ran[b.name].cpu(), outs[b.name]) for b in definition.bindings
                                           if not b.is_input), default=0.0)
    return found
