"""The CPU reference executor (`pipeline.engine.reference`) makes a wrong converter fail on a machine
without a GPU: each mutation below changes what a real converter builds (an op swapped, an axis off
by one, a transpose dropped, a scale ignored, a cast's type, a slice's start) and the converter test of
that op fails on the CPU; a layer type the executor does not evaluate is an error naming it."""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from pipeline.config.compose import compose, typed
from pipeline.engine.converters import registry
from pipeline.engine.reference import ReferenceError, run_network
from pipeline.engine.trt_api import trt
from pipeline.steps import run_all
from tests.helpers import GPU, Fn, check_converter

aten = torch.ops.aten
torch.manual_seed(0)
X = torch.randn(2, 3, 4, 5)
POS = torch.rand(2, 3, 4) + 0.5
Q, K, V = torch.randn(1, 2, 6, 8), torch.randn(1, 2, 9, 8), torch.randn(1, 2, 9, 8)


@contextmanager
def mutated(op: Any, mutate: Callable[[Any, list[Any]], None]) -> Iterator[None]:
    """The converter of `op` with `mutate(ctx, layers it added)` applied to what it builds."""
    registry.lookup(op)  # its family loaded
    record = registry._REGISTRY[op]

    def wrong(ctx: Any, node: Any, args: Any, kwargs: Any) -> Any:
        first = ctx.network.num_layers
        out = record.impl(ctx, node, args, kwargs)
        mutate(ctx, [ctx.network.get_layer(i) for i in range(first, ctx.network.num_layers)])
        return out

    registry._REGISTRY[op] = dataclasses.replace(record, impl=wrong)
    try:
        yield
    finally:
        registry._REGISTRY[op] = record


def _of(layers: list[Any], kind: str, cls: str) -> list[Any]:
    found = [layer for layer in layers if str(layer.type).endswith("." + kind)]
    for layer in found:
        layer.__class__ = getattr(trt(), cls)
    assert found, f"the converter added no {kind} layer"
    return found


def _swap_sqrt(ctx: Any, layers: list[Any]) -> None:
    for layer in _of(layers, "UNARY", "IUnaryLayer"):
        layer.op = trt().UnaryOperation.EXP


def _softmax_axis_off_by_one(ctx: Any, layers: list[Any]) -> None:
    for layer in _of(layers, "SOFTMAX", "ISoftMaxLayer"):
        layer.axes = int(layer.axes) >> 1


def _drop_transpose(ctx: Any, layers: list[Any]) -> None:
    for layer in _of(layers, "SHUFFLE", "IShuffleLayer"):
        layer.first_transpose = tuple(range(8))


def _ignore_scale(ctx: Any, layers: list[Any]) -> None:
    for layer in _of(layers, "ELEMENTWISE", "IElementWiseLayer"):  # q and k each times the scale's root
        layer.set_input(1, ctx.tensor(1.0, like=layer.get_input(0)))


def _sum_as_max(ctx: Any, layers: list[Any]) -> None:
    for layer in _of(layers, "REDUCE", "IReduceLayer"):
        layer.op = trt().ReduceOperation.MAX


def _slice_one_later(ctx: Any, layers: list[Any]) -> None:
    for layer in _of(layers, "SLICE", "ISliceLayer"):
        layer.start = tuple(int(s) + (1 if k == 1 else 0) for k, s in enumerate(layer.start))


MUTATIONS = {
    "sqrt built as exp": (aten.sqrt.default, _swap_sqrt, lambda m, x: torch.sqrt(x), (POS,)),
    "softmax over the dim before": (aten.softmax.int, _softmax_axis_off_by_one, lambda m, x: torch.softmax(x, -1), (X,)),
    "permute's transpose dropped": (aten.permute_copy.default, _drop_transpose, lambda m, x: x.permute(0, 2, 1, 3) * 2, (X,)),
    "attention's scale ignored": (aten.mul.Scalar, _ignore_scale,
                                  lambda m, q, k, v: F.scaled_dot_product_attention(q, k, v, scale=0.3), (Q, K, V)),
    "sum reduced as max": (aten.sum.dim_IntList, _sum_as_max, lambda m, x: x.sum(1), (X,)),
    "slice one element later": (aten.slice_copy.Tensor, _slice_one_later, lambda m, x: x[:, 0:2] * 2, (X,)),
}


