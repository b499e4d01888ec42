"""pipeline.runtime: equal to ExecuTorch's own runtime on CPU for every zoo model and method;
clear errors for what it cannot run; on a GPU, zoo .pte files built with TensorRT match eager."""

import contextlib
from pathlib import Path
from typing import Any

import pytest
import torch
from executorch.exir import to_edge_transform_and_lower

from pipeline.config import objects
from pipeline.config.compose import compose, typed
from pipeline.errors import ArtifactError, InputError, RuntimeUnavailableError
from pipeline.lowering.serialize import write_program
from pipeline.runtime import load
from pipeline.runtime.options import RuntimeOptions
from pipeline.steps import run_all
from tests.helpers import GPU, LEGACY_TR01, MODEL_TOLERANCE, assert_close, assert_not_degenerate, legacy_tr01_case

ZOO = ["mlp", "mobilenet_v3_small", "resnet18", "tiny_decoder"]


def _cfg(*overrides: str) -> dict[str, Any]:
    return typed(compose(list(overrides)))  # type: ignore[return-value]


def _methods(model: str) -> list[tuple[str, str]]:
    return [(model, m) for m in _cfg(f"model={model}").model.methods]


@pytest.mark.parametrize("model, method", [mm for model in ZOO for mm in _methods(model)])
def test_equals_executorch_runtime_on_cpu(model: str, method: str, tmp_path: Path) -> None:
    cfg = _cfg(f"model={model}")
    spec = cfg.model.methods[method]
    module = objects.method_module(objects.model(cfg), spec)
    inputs = objects.example_inputs(spec, 0)
    ep = torch.export.export(module, inputs, dynamic_shapes=objects.dynamic_shapes(spec))
    path = tmp_path / "p.pte"
    write_program(to_edge_transform_and_lower(ep), path)  # with the pipeline's record, which ExecuTorch loads too
    from executorch.runtime import Runtime  # ExecuTorch's own runtime: CPU only, absent on the GPU machine

    ours = load(path).method("forward").execute(list(inputs))
    theirs = Runtime.get().load_program(path).load_method("forward").execute(list(inputs))
    assert len(ours) == len(theirs)
    for a, b in zip(ours, theirs):
        assert_not_degenerate(b)
        # PyTorch's and ExecuTorch's portable kernels round differently (e.g. convolution order of
        # accumulation): equal up to 1e-5 of the output's scale.
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5 * b.abs().max().item())


def test_lists_methods_and_io(tmp_path: Path) -> None:
    files = run_all(_cfg("model=tiny_decoder"), tmp_path)
    program = load(files["pte"])
    assert set(program.method_names) == {"prefill", "decode"}
    if not GPU:
        with pytest.raises(RuntimeUnavailableError, match="run on a CUDA GPU; this machine has none"):
            program.method("prefill")


def test_refuses_other_delegates(tmp_path: Path) -> None:
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

    ep = torch.export.export(torch.nn.Linear(4, 4), (torch.randn(2, 4),))
    path = tmp_path / "x.pte"
    write_program(to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()]), path)
    with pytest.raises(RuntimeUnavailableError, match="XnnpackBackend delegate.*executorch.runtime"):
        load(path).method("forward")


def test_reads_external_tensor_data(tmp_path: Path) -> None:
    ep = torch.export.export(torch.nn.Linear(4, 3), (torch.randn(2, 4),))
    files = write_program(to_edge_transform_and_lower(ep), tmp_path / "p.pte", external_data=True)
    ptd = files["ptd"]
    x = torch.randn(2, 4)
    with pytest.raises(ArtifactError, match="keeps its tensor data in a .ptd file"):
        load(tmp_path / "p.pte")
    out = load(tmp_path / "p.pte", ptd).method("forward").execute([x])[0]
    from pipeline.executorch_api import load_module

    theirs = load_module(str(tmp_path / "p.pte"), str(ptd)).forward([x])[0]
    assert torch.allclose(out, theirs, atol=1e-6)


