"""`TensorRTBackend`: ExecuTorch's `preprocess` for TensorRT. It builds one engine per delegated
subgraph with the converter registry and returns the blob (see `blob.py`)."""

from __future__ import annotations

from typing import final

from executorch.exir.backend.backend_details import BackendDetails, PreprocessResult
from executorch.exir.backend.compile_spec_schema import CompileSpec
from torch.export import ExportedProgram

from pipeline.tensorrt import blob
from pipeline.tensorrt.builder import build_engine
from pipeline.tensorrt.compile_spec import TensorRTCompileSpec


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
        label = f"engine for method {spec.method or 'forward'!r}"
        built = build_engine(edge_program, spec, label=label)
        payload = blob.encode(built.engine, built.metadata)
        info = {"build_seconds": built.build_seconds, "num_layers": built.num_layers, "engine_bytes": len(built.engine)}
        return PreprocessResult(processed_bytes=payload, _delegate_info_meta=info)


assert TensorRTBackend.__name__ == blob.BACKEND_ID  # ExecuTorch finds backends by class name
