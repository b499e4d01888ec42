"""Every compile-spec field reaches the TensorRT builder: read back from the builder configuration,
the network, the optimization profile, the timing-cache file or the built engine."""

from pathlib import Path

import pytest
import torch
from torch.export import Dim

from pipeline.engine import build_env
from pipeline.engine.builder import build_engine, builder_config, compute_capability_enum, optimization_profiles
from pipeline.engine.compile_spec import TensorRTCompileSpec
from pipeline.engine.network import define_network
from pipeline.engine.trt_api import flavour, trt
from pipeline.errors import CompileSpecError, RuntimeUnavailableError, UnsupportedOperatorError
from pipeline.runtime.engine_runner import EngineRunner, LoadedEngine
from pipeline.runtime.options import RuntimeOptions
from tests.helpers import GPU, Fn, lower, tensorrt_blobs


def _program(dynamic: bool = False) -> torch.export.ExportedProgram:
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.LazyLinear(4))
    x = torch.randn(2, 3, 8, 8)
    model(x)
    shapes = ({0: Dim("batch", min=1, max=32)},) if dynamic else None
    return torch.export.export(model.eval(), (x,), dynamic_shapes=shapes).run_decompositions()


def _config(spec: TensorRTCompileSpec, dynamic: bool = False):  # type: ignore[no-untyped-def]
    builder = trt().Builder(trt().Logger(trt().Logger.ERROR))
    definition = define_network(builder, _program(dynamic), spec)
    return builder, definition, builder_config(builder, spec, definition)