def test_engine_only_methods_read_inputs_in_place_while_their_address_holds(tmp_path: Path) -> None:
    """Methods of engine calls alone (here: none at all, so the output is the input) read the caller's
    tensor itself; under CUDA graphs only while the caller keeps its buffer, else a copy in planned
    memory, whose address then stays put."""

    class Identity(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x

    path = tmp_path / "id.pte"
    write_program(to_edge_transform_and_lower(torch.export.export(Identity(), (torch.randn(2, 4),))), path)
    x, y = torch.randn(2, 4), torch.randn(2, 4)

    def read_from(method: Any, t: torch.Tensor) -> int:
        out = method.execute([t], copy_outputs=False)[0]
        assert torch.equal(out, t)
        return out.data_ptr()

    graph = load(path, options=RuntimeOptions(cuda_graph=True)).method("forward")
    assert read_from(graph, x) == read_from(graph, x) == x.data_ptr()
    planned = read_from(graph, y)
    assert planned != y.data_ptr() and read_from(graph, x) == planned
    assert read_from(graph, x.double().float()) == planned  # a new buffer: still the planned copy
    plain = load(path).method("forward")
    assert [read_from(plain, t) for t in (x, y, x)] == [x.data_ptr(), y.data_ptr(), x.data_ptr()]
    with pytest.raises(InputError, match="dtype float64"):  # another dtype: refused, never cast
        plain.execute([x.double()], copy_outputs=False)


# ---- on the GPU ----------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("precision, serialize", [("fp32", "default"), ("fp16", "external")])
@pytest.mark.parametrize("model", ZOO)
def test_zoo_pte_matches_eager_on_gpu(model: str, precision: str, serialize: str, tmp_path: Path) -> None:
    """Engines as `.pte` segments (fp32) and in the `.ptd` (fp16), deserialized from the mapped file."""
    cfg = _cfg(f"model={model}", f"compile.precision={precision}", f"serialize={serialize}")
    files = run_all(cfg, tmp_path)
    assert ("ptd" in files) == (serialize == "external")
    program = load(files["pte"], files.get("ptd"))
    module = objects.model(cfg)
    for method, spec in cfg.model.methods.items():
        inputs = objects.example_inputs(spec, 1)
        outs = program.method(method).execute(list(inputs))
        with torch.no_grad():
            refs = getattr(module, spec.function)(*inputs)
        refs = list(refs) if isinstance(refs, (tuple, list)) else [refs]
        for out, ref in zip(outs, refs):
            assert_not_degenerate(ref)
            assert out.is_cuda
            assert_close(out, ref, precision, MODEL_TOLERANCE)


@pytest.mark.gpu
@pytest.mark.parametrize("size", [1, 8, 64])
def test_dynamic_batch_min_opt_max_on_gpu(size: int, tmp_path: Path) -> None:
    cfg = _cfg("model=mlp")
    files = run_all(cfg, tmp_path)
    method = load(files["pte"]).method("forward")
    x = torch.randn(size, 64)
    with torch.no_grad():
        ref = objects.model(cfg)(x)
    assert_close(method.execute([x])[0], ref, "fp32")


@pytest.mark.gpu
@pytest.mark.parametrize("cache", [1, 8, 100])
def test_decoder_cache_lengths_on_gpu(cache: int, tmp_path: Path) -> None:
    cfg = _cfg("model=tiny_decoder")
    files = run_all(cfg, tmp_path)
    method = load(files["pte"]).method("decode")
    module = objects.model(cfg)
    step = (torch.tensor([[3]]), torch.tensor([cache]), torch.randn(2, 1, 4, cache, 16), torch.randn(2, 1, 4, cache, 16))
    with torch.no_grad():
        refs = module.decode(*step)
    for out, ref in zip(method.execute(list(step)), refs):
        assert_close(out, ref, "fp32", MODEL_TOLERANCE)


@pytest.mark.gpu
@pytest.mark.parametrize("cuda_graph", [False, True])
def test_repeated_calls_new_inputs_and_streams_on_gpu(cuda_graph: bool, tmp_path: Path) -> None:
    """Calls with new inputs, other shapes and from either stream each give fresh, right answers;
    outputs handed out earlier stay intact and the caller's inputs are never written."""
    cfg = _cfg("model=mlp")
    files = run_all(cfg, tmp_path)
    method = load(files["pte"], options=RuntimeOptions(cuda_graph=cuda_graph)).method("forward")
    module = objects.model(cfg)
    kept = []
    for size, own_stream in [(8, False), (8, True), (1, False), (8, True), (64, False)]:
        x = torch.randn(size, 64, device="cuda")
        before = x.clone()
        with torch.cuda.stream(method.stream) if own_stream else contextlib.nullcontext():
            out = method.execute([x])[0]
        with torch.no_grad():
            ref = module.cuda()(before)
        assert_close(out, ref, "fp32")
        assert torch.equal(x, before)
        kept.append((out, ref))
    for out, ref in kept:
        assert_close(out, ref, "fp32")


@pytest.mark.gpu
@pytest.mark.parametrize("outside", [[], ["aten.gelu"]])
def test_method_graph_replays_whole_methods_on_gpu(outside: list[str], tmp_path: Path) -> None:
    """With `method_graph`, a method (engines alone, or engines with portable kernels between them)
    is captured once its input shapes repeat and replayed from then on: right answers for new
    inputs, for inputs written into its own buffers, and across shape changes."""
    cfg = _cfg("model=mlp", f"compile.torch_executed_ops={outside}")
    files = run_all(cfg, tmp_path)
    program = load(files["pte"], options=RuntimeOptions(method_graph=True))
    method = program.method("forward")
    assert method._has_kernels == bool(outside)
    module = objects.model(cfg).cuda()
    for size in (8, 8, 8, 1, 1, 8, 8):
        x = torch.randn(size, 64, device="cuda")
        with torch.no_grad():
            assert_close(method.execute([x])[0], module(x), "fp32")
    assert method._graph is not None and method._graph._graph is not None  # captured, not stepped
    buffer = method.input_buffer(0, (8, 64))  # planned memory, or its own where later values reuse that
    assert buffer is not None
    for _ in range(3):
        buffer.normal_()
        with torch.no_grad():
            assert_close(method.execute([buffer])[0], module(buffer), "fp32")


@pytest.mark.gpu
def test_engine_outputs_handed_out_without_copies_on_gpu(tmp_path: Path) -> None:
    """An engine-only method hands out the tensors its engine wrote. Under a CUDA graph, a caller
    that lets each output go gets the next one at the same address (the graph stays as captured);
    once a caller holds one, the engine writes planned memory and the caller gets copies."""
    cfg = _cfg("model=mlp")
    files = run_all(cfg, tmp_path)
    method = load(files["pte"], options=RuntimeOptions(cuda_graph=True)).method("forward")
    module = objects.model(cfg).cuda()
    x = torch.randn(8, 64, device="cuda")
    with torch.no_grad():
        ref = module(x)
    with torch.cuda.stream(method.stream):
        addresses = set()
        for _ in range(3):
            out = method.execute([x])[0]
            assert_close(out, ref, "fp32")
            addresses.add(out.data_ptr())
            del out
        assert len(addresses) == 1
        held = method.execute([x])[0]
        later = [method.execute([x * k])[0] for k in (2.0, 3.0)]
    torch.cuda.synchronize()
    assert_close(held, ref, "fp32")
    for k, out in zip((2.0, 3.0), later):
        with torch.no_grad():
            assert_close(out, module(x * k), "fp32")
    assert later[0].data_ptr() != later[1].data_ptr() != held.data_ptr()


@pytest.mark.gpu
def test_earlier_blob_layout_runs_on_gpu() -> None:
    """A program written before engines became named data (TR01, engine inline) still runs."""
    x, ref = legacy_tr01_case()
    assert_close(load(LEGACY_TR01).method("forward").execute([x])[0], ref, "fp32", MODEL_TOLERANCE)
