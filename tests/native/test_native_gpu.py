"""On a GPU: programs run by ExecuTorch's own runtime with the native TensorRT delegate (from Python,
and by the Python-free runner) give what pipeline.runtime gives and match eager PyTorch; a decoder's
cache stays on the device across its methods, a step moving only tokens in and logits out."""

from __future__ import annotations

import atexit
import functools
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from pipeline.config import objects
from pipeline.config.compose import compose, typed
from pipeline.errors import InputError, RuntimeUnavailableError
from pipeline.runtime import executorch_runtime, load
from pipeline.runtime.executorch_runtime import ForeignTorchError
from pipeline.runtime.generate import generate
from pipeline.runtime.native_library import load_backend, run_runner
from pipeline.runtime.options import RuntimeOptions
from pipeline.steps import run_all
from pipeline.steps.validate import validate_program
from tests.helpers import GPU, LEGACY_TR01, MODEL_TOLERANCE, assert_close, assert_not_degenerate, legacy_tr01_case

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not GPU, reason="needs CUDA and TensorRT")]


def _python_runtime() -> str | None:
    """Why ExecuTorch's Python runtime cannot run here (None: it can): it does not load, or it cannot
    read this torch's tensors (run on the earlier blob layout's program). Any other failure is the
    tests' to find."""
    try:
        load_backend()
    except RuntimeUnavailableError as exc:
        return str(exc)
    try:
        executorch_runtime.load(LEGACY_TR01).method("forward").execute([legacy_tr01_case()[0]])
    except ForeignTorchError as exc:
        return str(exc)
    return None


PYTHON_RUNTIME = _python_runtime() if GPU else "no GPU"

ZOO = ["mlp", "mobilenet_v3_small", "resnet18", "tiny_decoder"]
LAYOUTS = [("fp32", "default"), ("fp32", "external"), ("fp16", "default"), ("fp16", "external")]


def _cfg(*overrides: str) -> dict[str, Any]:
    return typed(compose(list(overrides)))  # type: ignore[return-value]


def _runner_outputs(files: dict[str, Path], method: str, inputs: list[torch.Tensor], tmp: Path, *flags: str) -> list[np.ndarray]:
    args: list[object] = ["run", files["pte"], "--method", method, "--output-dir", tmp, *flags]
    args += ["--ptd", files["ptd"]] if "ptd" in files else []
    for i, x in enumerate(inputs):
        np.save(tmp / f"in{i}.npy", x.cpu().numpy())
        args += ["--input", tmp / f"in{i}.npy"]
    done = run_runner(*args)
    assert done.returncode == 0, done.stderr
    count = sum(line.startswith("output ") for line in done.stdout.splitlines())
    return [np.load(tmp / f"output_{i}.npy") for i in range(count)]


@functools.cache
def _zoo_program(model: str, precision: str, serialize: str) -> tuple[Any, dict[str, Path]]:
    """A zoo program, built once a process (the runner's test and the Python runtime's share it)."""
    cfg = _cfg(f"model={model}", f"compile.precision={precision}", f"serialize={serialize}")
    folder = tempfile.mkdtemp(prefix=f"native-gpu-{model}-")
    atexit.register(shutil.rmtree, folder, True)
    return cfg, run_all(cfg, Path(folder))


def _check_zoo_runs(model: str, precision: str, serialize: str, tmp: Path,
                    runs_of: Callable[[dict[str, Path], str, list[torch.Tensor]], dict[str, Any]]) -> None:
    """Each method's outputs in every run `runs_of` gives equal pipeline.runtime's and match eager."""
    cfg, files = _zoo_program(model, precision, serialize)
    ours = load(files["pte"], files.get("ptd"))
    module = objects.model(cfg)
    for method, spec in cfg.model.methods.items():
        inputs = list(objects.example_inputs(spec, 1))
        with torch.no_grad():
            refs = getattr(module, spec.function)(*inputs)
        refs = list(refs) if isinstance(refs, (tuple, list)) else [refs]
        expected = [o.cpu() for o in ours.method(method).execute(inputs)]
        for name, outs in runs_of(files, method, inputs).items():
            assert len(outs) == len(expected) == len(refs), name
            for out, same, ref in zip(outs, expected, refs):
                out = torch.as_tensor(out)
                assert_not_degenerate(ref)
                torch.testing.assert_close(out, same, rtol=1e-3, atol=1e-3, msg=name)  # one engine, two runtimes
                assert_close(out, ref, precision, MODEL_TOLERANCE)


