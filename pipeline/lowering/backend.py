"""`TensorRTBackend`: ExecuTorch's `preprocess` for TensorRT. It builds one engine per delegated
subgraph with the converter registry (or takes the compile step's prebuilt engine), puts the engine
into the program's named data and returns the blob that names it (see `blob.py`)."""

from __future__ import annotations

import dataclasses
from typing import final

from executorch.exir.backend.backend_details import BackendDetails, PreprocessResult
from executorch.exir.backend.compile_spec_schema import CompileSpec
from torch.export import ExportedProgram

from pipeline.delegate import blob
from pipeline.engine import quantize
from pipeline.engine.builder import build_engine, profile_count
from pipeline.engine.compile_spec import TensorRTCompileSpec
from pipeline.engine.converters.tensor_copy import register_dim_order_ops
from pipeline.engine.network import graph_source
from pipeline.errors import BlobFormatError
from pipeline.executorch_api import NamedDataStore
from pipeline.lowering.plans import build_plan
from pipeline.runtime.engine_op import is_engine_call

register_dim_order_ops()  # Edge programs hold ExecuTorch's dim-order copies, loaded with it above


@final
class TensorRTBackend(BackendDetails):
    """Builds TensorRT engines for ExecuTorch delegates (backend id "TensorRTBackend")."""

    @staticmethod
    def preprocess(edge_program: ExportedProgram, compile_specs: list[CompileSpec]) -> PreprocessResult:
        """Build the engine of one partition.

        Returns:
            The delegate blob; `_delegate_info_meta` carries build statistics for the lowering report.
        Raises:
            CompileSpecError, UnsupportedOperatorError, EngineBuildError.
        """
        spec = TensorRTCompileSpec.from_compile_specs(compile_specs)
        store = NamedDataStore()  # a `.pte` segment, or the `.ptd` (`export.write_program` decides)
        planned = build_plan(edge_program)
        if planned is not None:  # engines and the project's kernels: one delegate running them in turn
            payload, data, stats = planned
            for key, value in data.items():
                store.add_named_data(key, value, alignment=blob.ALIGN)
            return PreprocessResult(processed_bytes=payload, data_store_output=store.get_named_data_store_output(),
                                    _delegate_info_meta={**stats, "prebuilt": True})
        prebuilt = prebuilt_engine(edge_program)
        if prebuilt is not None:
            engine, meta, info = prebuilt
        else:
            built = build_engine(edge_program, spec, label=f"engine for method {spec.method or 'forward'!r}")
            engine, meta = built.engine, built.metadata
            info = {"build_seconds": built.build_seconds, "num_layers": built.num_layers,
                    "profiles": profile_count(meta, spec),
                    "quantized": quantize.plan(graph_source(edge_program), spec.quantize).summary()}
        ref = blob.EngineRef.of(engine)
        store.add_named_data(ref.key, engine, alignment=blob.ALIGN)
        return PreprocessResult(processed_bytes=blob.encode(ref, meta), data_store_output=store.get_named_data_store_output(),
                                _delegate_info_meta={**info, "engine_bytes": ref.size})


def prebuilt_engine(program: ExportedProgram) -> tuple[bytes, blob.BlobMetadata, dict[str, object]] | None:
    """The engine, metadata and build statistics of a partition that is one prebuilt engine call,
    or None for a graph of ops. Bindings are reordered into delegate-argument order (the
    partition's inputs and outputs).

    Raises:
        BlobFormatError: the partition does not pass each engine input and output exactly once.
    """
    calls = [n for n in program.graph.nodes if is_engine_call(n)]
    if not calls:
        return None
    (call,) = calls
    inputs, engine_node, metadata = call.args
    meta, _ = blob.decode_op_metadata(metadata)
    sources = graph_source(program).constants
    engine = sources[engine_node.name]
    if engine is None:
        raise BlobFormatError(f"engine call {call.name} reads its engine from a runtime input, not a program constant")
    user_inputs = list(program.graph_signature.user_inputs)
    out_node = next(n for n in program.graph.nodes if n.op == "output")
    outputs = [n.args[1] for n in out_node.args[0]]
    names = [n.name for n in inputs]
    if sorted(set(names)) != sorted(user_inputs) or len(names) != len(user_inputs) or sorted(outputs) != list(
        range(len(meta.outputs))
    ):
        raise BlobFormatError(
            f"engine call {call.name} must take each delegate input once and return every output once; "
            f"got inputs {names} for {user_inputs} and outputs {outputs}"
        )
    bindings = (*[meta.inputs[names.index(u)] for u in user_inputs], *[meta.outputs[i] for i in outputs])
    out_meta = dataclasses.replace(meta, io_bindings=bindings)
    return engine.cpu().numpy().tobytes(), out_meta, {**blob.op_build_info(metadata), "prebuilt": True}


assert TensorRTBackend.__name__ == blob.BACKEND_ID  # ExecuTorch finds backends by class name
