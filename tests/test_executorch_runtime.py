"""The lowering path proven on a real runtime: zoo models lowered without TensorRT (XNNPACK, or
portable ops only) run under ExecuTorch's own runtime on the CPU and equal eager PyTorch."""

from pathlib import Path

import pytest
import torch
from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
from executorch.exir import to_edge_transform_and_lower
from executorch.runtime import Runtime

from pipeline.models.mlp import mlp
from pipeline.models.vision import mobilenet_v3_small, resnet18
from tests.helpers import assert_close, assert_not_degenerate

MODELS = {"mlp": (mlp, (1, 64)), "mobilenet_v3_small": (mobilenet_v3_small, (1, 3, 224, 224)), "resnet18": (resnet18, (1, 3, 224, 224))}


@pytest.mark.parametrize("chain", ["xnnpack", "portable"])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_runs_under_executorch_runtime(name: str, chain: str, tmp_path: Path) -> None:
    make, shape = MODELS[name]
    model = make()
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(2))
    ep = torch.export.export(model, (x,))
    partitioners = [XnnpackPartitioner()] if chain == "xnnpack" else []
    path = tmp_path / "model.pte"
    path.write_bytes(to_edge_transform_and_lower(ep, partitioner=partitioners).to_executorch().buffer)
    method = Runtime.get().load_program(path).load_method("forward")
    (out,) = method.execute([x])
    with torch.no_grad():
        ref = model(x)
    assert_not_degenerate(ref)
    assert_close(out, ref, "fp32")
