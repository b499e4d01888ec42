"""Batch norm (inference) and layer norm converters."""

import pytest
import torch

from pipeline.engine.compile_spec import TensorRTCompileSpec
from pipeline.engine.converters.normalization import batch_norm_folded_into
from pipeline.engine.converters.registry import aten_op
from pipeline.engine.network import define_network, graph_source
from pipeline.engine.trt_api import trt
from tests.helpers import Fn, check_converter, network_layers, refusal

torch.manual_seed(0)


def _bn(channels: int) -> torch.nn.BatchNorm2d:
    bn = torch.nn.BatchNorm2d(channels)
    with torch.no_grad():  # non-trivial statistics, or the test proves nothing
        bn.running_mean.uniform_(-1, 1)
        bn.running_var.uniform_(0.5, 2)
        bn.weight.uniform_(0.5, 1.5)
        bn.bias.uniform_(-1, 1)
    return bn.eval()


def test_batch_norm() -> None:
    check_converter(_bn(6), (torch.randn(2, 6, 5, 5),))


def test_batch_norm_1d() -> None:
    bn = torch.nn.BatchNorm1d(6).eval()
    with torch.no_grad():
        bn.running_mean.uniform_(-1, 1)
    check_converter(bn, (torch.randn(3, 6),))


@pytest.mark.parametrize("shape", [(16,), (4, 16)])
def test_layer_norm(shape: tuple[int, ...]) -> None:
    ln = torch.nn.LayerNorm(shape)
    with torch.no_grad():
        ln.weight.uniform_(0.5, 1.5)
        ln.bias.uniform_(-1, 1)
    check_converter(ln, (torch.randn(2, 4, 16),))


def test_layer_norm_no_affine() -> None:
    check_converter(torch.nn.LayerNorm(16, elementwise_affine=False), (torch.randn(2, 4, 16),))


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_honours_precision(precision: str) -> None:
    check_converter(torch.nn.Sequential(_bn(6), torch.nn.LayerNorm(5)), (torch.randn(2, 6, 5, 5),), precision=precision)


def test_refuses_used_statistics() -> None:
    fn = Fn(lambda m, x: torch.ops.aten.native_layer_norm(x, [8], None, None, 1e-5)[1] * 2)
    reasons = refusal(fn, (torch.randn(2, 8),))
    assert any("mean/rstd" in r for r in reasons.values()), reasons


def _conv_bn(bias: bool) -> torch.nn.Sequential:
    return torch.nn.Sequential(torch.nn.Conv2d(3, 6, 3, bias=bias), _bn(6), torch.nn.ReLU()).eval()


@pytest.mark.parametrize("bias, dialect", [(False, "aten"), (True, "aten"), (False, "edge")])
def test_batch_norm_after_convolution_folds_into_it(bias: bool, dialect: str) -> None:
    module, x = _conv_bn(bias), torch.randn(2, 3, 8, 8)
    layers, ctx = network_layers(module, x, dialect)
    assert not any("UNARY" in t or "ELEMENTWISE" in t for t in layers), layers
    # The folded kernel computes the same as conv -> batch norm (checked here in PyTorch, on CPU).
    conv = next(n for n in ctx.values if aten_op(n.target) == torch.ops.aten.convolution.default)
    ctx.folded.clear()
    weight, shift = batch_norm_folded_into(ctx, conv)  # type: ignore[misc]
    with torch.no_grad():
        torch.testing.assert_close(torch.nn.functional.conv2d(x, weight, shift), module[1](module[0](x)),
                                   rtol=1e-5, atol=1e-5)
    check_converter(module, (x,))


def test_batch_norm_folds_when_its_statistics_come_after_the_convolution_in_the_graph() -> None:
    """torch 2.11's partitions place a placeholder just before its first reader: the batch norm's
    statistics then follow the convolution that folds them in (found on the H200: dla34 15 % slower)."""
    program = torch.export.export(_conv_bn(False), (torch.randn(2, 3, 8, 8),)).run_decompositions()
    graph = program.graph
    bn = next(n for n in graph.nodes if aten_op(n.target) == torch.ops.aten._native_batch_norm_legit_no_training.default)
    for statistic in bn.args[1:5]:
        bn.prepend(statistic)  # type: ignore[union-attr]
    order = [n.op for n in graph.nodes]
    assert "placeholder" in order[order.index("call_function"):]  # constants after the convolution
    builder = trt().Builder(trt().Logger(trt().Logger.ERROR))
    ctx = define_network(builder, graph_source(program), TensorRTCompileSpec()).ctx
    assert ctx.folded == {bn}


def test_batch_norm_stays_when_convolution_output_is_used_elsewhere() -> None:
    module = Fn(lambda m, x: (lambda y: m.bn(y) + y)(m.conv(x)))
    module.conv, module.bn = torch.nn.Conv2d(3, 6, 3), _bn(6)
    layers, _ = network_layers(module.eval(), torch.randn(2, 3, 8, 8))
    assert sum("ELEMENTWISE" in t for t in layers) >= 3, layers  # scale, shift, the sum
    check_converter(module.eval(), (torch.randn(2, 3, 8, 8),))


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("groups", [1, 2, 4])
def test_group_norm(groups: int, precision: str) -> None:
    norm = torch.nn.GroupNorm(groups, 4)
    with torch.no_grad():
        norm.weight.copy_(torch.linspace(0.5, 2.0, 4))
        norm.bias.copy_(torch.linspace(-1.0, 1.0, 4))
    check_converter(norm, (torch.randn(2, 4, 5, 6) * 3 + 1,), precision=precision)


def test_group_norm_dynamic_batch_and_3d_input() -> None:
    batch = torch.export.Dim("batch", min=1, max=8)
    check_converter(torch.nn.GroupNorm(2, 6), (torch.randn(2, 6, 10),), dynamic_shapes=({0: batch},))


@pytest.mark.parametrize("affine", [False, True])
def test_instance_norm(affine: bool) -> None:
    norm = torch.nn.InstanceNorm2d(4, affine=affine)
    if affine:
        with torch.no_grad():
            norm.weight.copy_(torch.linspace(0.5, 2.0, 4))
            norm.bias.copy_(torch.linspace(-1.0, 1.0, 4))
    check_converter(norm, (torch.randn(2, 4, 5, 6) * 3 + 1,))
