"""TensorRTCompileSpec: validation with messages that name the field, and lossless encoding."""

import pytest

from pipeline.engine.compile_spec import TensorRTCompileSpec
from pipeline.errors import CompileSpecError

FULL = TensorRTCompileSpec(
    precision="bf16", allow_tf32=False, optimization_level=5, workspace_bytes=1 << 28, min_block_size=3,
    timing_cache_path="/tmp/cache.bin", target_compute_capabilities=("8.9", "12.0"),
    dynamic_shapes={"x": {0: (1, 4, 8), 2: (16, None, 64)}}, max_aux_streams=2, method="decode",
    symbol_ranges={"s0": (1, 2, 3)},
)


def test_round_trip_through_executorch_compile_specs() -> None:
    specs = FULL.to_compile_specs()
    assert all(isinstance(s.value, bytes) for s in specs)
    assert TensorRTCompileSpec.from_compile_specs(specs) == FULL
    assert TensorRTCompileSpec.from_compile_specs(TensorRTCompileSpec().to_compile_specs()) == TensorRTCompileSpec()


@pytest.mark.parametrize("kwargs, message", [
    ({"precision": "int4"}, "precision='int4' is not supported; use one of \\['fp32', 'fp16', 'bf16'\\]"),
    ({"optimization_level": 6}, "optimization_level=6 is outside 0..5"),
    ({"optimization_level": -1}, "optimization_level=-1 is outside 0..5"),
    ({"workspace_bytes": 0}, "workspace_bytes=0 must be a positive integer"),
    ({"min_block_size": 0}, "min_block_size=0 must be an integer >= 1"),
    ({"max_aux_streams": -2}, "max_aux_streams=-2"),
    ({"allow_tf32": "yes"}, "allow_tf32='yes' must be true or false"),
    ({"attention": "flash"}, "attention='flash' is not a form; use one of \\['fused', 'grouped', 'as_written'\\]"),
    ({"target_compute_capabilities": ["sm89"]}, "'sm89' must look like '8.9'"),
    ({"dynamic_shapes": {"x": {0: [8, 4, 16]}}}, r"dynamic_shapes\['x'\]\[0\] = \[8, 4, 16\]: expected min <= opt <= max"),
    ({"dynamic_shapes": {"x": {0: [1, 9, 8]}}}, "expected min <= opt <= max"),
    ({"dynamic_shapes": {"x": {0: [1, 8]}}}, "expected \\[min, opt, max\\]"),
])
def test_rejects_bad_values(kwargs: dict, message: str) -> None:
    with pytest.raises(CompileSpecError, match=message):
        TensorRTCompileSpec(**kwargs)


def test_rejects_unknown_keys() -> None:
    with pytest.raises(CompileSpecError, match="unknown TensorRT compile-spec field"):
        TensorRTCompileSpec.from_mapping({"precison": "fp16"})