@pytest.mark.parametrize("precision, serialize", LAYOUTS)
@pytest.mark.parametrize("model", ZOO)
def test_zoo_programs_run_in_executorchs_runtime(model: str, precision: str, serialize: str, tmp_path: Path) -> None:
    """ExecuTorch's C++ runtime (the runner): step by step, each engine call a CUDA graph, the method one graph."""
    _check_zoo_runs(model, precision, serialize, tmp_path, lambda files, method, inputs: {
        "runner": _runner_outputs(files, method, inputs, tmp_path),
        "runner, CUDA graph": _runner_outputs(files, method, inputs, tmp_path, "--cuda-graph", "--repeat", "3"),
        "runner, method graph": _runner_outputs(files, method, inputs, tmp_path, "--method-graph", "--repeat", "3")})


@pytest.mark.skipif(PYTHON_RUNTIME is not None, reason=f"{PYTHON_RUNTIME}")
@pytest.mark.parametrize("precision, serialize", LAYOUTS)
@pytest.mark.parametrize("model", ZOO)
def test_zoo_programs_run_in_executorchs_python_runtime(model: str, precision: str, serialize: str, tmp_path: Path) -> None:
    """ExecuTorch's Python runtime with the native delegate registered, step by step and replaying CUDA graphs."""
    def runs(files: dict[str, Path], method: str, inputs: list[torch.Tensor]) -> dict[str, Any]:
        native = executorch_runtime.load(files["pte"], files.get("ptd"))
        graphs = executorch_runtime.load(files["pte"], files.get("ptd"), RuntimeOptions(cuda_graph=True))
        graphs.method(method).execute(inputs)
        return {"python": native.method(method).execute(inputs),
                "python, CUDA graph": graphs.method(method).execute(inputs)}  # replayed

    _check_zoo_runs(model, precision, serialize, tmp_path, runs)


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_engines_passing_maps_channels_last_run_natively(precision: str, tmp_path: Path) -> None:
    """A program split into ten engines by an op left outside, the feature maps between them held
    channels last: the runner (step by step and as one graph) gives what pipeline.runtime gives."""
    cfg = _cfg("model=mobilenet_v3_small", f"compile.precision={precision}",
               "compile.torch_executed_ops=[aten.hardsigmoid]")
    files = run_all(cfg, tmp_path)
    (spec,) = cfg.model.methods.values()
    inputs = list(objects.example_inputs(spec, 1))
    with torch.no_grad():
        ref = objects.model(cfg)(*inputs)
    (expected,) = [o.cpu() for o in load(files["pte"], files.get("ptd")).method("forward").execute(inputs)]
    for flags in ((), ("--method-graph", "--repeat", "3")):
        (out,) = _runner_outputs(files, "forward", inputs, tmp_path, *flags)
        torch.testing.assert_close(torch.as_tensor(out), expected, rtol=1e-3, atol=1e-3, msg=str(flags))
    assert_close(expected, ref, precision, MODEL_TOLERANCE)


def test_the_earlier_blob_layout_runs_natively(tmp_path: Path) -> None:
    """A TR01 program (engine inline in the blob) from before engines became named data."""
    x, ref = legacy_tr01_case()
    (out,) = _runner_outputs({"pte": LEGACY_TR01}, "forward", [x], tmp_path)
    assert_close(torch.from_numpy(out), ref, "fp32", MODEL_TOLERANCE)


@pytest.mark.skipif(PYTHON_RUNTIME is not None, reason=f"{PYTHON_RUNTIME}")
def test_the_earlier_blob_layout_runs_in_executorchs_python_runtime() -> None:
    x, ref = legacy_tr01_case()
    assert_close(executorch_runtime.load(LEGACY_TR01).method("forward").execute([x])[0], ref, "fp32", MODEL_TOLERANCE)


@pytest.mark.skipif(PYTHON_RUNTIME is not None, reason=f"{PYTHON_RUNTIME}")
def test_validate_runs_in_executorchs_python_runtime(tmp_path: Path) -> None:
    cfg = _cfg("model=mlp", "serialize=external", "runtime.executor=executorch")
    files = run_all(_cfg("model=mlp", "serialize=external"), tmp_path)
    forward = validate_program(cfg, files["pte"], files["ptd"])["methods"]["forward"]
    assert forward["runtime"].startswith("executorch (TensorRTBackend, ") and forward["within_tolerance"], forward


@pytest.mark.parametrize("model, overrides", [("llama_tiny", []), ("qwen2_tiny", []),
                                              ("llama_tiny", ["compile.profiles=[{tokens:[1,1,1]},{tokens:[9,9,9]}]"])])