def test_scalar_fields_reach_builder_config(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(build_env.VARIABLE, "0")  # what allow_tf32=false asks of TensorRT-RTX
    spec = TensorRTCompileSpec(allow_tf32=False, optimization_level=1, workspace_bytes=1 << 26, max_aux_streams=3)
    _, _, config = _config(spec)
    t = trt()
    assert config.get_flag(t.BuilderFlag.TF32) is False
    assert config.builder_optimization_level == 1
    assert config.get_memory_pool_limit(t.MemoryPoolType.WORKSPACE) == 1 << 26
    assert config.max_aux_streams == 3
    _, _, default = _config(TensorRTCompileSpec(allow_tf32=True, optimization_level=5))
    assert default.get_flag(t.BuilderFlag.TF32) is True and default.builder_optimization_level == 5


@pytest.mark.skipif(not flavour().is_rtx, reason="TensorRT-RTX's TF32 behaviour")
@pytest.mark.parametrize("value", [None, "1"])
def test_tf32_off_is_refused_where_tensorrt_rtx_would_keep_it(monkeypatch: pytest.MonkeyPatch,
                                                               value: str | None) -> None:
    if value is None:
        monkeypatch.delenv(build_env.VARIABLE, raising=False)
    else:
        monkeypatch.setenv(build_env.VARIABLE, value)
    _config(TensorRTCompileSpec(allow_tf32=True))
    with pytest.raises(CompileSpecError) as err:
        _config(TensorRTCompileSpec(allow_tf32=False))
    said = str(err.value)
    assert said.startswith("compile.allow_tf32=false: TensorRT-RTX ignores the TF32 builder flag"), said
    assert "build and run the program with NVIDIA_TF32_OVERRIDE=0" in said and "\n" not in said, said


@pytest.mark.parametrize("precision, trt_type", [("fp32", "FLOAT"), ("fp16", "HALF"), ("bf16", "BF16")])
def test_precision_reaches_network(precision: str, trt_type: str) -> None:
    _, definition, _ = _config(TensorRTCompileSpec(precision=precision))
    net = definition.network
    t = trt()
    compute = [net.get_layer(i) for i in range(net.num_layers)
               if net.get_layer(i).type in (t.LayerType.CONVOLUTION, t.LayerType.MATRIX_MULTIPLY)]
    assert compute and all(layer.get_output(0).dtype == getattr(t.DataType, trt_type) for layer in compute)
    # Engine I/O keeps the program's dtypes.
    assert net.get_input(0).dtype == t.DataType.FLOAT and net.get_output(0).dtype == t.DataType.FLOAT


def test_dynamic_ranges_reach_profile() -> None:
    spec = TensorRTCompileSpec(symbol_ranges={})
    builder, definition, _ = _config(spec, dynamic=True)
    [profile] = optimization_profiles(builder, definition)
    lo, opt, hi = profile.get_shape(definition.bindings[0].name)
    assert (lo[0], opt[0], hi[0]) == (1, 2, 32) and tuple(lo[1:]) == (3, 8, 8)


def test_compile_spec_ranges_override_export_ranges() -> None:
    program = _program(dynamic=True)
    user_input = program.graph_signature.user_inputs[0]
    sym = str(next(n for n in program.graph.nodes if n.name == user_input).meta["val"].shape[0])
    spec = TensorRTCompileSpec(symbol_ranges={sym: (4, 8, 16)})
    builder = trt().Builder(trt().Logger(trt().Logger.ERROR))
    definition = define_network(builder, program, spec)
    lo, opt, hi = optimization_profiles(builder, definition)[0].get_shape(user_input)
    assert (lo[0], opt[0], hi[0]) == (4, 8, 16)


def test_profiles_narrow_the_dims_they_name() -> None:
    """One engine, one profile per regime: the first holds the whole range, each further profile
    narrows the dims it names (a decoder's one-token decode)."""
    program = _program(dynamic=True)
    user_input = program.graph_signature.user_inputs[0]
    sym = str(next(n for n in program.graph.nodes if n.name == user_input).meta["val"].shape[0])
    spec = TensorRTCompileSpec(profiles=({sym: (1, 1, 1)}, {sym: (16, None, 32)}))
    builder = trt().Builder(trt().Logger(trt().Logger.ERROR))
    definition = define_network(builder, program, spec)
    shapes = [[tuple(s)[0] for s in p.get_shape(user_input)] for p in optimization_profiles(builder, definition)]
    assert shapes == [[1, 2, 32], [1, 1, 1], [16, 16, 32]]
    built = build_engine(program, spec)
    assert built.engine and built.metadata.inputs[0].min_shape[0] == 1 and built.metadata.inputs[0].max_shape[0] == 32


@pytest.mark.gpu
@pytest.mark.skipif(not GPU, reason="needs CUDA and TensorRT")
def test_each_call_runs_on_the_narrowest_profile_that_takes_it() -> None:
    """Two runners of one engine (a prefill and a decode context): each switches to the narrowest
    profile that takes its call's shapes, or the next one where TensorRT does not let two contexts
    hold one profile; results stay right."""
    program = _program(dynamic=True)
    user_input = program.graph_signature.user_inputs[0]
    sym = str(next(n for n in program.graph.nodes if n.name == user_input).meta["val"].shape[0])
    built = build_engine(program, TensorRTCompileSpec(profiles=({sym: (1, 1, 1)},)))
    engine = LoadedEngine(built.engine)
    model = program.module().cuda()
    first, second = (EngineRunner(engine, built.metadata.io_bindings) for _ in range(2))
    for runner, batch, profiles in ((first, 1, {1}), (first, 8, {0}), (first, 1, {1}), (second, 8, {0}),
                                    (second, 1, {0, 1}), (second, 3, {0})):
        x = torch.randn(batch, 3, 8, 8, device="cuda")
        (out,) = runner(x)
        torch.testing.assert_close(out, model(x), rtol=1e-3, atol=1e-3)
        assert runner.profile in profiles, (batch, runner.profile)


def test_a_profile_outside_the_range_is_one_line() -> None:
    program = _program(dynamic=True)
    user_input = program.graph_signature.user_inputs[0]
    sym = str(next(n for n in program.graph.nodes if n.name == user_input).meta["val"].shape[0])
    builder = trt().Builder(trt().Logger(trt().Logger.ERROR))
    with pytest.raises(CompileSpecError, match=r"profiles\[0\] gives input .* the range \[1..64, 3, 8, 8\], which is not "
                                               r"inside its range \[1..32, 3, 8, 8\]"):
        define_network(builder, program, TensorRTCompileSpec(profiles=({sym: (1, None, 64)},)))


def test_partitioner_maps_input_ranges_to_engine_profile() -> None:
    batch = Dim("batch", min=1, max=64)
    spec = TensorRTCompileSpec(dynamic_shapes={"xs_0": {0: (2, 6, 10)}})
    edge, _ = lower(Fn(lambda m, x: torch.relu(x) * 2), (torch.randn(4, 3),), spec, dynamic_shapes=(({0: batch},),))
    from pipeline.delegate import blob

    assert blob.decode(tensorrt_blobs(edge)[0])[0].inputs[0].shape == (-1, 3)
    with pytest.raises(CompileSpecError, match="names input 'y', but the program's inputs are"):
        lower(Fn(lambda m, x: x * 2), (torch.randn(4, 3),), TensorRTCompileSpec(dynamic_shapes={"y": {0: (1, 2, 3)}}),
              dynamic_shapes=(({0: batch},),))


def test_timing_cache_is_written_and_reused(tmp_path: Path) -> None:
    cache = tmp_path / "sub" / "timing.cache"
    spec = TensorRTCompileSpec(timing_cache_path=str(cache))
    build_engine(_program(), spec)
    first = cache.read_bytes()
    assert len(first) > 0
    _, _, config = _config(spec)
    assert config.get_timing_cache() is not None and len(bytes(config.get_timing_cache().serialize())) >= len(first) // 2


@pytest.mark.skipif(not flavour().is_rtx, reason="compute-capability targets are a TensorRT-RTX feature")
def test_target_compute_capabilities_reach_config() -> None:
    _, _, config = _config(TensorRTCompileSpec(target_compute_capabilities=("8.9", "12.0")))
    assert config.num_compute_capabilities == 2
    assert config.get_compute_capability(0) == trt().ComputeCapability.SM89
    assert config.get_compute_capability(1) == trt().ComputeCapability.SM120
    with pytest.raises(CompileSpecError, match="allowed"):
        compute_capability_enum("1.0")


def test_min_block_size_reaches_partitioner() -> None:
    model = Fn(lambda m, x: torch.relu(x) * 2 + 1)
    # relu, mul, add, and two casts that turn the scalars into tensors: five operators.
    edge, part = lower(model, (torch.randn(3, 3),), TensorRTCompileSpec(min_block_size=6))
    assert tensorrt_blobs(edge) == []
    assert any("min_block_size=6" in r["reason"] for r in part.record.refused.values())
    edge, _ = lower(model, (torch.randn(3, 3),), TensorRTCompileSpec(min_block_size=5))
    assert len(tensorrt_blobs(edge)) == 1


def test_build_engine_refuses_unsupported_graph() -> None:
    program = torch.export.export(Fn(lambda m, x: torch.atan2(x, x + 1)), (torch.randn(4),)).run_decompositions()
    with pytest.raises(UnsupportedOperatorError, match="no TensorRT converter for aten.atan2"):
        build_engine(program, TensorRTCompileSpec())


def test_engine_records_build_time_and_layers() -> None:
    built = build_engine(_program(), TensorRTCompileSpec())
    assert built.build_seconds > 0 and built.num_layers > 3 and len(built.engine) > 1000


def test_unbounded_dynamic_dim_is_a_clear_error() -> None:
    with pytest.raises(CompileSpecError, match="has no upper bound; give torch.export Dim a max="):
        lower(Fn(lambda m, x: x * 2), (torch.randn(4, 3),), dynamic_shapes=(({0: Dim("batch")},),))


@pytest.mark.gpu
@pytest.mark.skipif(not GPU, reason="needs CUDA and TensorRT")
def test_engine_tensorrt_cannot_read_is_one_clear_error() -> None:
    """Bytes that are no engine for this TensorRT and GPU (another version's, another GPU's, or
    damaged past the blob's checks): the error names the toolchain and this GPU's capability."""
    major, minor = torch.cuda.get_device_capability()
    with pytest.raises(RuntimeUnavailableError, match=rf"could not deserialize the engine .* without this GPU's "
                                                      rf"{major}\.{minor} \(compile.target_compute_capabilities\)"):
        LoadedEngine(b"\x00" * 4096)


@pytest.mark.gpu
@pytest.mark.skipif(not GPU, reason="needs CUDA and TensorRT")
def test_an_address_tensorrt_refuses_is_an_error_not_the_last_input() -> None:
    """An input 4 bytes past an aligned address (a slice of a larger tensor), after an aligned one:
    the engine reads it (the right answer) or the runner says TensorRT refused it; never the
    previous call's input, which TensorRT would keep bound."""
    program = _program()
    built = build_engine(program, TensorRTCompileSpec())
    runner = EngineRunner(built.engine, built.metadata.io_bindings)
    model = program.module().cuda()
    aligned = torch.randn(2, 3, 8, 8, device="cuda")
    runner(aligned)
    shifted = torch.randn(2 * 3 * 8 * 8 + 1, device="cuda")[1:].view(2, 3, 8, 8)
    assert shifted.is_contiguous() and shifted.data_ptr() % 256 == 4
    try:
        (out,) = runner(shifted)
    except RuntimeUnavailableError as exc:
        assert "did not take the address of engine tensor" in str(exc)
    else:
        torch.cuda.synchronize()
        torch.testing.assert_close(out, model(shifted), rtol=1e-2, atol=1e-2)


@pytest.mark.gpu
@pytest.mark.skipif(not GPU, reason="needs CUDA and TensorRT")
def test_runtime_cache_is_shared_by_engines_and_written_back(tmp_path: Path) -> None:
    """Every engine of a process compiles its kernels into the one cache of `runtime_cache_path`;
    `save_runtime_caches` (run at exit) writes it, and a later runner starts from it."""
    from pipeline.runtime import engine_runner

    path = str(tmp_path / "kernels.bin")
    options = RuntimeOptions(runtime_cache_path=path)
    program = _program(dynamic=False)
    built = build_engine(program, TensorRTCompileSpec())
    x = torch.randn(2, 3, 8, 8, device="cuda")
    first, second = (EngineRunner(LoadedEngine(built.engine), built.metadata.io_bindings, options) for _ in range(2))
    for runner in (first, second):
        torch.testing.assert_close(runner(x)[0], program.module().cuda()(x), rtol=1e-3, atol=1e-3)
    assert len(engine_runner._RUNTIME_CACHES) == 1
    engine_runner.save_runtime_caches()
    assert Path(path).stat().st_size > 0


@pytest.mark.gpu
@pytest.mark.skipif(not GPU, reason="needs CUDA and TensorRT")
def test_a_runtime_cache_path_that_holds_another_file_is_refused_and_kept(tmp_path: Path) -> None:
    """The runtime cache is replaced at exit: a path holding a user's file (TensorRT-RTX does not read
    it as a cache) is refused when the first engine starts, and the file stays as it was (issue 56)."""
    from pipeline.runtime import engine_runner

    mine = tmp_path / "notes.txt"
    mine.write_text("mine")
    built = build_engine(_program(dynamic=False), TensorRTCompileSpec())
    options = RuntimeOptions(runtime_cache_path=str(mine))
    with pytest.raises(RuntimeUnavailableError, match="holds a file that is not the cache the build writes there"):
        EngineRunner(LoadedEngine(built.engine), built.metadata.io_bindings, options)(torch.randn(2, 3, 8, 8, device="cuda"))
    engine_runner.save_runtime_caches()
    assert mine.read_text() == "mine"
