"""Shared test helpers: lower a module through TensorRT for real, check what was delegated, and
(on a machine with CUDA and TensorRT) run the engine and compare with eager PyTorch."""

from __future__ import annotations

import operator
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
from executorch.exir import EdgeCompileConfig, EdgeProgramManager, to_edge_transform_and_lower

from pipeline.delegate import blob
from pipeline.engine.compile_spec import TensorRTCompileSpec
from pipeline.engine.context import ConversionContext
from pipeline.engine.network import define_network
from pipeline.engine.reference.check import KERNEL_TOLERANCE, TOLERANCE
from pipeline.engine.trt_api import trt
from pipeline.lowering.partitioner import TensorRTPartitioner
from pipeline.lowering.report import delegates, engine_of
from pipeline.runtime.engine_runner import EngineRunner, cuda_ready

# Whole-model checks allow what TensorRT's kernels may differ by (TF32-level fp32 convolutions).
MODEL_TOLERANCE = KERNEL_TOLERANCE
GPU = cuda_ready()


def gpu(test: Any) -> Any:
    """A numeric check that only a GPU can make: its own test, marked `gpu`, skipped visibly elsewhere."""
    return pytest.mark.gpu(pytest.mark.skipif(not GPU, reason="needs CUDA and TensorRT")(test))



def lower(module: torch.nn.Module, inputs: Sequence[Any], spec: TensorRTCompileSpec | None = None,
          after: Sequence[Any] = (), dynamic_shapes: Any = None) -> tuple[EdgeProgramManager, TensorRTPartitioner]:
    """Export and lower `module` with TensorRT first, then `after` partitioners."""
    ep = torch.export.export(module.eval(), tuple(inputs), dynamic_shapes=dynamic_shapes)
    partitioner = TensorRTPartitioner(spec)
    edge = to_edge_transform_and_lower(
        ep, partitioner=[partitioner, *after], compile_config=EdgeCompileConfig(_check_ir_validity=False)
    )
    return edge, partitioner


def leftover_ops(edge: EdgeProgramManager, method: str = "forward") -> list[str]:
    """Compute nodes that no delegate took."""
    graph = edge.exported_program(method).graph
    return [
        str(n.target) for n in graph.nodes
        if n.op == "call_function" and n.target is not operator.getitem and "executorch_call_delegate" not in str(n.target)
    ]


def tensorrt_blobs(edge: EdgeProgramManager, method: str = "forward") -> list[bytes]:
    return [m.processed_bytes for m in tensorrt_delegates(edge, method)]


def tensorrt_engines(edge: EdgeProgramManager, method: str = "forward") -> list[tuple[blob.BlobMetadata, bytes]]:
    """(metadata, engine) of each TensorRT delegate of `method`."""
    return [engine_of(m) for m in tensorrt_delegates(edge, method)]


def tensorrt_delegates(edge: EdgeProgramManager, method: str = "forward") -> list[Any]:
    return [m for m in delegates(edge.exported_program(method)) if m.backend_id == blob.BACKEND_ID]


LEGACY_TR01 = Path(__file__).parent / "data" / "legacy_tr01.pte"


def legacy_tr01_case() -> tuple[torch.Tensor, torch.Tensor]:
    """An input of `LEGACY_TR01` (a program written before engines became named data: TR01, its engine
    inline) and what the model it was built from gives for it (tests/data: seed 0, batch 1..16)."""
    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.ReLU()).eval()
    x = torch.randn(5, 8)
    with torch.no_grad():
        ref = module(x)
    assert_not_degenerate(ref)
    return x, ref


def assert_not_degenerate(ref: torch.Tensor) -> None:
    """A reference that is all zeros or constant proves nothing."""
    if ref.dtype == torch.bool:
        assert ref.any() and not ref.all(), "boolean reference is constant"
        return
    r = ref.double()
    assert torch.isfinite(r).all(), "reference has non-finite values"
    assert r.abs().max() > 1e-3, f"reference is ~0 (max |x| = {r.abs().max():.2e})"
    if r.numel() > 1:
        assert r.std() > 1e-4 * r.abs().max(), "reference is constant"