@pytest.mark.parametrize("case", sorted(MUTATIONS))
def test_a_wrong_converter_fails_on_the_cpu(case: str) -> None:
    op, mutate, fn, inputs = MUTATIONS[case]
    check_converter(Fn(fn), inputs)  # right as written
    with mutated(op, mutate), pytest.raises(AssertionError):
        check_converter(Fn(fn), inputs)


def test_a_layer_type_it_does_not_evaluate_is_an_error_naming_it() -> None:
    t = trt()
    network = t.Builder(t.Logger(t.Logger.ERROR)).create_network(1 << int(t.NetworkDefinitionCreationFlag.STRONGLY_TYPED))
    x = network.add_input("x", t.float32, (2, 3))
    layer = network.add_padding_nd(x, (1, 1), (1, 1))
    network.mark_output(layer.get_output(0))
    with pytest.raises(ReferenceError, match=r"does not evaluate PADDING layers .*add it to pipeline/engine/reference"):
        run_network(network, {"x": torch.randn(2, 3)})
    with pytest.raises(ReferenceError, match="network input 'x' was not given"):
        run_network(network, {})


def test_float16_networks_round_every_layer_as_tensorrt_stores_them() -> None:
    """A float16 network's tensors are held in float16 after each layer: 1 + 2**-11 rounds to 1."""
    t = trt()
    network = t.Builder(t.Logger(t.Logger.ERROR)).create_network(1 << int(t.NetworkDefinitionCreationFlag.STRONGLY_TYPED))
    x = network.add_input("x", t.float16, (1,))
    tiny = network.add_constant((1,), t.Weights(torch.tensor([2.0**-11], dtype=torch.float16).numpy())).get_output(0)
    once = network.add_elementwise(x, tiny, t.ElementWiseOperation.SUM).get_output(0)
    back = network.add_elementwise(once, tiny, t.ElementWiseOperation.SUB).get_output(0)
    network.mark_output(back)
    (out,) = run_network(network, {"x": torch.ones(1, dtype=torch.float16)}).values()
    assert out.dtype == torch.float16 and float(out) == 1.0 - 2.0**-11


def _gelu_as_relu(ctx: Any, layers: list[Any]) -> None:
    for layer in _of(layers, "ACTIVATION", "IActivationLayer"):
        layer.type = trt().ActivationType.RELU


@pytest.mark.skipif(GPU, reason="on a GPU the validate step runs the engines themselves")
def test_the_compile_step_checks_every_engine_and_validate_says_so_on_the_cpu(tmp_path: Path,
                                                                              caplog: pytest.LogCaptureFixture) -> None:
    """Each engine the compile step builds is run by the reference executor on the values the example
    inputs give it; without a GPU, validation.json says the program was checked so, not by TensorRT's
    kernels, with the error found: small for the mlp as built, large (and said) with GELU built as ReLU."""
    cfg = typed(compose(["model=mlp", "cache.enabled=false"]))
    run_all(cfg, tmp_path / "good", validate=True)
    forward = json.loads((tmp_path / "good" / "validation.json").read_text())["methods"]["forward"]
    reference = forward["reference"]
    assert forward["runtime"] is None and reference["checked_by"] == "reference executor (CPU), not TensorRT's kernels"
    assert reference["engines_checked"] == reference["engines"] == 1 and reference["max_rel_error"] < 1e-5
    assert reference["within_tolerance"] is True
    with mutated(aten.gelu.default, _gelu_as_relu), caplog.at_level(logging.WARNING):
        run_all(cfg, tmp_path / "bad", validate=True)
    reference = json.loads((tmp_path / "bad" / "validation.json").read_text())["methods"]["forward"]["reference"]
    assert reference["max_rel_error"] > 1e-2 and reference["within_tolerance"] is False
    assert "a converter built it wrong" in caplog.text
