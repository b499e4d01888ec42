"""The ONNX parser's engine of a suite model, which `bench/coverage_gpu.py` and
`bench/experiments/plan_compare.py` measure ours against: exported with the TorchScript exporter
(opset 17), parsed by TensorRT's `OnnxParser`, built with the same builder settings as ours."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from pipeline.coverage.run import entry_config
from pipeline.coverage.suite import Entry
from pipeline.files import write_bytes, write_json


def build_engine(entry: Entry, precision: str, overrides: tuple[str, ...], folder: Path) -> None:
    """Export the suite model to ONNX (TorchScript exporter, opset 17) and build the ONNX parser's
    engine with our builder settings (`builder_config` of the build's compile spec; below fp32 the
    model is cast, as TensorRT-RTX builds strongly typed networks); writes `onnx.engine` or
    `onnx.error` in the model's folder."""
    import torch

    from pipeline.config import objects
    from pipeline.engine.builder import builder_config
    from pipeline.engine.trt_api import trt

    target = folder / "onnx.engine"
    if target.exists():
        return
    folder.mkdir(parents=True, exist_ok=True)
    try:
        cfg = entry_config(entry, precision, overrides)
        model = objects.model(cfg)
        inputs = objects.example_inputs(cfg.model.methods["forward"], 0)
        if precision != "fp32":
            dtype = torch.float16 if precision == "fp16" else torch.bfloat16
            model = model.to(dtype)
            inputs = tuple(x.to(dtype) if x.is_floating_point() else x for x in inputs)
        path = folder / "model.onnx"
        torch.onnx.export(model, inputs, str(path), dynamo=False, opset_version=17, input_names=["x"])
        t = trt()
        logger = t.Logger(t.Logger.ERROR)
        builder = t.Builder(logger)
        network = builder.create_network(0)
        parser = t.OnnxParser(network, logger)
        if not parser.parse_from_file(str(path)):
            raise RuntimeError("; ".join(str(parser.get_error(i)) for i in range(parser.num_errors)))
        start = time.perf_counter()
        engine = builder.build_serialized_network(network, builder_config(builder, objects.compile_spec(cfg, "forward")))
        if engine is None:
            raise RuntimeError("the ONNX parser's network did not build")
        write_json(folder / "onnx.json", {"build_s": round(time.perf_counter() - start, 2)})
        write_bytes(target, bytes(engine))
        path.unlink()
        for extra in folder.glob("*.onnx*"):
            extra.unlink()
    except Exception as exc:  # recorded; the suite goes on
        write_bytes(folder / "onnx.error", f"{type(exc).__name__}: {str(exc).strip()[:300]}".encode())


def runner(engine: bytes, stream: Any) -> Any:
    """An `EngineRunner` of the parser's engine, as a CUDA graph on `stream` (`runner.dtype`: its input dtype)."""
    import torch

    from pipeline.delegate.blob import IOBinding
    from pipeline.engine.trt_api import trt
    from pipeline.runtime.engine_runner import EngineRunner
    from pipeline.runtime.options import RuntimeOptions

    t = trt()
    probe = t.Runtime(t.Logger(t.Logger.ERROR)).deserialize_cuda_engine(engine)
    bindings = []
    for i in range(probe.num_io_tensors):
        tensor = probe.get_tensor_name(i)
        dtype = {t.DataType.FLOAT: torch.float32, t.DataType.HALF: torch.float16, t.DataType.BF16: torch.bfloat16,
                 t.DataType.INT64: torch.int64, t.DataType.INT32: torch.int32}[probe.get_tensor_dtype(tensor)]
        bindings.append(IOBinding.of(tensor, dtype, tuple(probe.get_tensor_shape(tensor)),
                                     probe.get_tensor_mode(tensor) == t.TensorIOMode.INPUT))
    runner = EngineRunner(engine, bindings, RuntimeOptions(cuda_graph=True), stream)
    runner.dtype = bindings[0].torch_dtype  # type: ignore[attr-defined]
    return runner