def assert_close(out: torch.Tensor, ref: torch.Tensor, precision: str, table: dict[str, float] = TOLERANCE) -> None:
    """Compare at the tolerance stated for `precision`, scaled by the reference's magnitude."""
    assert out.shape == ref.shape, f"shape {tuple(out.shape)} != reference {tuple(ref.shape)}"
    if ref.dtype == torch.bool or not ref.is_floating_point():
        assert torch.equal(out.cpu(), ref.cpu())
        return
    tol = table[precision]
    scale = ref.abs().max().item()
    torch.testing.assert_close(out.float().cpu(), ref.float().cpu(), atol=tol * scale, rtol=tol)


def run_engines(edge: EdgeProgramManager, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Run the single TensorRT engine of `forward` on the GPU, feeding program inputs by name."""
    ((meta, engine),) = tensorrt_engines(edge)
    names = edge.exported_program().graph_signature.user_inputs
    by_name = dict(zip(names, [x for x in inputs if isinstance(x, torch.Tensor)]))
    runner = EngineRunner(engine, meta.io_bindings)
    out = runner(*[by_name[b.name] for b in meta.inputs])
    torch.cuda.synchronize()
    return _in_program_order(edge, out)


def _in_program_order(edge: EdgeProgramManager, engine_outputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Program outputs are getitems of the delegate call, not necessarily in engine-output order."""
    results = next(n for n in edge.exported_program().graph.nodes if n.op == "output").args[0]
    return [engine_outputs[r.args[1]] for r in results]


def run_reference(edge: EdgeProgramManager, inputs: Sequence[Any], spec: TensorRTCompileSpec) -> list[torch.Tensor]:
    """The program's outputs as the CPU reference executor computes them from the network of its one
    TensorRT engine (`pipeline.engine.reference`), rebuilt from the delegated subgraph as the backend
    builds it; program inputs fed by name, outputs in program order (as `run_engines`)."""
    from pipeline.engine.reference import run_network

    program = edge.exported_program()
    lowered = program.graph_module.lowered_module_0.original_module
    call = next(n for n in program.graph.nodes if "executorch_call_delegate" in str(n.target))
    outer = dict(zip(program.graph_signature.user_inputs, [x for x in inputs if isinstance(x, torch.Tensor)]))
    by_name = {inner: outer[str(arg.name)] for inner, arg in zip(lowered.graph_signature.user_inputs, call.args[1:])}
    builder = trt().Builder(trt().Logger(trt().Logger.ERROR))
    definition = define_network(builder, lowered, spec)
    outs = run_network(definition.network, {b.name: by_name[b.name] for b in definition.bindings if b.is_input},
                       definition.ctx.raw_weights)
    return _in_program_order(edge, [outs[b.name] for b in definition.bindings if not b.is_input])


def assert_engines_checked(program: Any, precision: str = "fp32") -> None:
    """Every engine of a `compile_method` program was checked when built: its network, run by the CPU
    reference executor on the values the example inputs gave it, is within the precision's tolerance
    of its graph run eagerly (`lowering.engine_check`)."""
    from pipeline.runtime.engine_op import is_engine_call

    calls = [n for n in program.graph.nodes if is_engine_call(n)]
    assert calls, "the program has no engine"
    for call in calls:
        found = blob.op_build_info(call.args[2])["reference"]
        assert "max_rel_error" in found and found["max_rel_error"] <= TOLERANCE[precision], found


# Where `check_converter` compares numbers: "cpu" (the reference executor) or "gpu" (the engine).
# tests/tensorrt/converters/conftest.py runs every converter test once each way, the GPU run a test
# of its own, marked `gpu` and skipped visibly without one.
CHECK_ON = "cpu"


def check_converter(module: torch.nn.Module, inputs: Sequence[Any], precision: str = "fp32",
                    dynamic_shapes: Any = None, **spec: Any) -> EdgeProgramManager:
    """Lower a one-op model: everything in one engine, blob parses, and its numbers match eager
    PyTorch at the precision's tolerance: the engine's network run by the CPU reference executor, or
    (`CHECK_ON` "gpu") the engine run by TensorRT."""
    torch.manual_seed(0)
    compile_spec = TensorRTCompileSpec(precision=precision, **spec)
    edge, _ = lower(module, inputs, compile_spec, dynamic_shapes=dynamic_shapes)
    assert leftover_ops(edge) == [], f"not delegated: {leftover_ops(edge)}"
    engines = tensorrt_engines(edge)
    assert len(engines) == 1
    meta, engine = engines[0]
    assert len(engine) > 0 and meta.outputs
    with torch.no_grad():
        ref = module(*inputs)
    refs = list(ref) if isinstance(ref, (tuple, list)) else [ref]
    outs = run_engines(edge, inputs) if CHECK_ON == "gpu" else run_reference(edge, inputs, compile_spec)
    for o, r in zip(outs, refs):
        assert_not_degenerate(r)
        assert_close(o, r, precision)
    return edge


def network_layers(module: torch.nn.Module, x: torch.Tensor, dialect: str = "aten") -> tuple[list[str], ConversionContext]:
    """The layer types of the network made from `module`'s ATen program, or from the Edge subgraph
    that TensorRT claims when lowering (the path `.pte` engines take)."""
    if dialect == "aten":
        program = torch.export.export(module, (x,)).run_decompositions()
    else:
        edge, _ = lower(module, (x,))
        program = edge.exported_program().graph_module.lowered_module_0.original_module
    builder = trt().Builder(trt().Logger(trt().Logger.ERROR))
    definition = define_network(builder, program, TensorRTCompileSpec())
    network = definition.network
    return [str(network.get_layer(i).type) for i in range(network.num_layers)], definition.ctx


def refusal(module: torch.nn.Module, inputs: Sequence[Any], **spec: Any) -> dict[str, str]:
    """Lower with TensorRT only; return {op: reason} of the nodes TensorRT refused."""
    edge, partitioner = lower(module, inputs, TensorRTCompileSpec(**spec))
    return {v["op"]: v["reason"] for v in partitioner.record.refused.values()}


class Fn(torch.nn.Module):
    """A one-op model around a function; `params` become parameters (weights) of the model."""

    def __init__(self, fn: Any, **params: torch.Tensor) -> None:
        super().__init__()
        self.fn = fn
        for name, value in params.items():
            self.register_parameter(name, torch.nn.Parameter(value, requires_grad=False))

    def forward(self, *xs: Any) -> Any:
        return self.fn(self, *xs)


class Mixed(torch.nn.Module):
    """linear -> relu -> [conv1d: XNNPACK or portable] -> linear -> [cumsum: portable] -> tanh, when
    compiled with `MIXED_SPEC`, which keeps convolutions and cumsum out of TensorRT."""

    def __init__(self) -> None:
        super().__init__()
        self.pre = torch.nn.Linear(64, 64)
        self.conv1d = torch.nn.Conv1d(3, 4, 3, padding=1)
        self.fc = torch.nn.Linear(64, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.pre(x.flatten(2)))  # [1, 3, 64]
        h = self.fc(self.conv1d(h) * 2)  # [1, 4, 16]
        return torch.tanh(torch.cumsum(h, dim=-1)) + 1


MIXED_INPUT = torch.randn(1, 3, 8, 8, generator=torch.Generator().manual_seed(3))
MIXED_SPEC = TensorRTCompileSpec(torch_executed_ops=("aten.convolution", "aten.cumsum"))
