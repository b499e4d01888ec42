"""Programs the reliability tests damage, mismatch and misuse: a portable program whose weights live
in a `.ptd` (runs on the CPU), and a TensorRT program whose engine lives in the `.pte` or the `.ptd`."""

from pathlib import Path

import pytest
import torch
from torch.export import Dim

from pipeline.engine.compile_spec import TensorRTCompileSpec
from pipeline.lowering.compile import compile_method
from pipeline.lowering.export import export
from pipeline.lowering.serialize import save, write_program

BATCH = Dim("batch", min=1, max=16)


def linear(seed: int, features: int = 8) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(features, 4), torch.nn.ReLU()).eval()


def portable(path: Path, seed: int = 0, features: int = 8) -> dict[str, Path]:
    """A program of portable kernels (batch 1..16) with its weights in `<path>.ptd`."""
    ep = torch.export.export(linear(seed, features), (torch.randn(4, features),), dynamic_shapes=({0: BATCH},))
    return write_program(export(ep).manager, path, external_data=True)


@pytest.fixture(scope="session")
def portable_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return portable(tmp_path_factory.mktemp("portable") / "lin.pte")


@pytest.fixture(scope="session")
def trt_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A TensorRT program (engine built on the CPU) with a dynamic batch of 1..16."""
    program = compile_method(linear(0), (torch.randn(4, 8),), TensorRTCompileSpec(), dynamic_shapes=({0: BATCH},))
    return save(program, tmp_path_factory.mktemp("trt") / "trt.pte")


@pytest.fixture(scope="session")
def trt_external_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The same TensorRT program written with external data: its engine lives in the `.ptd`."""
    program = compile_method(linear(0), (torch.randn(4, 8),), TensorRTCompileSpec(), dynamic_shapes=({0: BATCH},))
    return save(program, tmp_path_factory.mktemp("trt_external") / "trt.pte", external_data=True)
