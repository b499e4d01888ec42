"""NVIDIA_TF32_OVERRIDE, which a TensorRT-RTX engine keeps from its build: recorded in the blob, the
engine op and the engine cache, part of the toolchain record and the cache key, and checked before
a program runs (an engine built for another setting is refused in one line, not left to TensorRT)."""

from pathlib import Path
from typing import Any

import pytest
import torch

from pipeline.config.compose import compose, typed
from pipeline.delegate import blob
from pipeline.engine import build_env, toolchain
from pipeline.engine.builder import build_engine
from pipeline.engine.cache import EngineCache, toolchain_id
from pipeline.engine.compile_spec import TensorRTCompileSpec
from pipeline.engine.trt_api import flavour
from pipeline.errors import RuntimeUnavailableError
from pipeline.runtime import load
from pipeline.runtime.engine_runner import EngineRunner
from pipeline.steps import run_all
from tests.helpers import GPU

rtx = pytest.mark.skipif(not flavour().is_rtx, reason="TensorRT-RTX keeps the variable in its engines")


def _program() -> torch.export.ExportedProgram:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU()).eval()
    return torch.export.export(model, (torch.randn(1, 3, 8, 8),)).run_decompositions()


@rtx
def test_engine_keeps_the_override_it_was_built_with(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(build_env.VARIABLE, raising=False)
    cache = EngineCache(str(tmp_path))
    unset = build_engine(_program(), TensorRTCompileSpec(), cache=cache)
    monkeypatch.setenv(build_env.VARIABLE, "0")
    zero = build_engine(_program(), TensorRTCompileSpec(), cache=cache)
    assert unset.metadata.tf32_override == "" and zero.metadata.tf32_override == "0"
    assert unset.engine != zero.engine  # the same network and spec, another engine
    assert [e.hit for e in cache.events] == [False, False]  # the override is part of the key
    again = build_engine(_program(), TensorRTCompileSpec(), cache=EngineCache(str(tmp_path)))
    assert again.build_seconds == 0.0 and again.metadata.tf32_override == "0"  # the cache keeps it


def test_blob_and_engine_op_carry_the_override() -> None:
    bindings = (blob.IOBinding("x", "float32", (1, 4), True), blob.IOBinding("y", "float32", (1, 4), False))
    ref = blob.EngineRef.of(b"engine")
    for recorded in ("", "0"):
        meta = blob.BlobMetadata(io_bindings=bindings, tf32_override=recorded)
        assert blob.decode(blob.encode(ref, meta))[0].tf32_override == recorded
        assert blob.decode_op_metadata(blob.encode_op_metadata(meta, [[1, 4]]))[0].tf32_override == recorded
    older = blob.encode(ref, blob.BlobMetadata(io_bindings=bindings))
    assert b"tf32_override" not in older and blob.decode(older)[0].tf32_override is None


def test_toolchain_record_and_id_name_the_override(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(build_env.VARIABLE, raising=False)
    plain, plain_id = toolchain.record(), toolchain_id()
    assert build_env.VARIABLE not in plain and build_env.VARIABLE not in plain_id
    monkeypatch.setenv(build_env.VARIABLE, "0")
    assert toolchain.record() == {**plain, build_env.VARIABLE: "0"}  # DVC sees it change: the compile stage reruns
    assert toolchain_id() == plain_id + f";{build_env.VARIABLE}=0"


@pytest.mark.parametrize("recorded, here, message", [
    ("", "0", "built with NVIDIA_TF32_OVERRIDE unset and this process has NVIDIA_TF32_OVERRIDE=0; TensorRT-RTX runs "
              "an engine only under the NVIDIA_TF32_OVERRIDE it was built with: unset it here, or rebuild the program "
              "with NVIDIA_TF32_OVERRIDE=0"),
    ("0", "", "built with NVIDIA_TF32_OVERRIDE=0 and this process has NVIDIA_TF32_OVERRIDE unset; TensorRT-RTX runs "
              "an engine only under the NVIDIA_TF32_OVERRIDE it was built with: set NVIDIA_TF32_OVERRIDE=0 here, or "
              "rebuild it without NVIDIA_TF32_OVERRIDE"),
])
def test_other_override_is_refused_in_one_line(recorded: str, here: str, message: str,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(build_env.VARIABLE, here)
    if not here:
        monkeypatch.delenv(build_env.VARIABLE)
    with pytest.raises(RuntimeUnavailableError, match="^engine e was " + message.replace("(", r"\(") + "$"):
        build_env.check(recorded, "engine e")
    monkeypatch.setenv(build_env.VARIABLE, recorded)
    build_env.check(recorded, "engine e")  # the same setting: runs
    build_env.check(None, "engine e")  # not recorded (older blobs): not checked


@rtx
def test_program_built_without_the_override_is_refused_where_it_is_set(monkeypatch: pytest.MonkeyPatch,
                                                                       tmp_path: Path) -> None:
    monkeypatch.delenv(build_env.VARIABLE, raising=False)
    cfg: dict[str, Any] = typed(compose(["model=mlp"]))  # type: ignore[assignment]
    files = run_all(cfg, tmp_path)
    monkeypatch.setenv(build_env.VARIABLE, "0")
    with pytest.raises(RuntimeUnavailableError, match=r"^this program's TensorRT engine [0-9a-f]{12} was built with "
                                                      r"NVIDIA_TF32_OVERRIDE unset and this process has "
                                                      r"NVIDIA_TF32_OVERRIDE=0; .* unset it here"):
        load(files["pte"]).method("forward")


@pytest.mark.gpu
@pytest.mark.skipif(not GPU or not flavour().is_rtx, reason="needs CUDA and TensorRT-RTX")
def test_context_tensorrt_does_not_make_is_one_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """The engine runner alone (no blob record to check first): TensorRT-RTX refuses the context
    (the H200, 2026-12-01: "Inconsistent setting of NVIDIA_TF32_OVERRIDE ..."), and the runner says
    so instead of failing on a missing context."""
    monkeypatch.delenv(build_env.VARIABLE, raising=False)
    built = build_engine(_program(), TensorRTCompileSpec())
    monkeypatch.setenv(build_env.VARIABLE, "0")
    runner = EngineRunner(built.engine, built.metadata.io_bindings)
    with pytest.raises(RuntimeUnavailableError, match=r"made no execution context for this engine .*"
                                                      r"NVIDIA_TF32_OVERRIDE is 0 here"):
        runner(torch.randn(1, 3, 8, 8, device="cuda"))