def test_the_runner_generates_what_pipeline_runtime_generates(model: str, overrides: list[str], tmp_path: Path) -> None:
    """Prefill writes the cache, decode reads and extends it, in device memory shared by both
    methods: a step copies its token and position in and its logits out, never the cache. With
    profiles per regime, prefill and decode each run on their own (a context switching profiles
    keeps the runtime config it was made from)."""
    cfg = _cfg(f"model={model}", *overrides)
    files = run_all(cfg, tmp_path)
    vocab = int(cfg.model.kwargs["vocab_size"])
    prompt = torch.randint(0, vocab, (1, 9), generator=torch.Generator().manual_seed(3))
    new = generate(load(files["pte"]), prompt, 12)[0, prompt.shape[1]:].tolist()
    for graph in ([], ["--cuda-graph"], ["--method-graph"]):
        done = run_runner("generate", files["pte"], "--prompt", " ".join(map(str, prompt[0].tolist())), "--max-new-tokens",
                          12, *graph)
        assert done.returncode == 0, done.stderr
        assert [int(t) for t in done.stdout.splitlines()[0].split()] == new
        # in: the token and position; out: the logits (the cache and its counters stay on the device).
        assert f"per step the delegate copied 16 bytes in and {vocab * 4} out" in done.stdout


@pytest.mark.skipif(PYTHON_RUNTIME is not None, reason=f"{PYTHON_RUNTIME}")
@pytest.mark.parametrize("model", ["llama_tiny", "qwen2_tiny"])
def test_decoder_state_stays_on_the_device_teacher_forced(model: str, tmp_path: Path) -> None:
    """Teacher-forced through ExecuTorch's Python runtime: the prompt, then decode steps fed the
    tokens pipeline.runtime chose, give its logits; a refused call changes nothing."""
    cfg = _cfg(f"model={model}")
    files = run_all(cfg, tmp_path)
    ours, native = load(files["pte"]), executorch_runtime.load(files["pte"])
    vocab = int(cfg.model.kwargs["vocab_size"])
    prompt = torch.randint(0, vocab, (1, 9), generator=torch.Generator().manual_seed(3))
    start = torch.zeros(1, dtype=torch.int64)
    logits = [(ours.method("prefill").execute([prompt.cuda(), start.cuda()])[0].cpu(),
               native.method("prefill").execute([prompt, start])[0])]
    decode = native.method("decode")
    for step in range(6):
        token = logits[-1][0][:, -1:].argmax(-1)
        position = torch.tensor([prompt.shape[1] + step])
        with pytest.raises(InputError):  # refused before anything runs: the cache is as it was
            decode.execute([torch.tensor([[vocab + 5]]), position])
        before = executorch_runtime.bytes_copied()
        got = decode.execute([token, position])[0]
        into, out = (a - b for a, b in zip(executorch_runtime.bytes_copied(), before))
        assert into == token.nbytes + position.nbytes and out == got.nbytes  # never the cache (as above)
        logits.append((ours.method("decode").execute([token.cuda(), position.cuda()])[0].cpu(), got))
    for want, got in logits:
        torch.testing.assert_close(got, want, rtol=2e-3, atol=2e-3)


@pytest.mark.skipif(PYTHON_RUNTIME is not None, reason=f"{PYTHON_RUNTIME}")
def test_refusals_on_the_gpu_are_one_line_and_change_nothing(tmp_path: Path) -> None:
    """What ExecuTorch's own Python API does with a bad call to our delegate: an error, no crash."""
    from pipeline.executorch_api import load_module

    files = run_all(_cfg("model=mlp"), tmp_path)
    module = load_module(str(files["pte"]))
    x = torch.randn(1, 64)
    first = module.run_method("forward", (x,))[0].clone()
    with pytest.raises(RuntimeError):
        module.run_method("forward", (x.to(torch.float16),))
    torch.testing.assert_close(module.run_method("forward", (x,))[0], first)


def test_a_blob_whose_metadata_is_not_its_engines_is_refused_at_load(tmp_path: Path) -> None:
    """The blob's metadata is not covered by the engine's digest: the delegate holds the engine's own
    I/O (names, input or output, dtypes, ranks, fixed dims) against it when the method loads, so no
    buffer is sized from metadata the engine contradicts (issue 56); the untampered program still runs
    and gives what it gave."""
    files = run_all(_cfg("model=mlp"), tmp_path / "build")
    x = torch.randn(1, 64)
    good = _runner_outputs(files, "forward", [x], tmp_path)[0]
    data = files["pte"].read_bytes()
    start = data.index(b'"io_bindings":[')
    output = data.index(b'"is_input":false', start)
    field = data.rindex(b'"dtype":"float32"', start, output)
    tampered = tmp_path / "tampered.pte"
    tampered.write_bytes(data[:field] + b'"dtype":"float16"' + data[field + len(b'"dtype":"float32"'):])
    np.save(tmp_path / "x.npy", x.numpy())
    done = run_runner("run", tampered, "--method", "forward", "--input", tmp_path / "x.npy", "--output-dir", tmp_path)
    assert done.returncode == 1 and "is not what its blob binds" in done.stderr.strip().splitlines()[-1], done.stderr
    np.testing.assert_array_equal(_runner_outputs(files, "forward", [x], tmp_path)[0], good)
