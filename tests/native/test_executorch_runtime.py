"""The native delegate and runner on a machine without a GPU: the install built them, the delegate
registers with ExecuTorch's runtime, programs load there, and every refusal a user can meet before a
GPU is involved (inputs outside the record, a missing or foreign `.ptd`, no CUDA) is one line; the
Python-free runner runs a program with state shared by its methods and generates from it."""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from pipeline.config.compose import compose, typed
from pipeline.delegate.input_values import set_input_values, value_bounds
from pipeline.errors import RuntimeUnavailableError
from pipeline.lowering.compile import export_method
from pipeline.lowering.serialize import save
from pipeline.models.decoder import MethodView
from pipeline.runtime import executorch_runtime, generate
from pipeline.runtime.native_library import load_backend, run_runner, runner_env, runner_path
from pipeline.steps import run_all
from pipeline.steps.validate import validate_program
from tests.helpers import GPU

VOCAB, CACHE = 16, 32


class Counter(torch.nn.Module):
    """A decoder of the runner's shape (tokens, start) -> logits [1, T, VOCAB] whose next token is the
    sum of every token it has seen, mod VOCAB: decode's answers depend on what prefill wrote."""

    def __init__(self, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.dtype = dtype
        self.register_buffer("seen", torch.zeros(1, CACHE, dtype=torch.int64))

    def step(self, tokens: torch.Tensor, start: torch.Tensor) -> torch.Tensor:
        self.seen.index_copy_(1, torch.arange(tokens.shape[1]) + start, tokens)
        best = self.seen.sum() % VOCAB
        logits = -(torch.arange(VOCAB) - best).abs().to(self.dtype)  # 0 at the answer, negative elsewhere
        return logits.reshape(1, 1, VOCAB).expand(1, tokens.shape[1], VOCAB).contiguous()


def counter_program(path: Path, dtype: torch.dtype = torch.float32) -> Path:
    """Counter as a portable program (no engines): prefill of 3 tokens, decode of one."""
    module = Counter(dtype).eval()
    calls = {"prefill": (torch.tensor([[1, 2, 3]]), torch.tensor([0])), "decode": (torch.tensor([[4]]), torch.tensor([3]))}
    programs = {m: export_method(MethodView(module, "step"), args) for m, args in calls.items()}
    for program in programs.values():  # what the compile step records: the values indexing ops take
        set_input_values(program, value_bounds(program))
    return save(programs, path / "counter.pte", constant_methods={"max_cache_len": CACHE})["pte"]


def counter_tokens(prompt: list[int], new: int) -> list[int]:
    """What greedy generation from Counter gives."""
    module = Counter()
    want = [int(module.step(torch.tensor([prompt]), torch.tensor([0]))[0, -1].argmax())]
    for i in range(new - 1):
        want.append(int(module.step(torch.tensor([[want[-1]]]), torch.tensor([len(prompt) + i]))[0, -1].argmax()))
    return want


def refusal(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 1, result.stdout + result.stderr
    return result.stderr.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def mlp(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The mlp built whole into a TensorRT engine (on the CPU), its engine in a `.ptd`."""
    cfg = typed(compose(["model=mlp", "serialize=external"]))
    return run_all(cfg, tmp_path_factory.mktemp("mlp"))


@pytest.fixture(scope="module")
def counter(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return counter_program(tmp_path_factory.mktemp("counter"))


def test_the_delegate_registers_and_programs_load_in_executorchs_runtime(mlp: dict[str, Path]) -> None:
    from pipeline.executorch_api import registered_backends

    load_backend()
    assert "TensorRTBackend" in registered_backends()
    program = executorch_runtime.load(mlp["pte"], mlp["ptd"])
    assert program.method_names == ["forward"]
    if GPU:
        return
    with pytest.raises(RuntimeUnavailableError, match=r"^method 'forward', TensorRT engine [0-9a-f]{12}: this machine has no "
                                                      r"CUDA driver \(libcuda.so.1 does not load\); TensorRT programs run on an "
                                                      r"NVIDIA GPU$"):
        program.method("forward").execute([torch.randn(1, 64)])


def test_a_python_runtime_built_for_another_torch_is_one_line() -> None:
    """What ExecuTorch 1.5.1's `_C` raised for every tensor under the GPU machine's torch 2.11 (an H100,
    2026-12-07), a C++ trace: one line naming the fix; any other refusal is one line too."""
    from pipeline.executorch_api import portable_lib
    from pipeline.runtime.executorch_runtime import FOREIGN_TORCH, ForeignTorchError, _refused

    assert portable_lib() is portable_lib()  # chosen once: a second choice may load a second runtime
    backend = load_backend()
    backend.pipeline_trt_clear_error()
    trace = "\nException raised from device_default at TensorImpl.h:1303 (most recent call first):\nframe #0: ..."
    foreign = _refused(backend, "run method 'forward'", RuntimeError(FOREIGN_TORCH + trace))
    assert isinstance(foreign, ForeignTorchError) and "\n" not in str(foreign)
    assert str(foreign).endswith(f"cannot read torch {torch.__version__}'s tensors ('{FOREIGN_TORCH}': it was built for "
                                 "another torch); install the torch it was built for, or run the program with the "
                                 "native runner (pipeline-runner) or pipeline.runtime")
    other = _refused(backend, "run method 'forward'", RuntimeError("Failed to execute method forward, error: 0x12" + trace))
    assert type(other) is RuntimeUnavailableError
    assert str(other) == "ExecuTorch's runtime failed to run method 'forward' (Failed to execute method forward, error: 0x12)"


def test_the_runner_refuses_a_missing_or_foreign_ptd(mlp: dict[str, Path], tmp_path: Path) -> None:
    x = tmp_path / "x.npy"
    np.save(x, np.zeros((1, 64), dtype=np.float32))
    line = refusal(run_runner("run", mlp["pte"], "--method", "forward", "--input", x))
    assert "the program's named data has no entry 'tensorrt.engine." in line
    assert "load the program with the .ptd it was written with" in line
    damaged = tmp_path / "damaged.ptd"
    data = bytearray(mlp["ptd"].read_bytes())
    data[-100] ^= 0xFF  # inside the engine, the .ptd's last entry
    damaged.write_bytes(bytes(data))
    line = refusal(run_runner("run", mlp["pte"], "--ptd", damaged, "--method", "forward", "--input", x))
    assert "does not match its SHA-256 (a damaged or altered .ptd or .pte); copy it again or rebuild the program" in line


def test_an_engine_built_under_another_tf32_setting_is_refused(mlp: dict[str, Path], tmp_path: Path) -> None:
    """TensorRT-RTX keeps NVIDIA_TF32_OVERRIDE's value at build; the delegate compares it before any
    engine loads (the build here had it unset)."""
    np.save(tmp_path / "x.npy", np.zeros((1, 64), dtype=np.float32))
    done = subprocess.run([str(runner_path()), "run", str(mlp["pte"]), "--ptd", str(mlp["ptd"]), "--input",
                           str(tmp_path / "x.npy")], capture_output=True, text=True, timeout=120,
                          env={**runner_env(), "NVIDIA_TF32_OVERRIDE": "0"})
    assert refusal(done).endswith("was built with NVIDIA_TF32_OVERRIDE unset and this process has NVIDIA_TF32_OVERRIDE=0; "
                                  "TensorRT-RTX runs an engine only under the NVIDIA_TF32_OVERRIDE it was built with: set "
                                  "it so here, or rebuild the program")


def test_python_refuses_a_ptd_program_whose_methods_share_state(tmp_path: Path) -> None:
    """ExecuTorch 1.4.1's Python runtime loads a .ptd only into methods with separate memory: a
    decoder there would decode from an empty cache. Refused in one line naming what runs it."""
    from tests.test_state import Cache, _programs

    calls = {"append": (torch.randn(1, 2, 3, 4), torch.tensor([2])), "read": (torch.randn(1, 2, 1, 4),)}
    files = save(_programs(Cache().eval(), calls, engines=True), tmp_path / "cache.pte", external_data=True)
    with pytest.raises(RuntimeUnavailableError, match=r"its methods share state \(a KV cache\) and its data is in a "
                                                      r"\.ptd, .*run it with the native runner \(pipeline-runner\)"):
        executorch_runtime.load(files["pte"], files["ptd"])


def test_the_runner_refuses_inputs_the_program_was_not_built_for(counter: Path, tmp_path: Path) -> None:
    def npy(name: str, value: np.ndarray) -> Path:
        np.save(tmp_path / name, value)
        return tmp_path / name

    tokens, start = npy("t.npy", np.array([[1, 2, 3]], dtype=np.int64)), npy("s.npy", np.array([0], dtype=np.int64))
    assert run_runner("run", counter, "--method", "prefill", "--input", tokens, "--input", start,
                  "--output-dir", tmp_path).returncode == 0
    cases = {
        (npy("f.npy", np.zeros((1, 3), dtype=np.float32)), start): "method 'prefill' input 0 has dtype float32, but the "
                                                                    "program takes int64[1, 3]; convert it first",
        (npy("w.npy", np.zeros((1, 4), dtype=np.int64)), start): "method 'prefill' input 0 dim 1 is 4, but the program "
                                                                  "was built for exactly 3",
        (tokens, npy("far.npy", np.array([30], dtype=np.int64))): "method 'prefill' input 1 holds 30, but the program "
                                                                   "takes values 0..29",
    }
    for (a, b), expected in cases.items():
        assert expected in refusal(run_runner("run", counter, "--method", "prefill", "--input", a, "--input", b))
    assert "takes 2 inputs, got 1" in refusal(run_runner("run", counter, "--method", "prefill", "--input", tokens))
    (tmp_path / "junk.npy").write_bytes(b"not numpy")
    assert "junk.npy: not a .npy file" in refusal(run_runner("run", counter, "--method", "prefill", "--input", tmp_path / "junk.npy"))
    line = refusal(run_runner("run", counter, "--method", "prefill", "--input", tokens, "--input", start, "--kernels", "fast"))
    assert line == "pipeline-runner: --kernels takes lazy, eager or none, got 'fast'"
    line = refusal(run_runner("run", counter, "--method", "prefill", "--cuda-graph", "--method-graph"))
    assert line == "pipeline-runner: --cuda-graph and --method-graph exclude each other: pass one"


def test_the_runner_runs_methods_that_share_state_and_generates(counter: Path, tmp_path: Path) -> None:
    np.save(tmp_path / "t.npy", np.array([[1, 2, 3]], dtype=np.int64))
    np.save(tmp_path / "s.npy", np.array([0], dtype=np.int64))
    done = run_runner("run", counter, "--method", "prefill", "--input", tmp_path / "t.npy", "--input", tmp_path / "s.npy",
                  "--output-dir", tmp_path)
    assert done.returncode == 0, done.stderr
    out = np.load(tmp_path / "output_0.npy")
    assert out.shape == (1, 3, VOCAB) and int(out[0, -1].argmax()) == 6
    prompt, new = [5, 9, 2], 6
    want = counter_tokens(prompt, new)
    done = run_runner("generate", counter, "--prompt", " ".join(map(str, prompt)), "--max-new-tokens", new, "--method-graph")
    assert done.returncode == 0, done.stderr
    assert [int(t) for t in done.stdout.splitlines()[0].split()] == want
    assert f"then {new - 3} decode steps in" in done.stdout
    line = refusal(run_runner("generate", counter, "--prompt", "1 2 3", "--max-new-tokens", 31))
    assert line.endswith("need 33 cache positions; the program's cache holds 32 (shorten the prompt or generate fewer)")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_the_runner_generates_from_half_precision_logits(dtype: torch.dtype, tmp_path: Path) -> None:
    """Logits of 16-bit floats, all negative but the answer: read as the values they are."""
    prompt = [5, 9, 2]
    done = run_runner("generate", counter_program(tmp_path, dtype), "--prompt", " ".join(map(str, prompt)),
                      "--max-new-tokens", 8)
    assert done.returncode == 0, done.stderr
    assert [int(t) for t in done.stdout.splitlines()[0].split()] == counter_tokens(prompt, 8)


@pytest.mark.skipif(GPU, reason="what validate says without a GPU (tests/native/test_native_gpu.py runs it on one)")
def test_validate_says_why_executorchs_runtime_did_not_run(mlp: dict[str, Path]) -> None:
    """The program loads in ExecuTorch's runtime; its engine needs a GPU: validate says so."""
    cfg = typed(compose(["model=mlp", "serialize=external", "runtime.executor=executorch"]))
    forward = validate_program(cfg, mlp["pte"], mlp["ptd"])["methods"]["forward"]
    assert forward["runtime"] is None and "this machine has no CUDA driver" in forward["reason"]


def test_generate_runs_either_runtime_and_says_which(counter: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A program without engines runs in ExecuTorch's runtime anywhere: what prefill writes, decode reads."""
    assert generate.main([str(counter), "--prompt-ids", "5 9 2", "--max-new-tokens", "6", "--runtime", "executorch"]) == 0
    printed = capsys.readouterr().out.splitlines()
    done = run_runner("generate", counter, "--prompt", "5 9 2", "--max-new-tokens", 6)
    assert printed[0].split() == done.stdout.splitlines()[0].split()
    assert printed[1].endswith("(executorch (TensorRTBackend, no engine loaded))")



def test_the_runner_reads_only_regular_files_and_writes_only_its_own(counter: Path, tmp_path: Path) -> None:
    """A pipe or device as an input or program is refused at once (no wait, no endless read), an
    input larger than the program's largest is refused before it is read, and outputs never go
    through a link or over a file the runner did not write (issue 56)."""
    import os

    np.save(tmp_path / "t.npy", np.array([[1, 2, 3]], dtype=np.int64))
    np.save(tmp_path / "s.npy", np.array([0], dtype=np.int64))
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for args in (("run", counter, "--method", "prefill", "--input", fifo, "--input", tmp_path / "s.npy"),
                 ("run", counter, "--method", "prefill", "--input", "/dev/zero", "--input", tmp_path / "s.npy"),
                 ("run", fifo, "--method", "prefill"), ("generate", counter, "--ptd", "/dev/zero", "--prompt", "1")):
        line = refusal(run_runner(*args))
        assert "not a regular file (a pipe, device or folder)" in line, line
    big = tmp_path / "big.npy"
    np.save(big, np.zeros((1, 3), dtype=np.int64))
    with big.open("ab") as f:
        f.truncate(1 << 20)  # a megabyte for an input of 24 bytes
    line = refusal(run_runner("run", counter, "--method", "prefill", "--input", big, "--input", tmp_path / "s.npy"))
    assert line.endswith("bytes, more than the 65572 the program's largest input can take; pass the input the program "
                         "was built for"), line
    out = tmp_path / "out"
    out.mkdir()
    mine = tmp_path / "mine.txt"
    mine.write_text("keep")
    run = ("run", counter, "--method", "prefill", "--input", tmp_path / "t.npy", "--input", tmp_path / "s.npy",
           "--output-dir", out)
    (out / "output_0.npy.tmp").symlink_to(mine)  # the name the runner once wrote through
    assert run_runner(*run).returncode == 0 and mine.read_text() == "keep"
    assert run_runner(*run).returncode == 0  # its own output of the run before is replaced
    (out / "output_0.npy").unlink()
    (out / "output_0.npy").symlink_to(mine)
    assert "is there and is not an earlier .npy output" in refusal(run_runner(*run))
    (out / "output_0.npy").unlink()
    (out / "output_0.npy").write_text("a user's notes")
    assert "pass another --output-dir" in refusal(run_runner(*run))
    assert mine.read_text() == "keep" and (out / "output_0.npy").read_text() == "a user's notes"
    assert sorted(p.name for p in out.iterdir()) == ["output_0.npy", "output_0.npy.tmp"]  # no temporary left behind
