"""The compile step's check of each engine it builds: the values the example inputs give every node
of a method (`example_values`), and each engine's network run on its share of them by the CPU
reference executor against its graph run eagerly (`checked`), recorded in the engine's build
statistics (`reference`) and said when it is off."""

from __future__ import annotations

import copy
import logging
from collections.abc import Sequence
from typing import Any

import torch

from pipeline.engine.builder import BuiltEngine
from pipeline.engine.compile_spec import TensorRTCompileSpec
from pipeline.engine.network import GraphSource
from pipeline.engine.reference.check import KERNEL_TOLERANCE, TOLERANCE, check_engine
from pipeline.runtime.engine_runner import EngineRunner, cuda_ready

log = logging.getLogger("pipeline.lowering.compile")


def example_values(gm: torch.fx.GraphModule, calls: Sequence[torch.fx.Node], example_inputs: Sequence[Any],
                   writes: bool = True) -> dict[torch.fx.Node, dict[str, Any]]:
    """Per engine call of `gm`, the value of each of its subgraph's placeholders (by name) on the
    example inputs (where the graph `writes` buffers, a decoder's cache, run on a copy, so they stay
    as they were); none where the graph does not run eagerly here."""
    if not calls:
        return {}
    flat = tuple(torch.utils._pytree.tree_leaves(tuple(example_inputs)))
    needed = {a.name for call in calls for a in call.args if isinstance(a, torch.fx.Node)}
    seen: dict[str, Any] = {}

    class Recorder(torch.fx.Interpreter):  # keeps the engines' arguments only (a decoder's activations are large)
        def run_node(self, n: torch.fx.Node) -> Any:
            out = super().run_node(n)
            if n.name in needed:
                seen[n.name] = out
            return out

    try:
        with torch.no_grad():
            Recorder(copy.deepcopy(gm) if writes else gm).run(*flat)
    except Exception as exc:  # noqa: BLE001 - the model's own graph; the build goes on unchecked
        log.warning("the reference check cannot run the graph eagerly (%s); engines are not checked", type(exc).__name__)
        return {}
    out = {}
    for call in calls:
        sub: torch.fx.GraphModule = getattr(gm, str(call.target))
        placeholders = [n.name for n in sub.graph.nodes if n.op == "placeholder"]
        out[call] = {ph: seen[a.name] for ph, a in zip(placeholders, call.args) if isinstance(a, torch.fx.Node) and a.name in seen}
    return out


def checked(source: GraphSource, spec: TensorRTCompileSpec, sub: torch.fx.GraphModule, values: dict[str, Any] | None,
            label: str, built: BuiltEngine) -> dict[str, Any]:
    """The reference executor's check of one engine (`check_engine`) on the values its placeholders
    had, said when it fails; where this machine has a GPU, the built engine run by TensorRT on the
    same values against it too."""
    placeholders = [n.name for n in sub.graph.nodes if n.op == "placeholder"]
    if not values or any(ph not in values for ph in placeholders):
        return {"skipped": "the example inputs did not reach this engine"}
    found = check_engine(source, spec, sub, [values[ph] for ph in placeholders], _on_gpu(built) if cuda_ready() else None)
    tolerance = TOLERANCE[spec.precision]
    if "skipped" in found:
        log.warning("TensorRT %s: not checked by the reference executor: %s", label, found["skipped"])
    elif not found["max_rel_error"] <= tolerance:
        log.warning("TensorRT %s: its network computes %.3g from its graph run eagerly (relative to the largest output) "
                    "on the CPU reference executor, above %g for %s: a converter built it wrong", label,
                    found["max_rel_error"], tolerance, spec.precision)
    if not found.get("tensorrt_rel_error", 0.0) <= KERNEL_TOLERANCE[spec.precision]:
        log.warning("TensorRT %s: TensorRT's kernels compute %.3g from the reference executor on the same inputs, above "
                    "%g for %s", label, found["tensorrt_rel_error"], KERNEL_TOLERANCE[spec.precision], spec.precision)
    return found


def _on_gpu(built: BuiltEngine) -> Any:
    """The built engine run by TensorRT on the GPU: inputs by name -> outputs by name."""
    def run(feed: dict[str, Any]) -> dict[str, torch.Tensor]:
        runner = EngineRunner(built.engine, built.metadata.io_bindings)
        outs = runner(*[feed[b.name] for b in runner.inputs])
        torch.cuda.synchronize()
        return {b.name: out for b, out in zip(runner.outputs, outs)}

    return run
