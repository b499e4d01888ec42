"""`define_network`: every layer is named after the program node it comes from."""

import torch

from pipeline.engine.compile_spec import TensorRTCompileSpec
from pipeline.engine.network import define_network
from pipeline.engine.trt_api import trt


def test_layers_are_named_after_their_nodes() -> None:
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8), torch.nn.GELU(),
                                torch.nn.Flatten(), torch.nn.Linear(8 * 6 * 6, 4)).eval()
    program = torch.export.export(model, (torch.randn(2, 3, 8, 8),)).run_decompositions()
    builder = trt().Builder(trt().Logger(trt().Logger.ERROR))
    network = define_network(builder, program, TensorRTCompileSpec()).network
    names = [network.get_layer(i).name for i in range(network.num_layers)]
    nodes = {n.name for n in program.graph.nodes}
    assert len(set(names)) == len(names), names
    assert all(name.split("/")[0] in nodes for name in names), [n for n in names if n.split("/")[0] not in nodes]
    for op in ("convolution", "gelu", "addmm"):
        assert any(name.startswith(op) for name in names), (op, names)
