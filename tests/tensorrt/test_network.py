"""`define_network`: every layer is named after the program node it comes from."""

import pytest
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


class _Rotary(torch.nn.Module):
    """Rotary position embedding as decoders write it: angles in float32 from integer positions (a product,
    or frequencies @ positions as transformers writes it), their cosines and sines cast to the
    activations' half precision."""

    def __init__(self, product: bool) -> None:
        super().__init__()
        self.product = product
        self.register_buffer("inv_freq", 1.0 / 10000 ** (torch.arange(0, 64, 2, dtype=torch.float32) / 64))

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        if self.product:
            angles = (self.inv_freq[None, :, None] @ positions[None, None, :].float()).transpose(1, 2)[0]
        else:
            angles = positions.float()[:, None] * self.inv_freq[None, :]
        emb = torch.cat([angles, angles], dim=-1)
        return x * emb.cos().to(x.dtype) + x.flip(-1) * emb.sin().to(x.dtype)


@pytest.mark.parametrize("product", [False, True])
def test_angles_made_from_positions_stay_float32_in_an_fp16_engine(product: bool) -> None:
    """At position 2000 an angle in fp16 is off by up to 0.5 rad: the engine computes what it derives from
    the integer positions in float32 (the model's own precision there) and the rest in fp16."""
    from tests.helpers import check_converter, tensorrt_engines

    x = torch.randn(1, 48, 64, generator=torch.Generator().manual_seed(0)).half()
    edge = check_converter(_Rotary(product).eval(), (x, torch.arange(1960, 2008)), precision="fp16")
    ((meta, _),) = tensorrt_engines(edge)
    assert [b.dtype for b in meta.outputs] == ["float16"]
    program = edge.exported_program().graph_module.lowered_module_0.original_module
    definition = define_network(trt().Builder(trt().Logger(trt().Logger.ERROR)), program, TensorRTCompileSpec(precision="fp16"))
    network = definition.network
    dtypes = {network.get_layer(i).name: network.get_layer(i).get_output(0).dtype for i in range(network.num_layers)}
    kept = [name for name, dtype in dtypes.items() if dtype == trt().float32]
    assert any("cos" in name for name in kept) and any("sin" in name for name in kept), kept
    assert {dtype for name, dtype in dtypes.items() if "add" in name} == {trt().float16}  # the activations' sum


class _RMSNorm(torch.nn.Module):
    """RMSNorm as decoders write it: the statistics of the half-precision input in float32."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.rand(64, generator=torch.Generator().manual_seed(1)) + 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
        return self.weight.to(x.dtype) * h.to(x.dtype)


def test_normalization_statistics_stay_float32_in_an_fp16_engine() -> None:
    """An activation of 300 (trained decoders carry such in their residual stream) squares past fp16's
    largest value: in fp16 the row's mean would be infinite and the row normalized to zeros."""
    from tests.helpers import check_converter

    x = torch.randn(2, 8, 64, generator=torch.Generator().manual_seed(0)).half()
    x[0, 3, 5], x[1, 2, 7] = 300.0, -1000.0
    check_converter(_RMSNorm().eval(), (x,), precision="fp16")
