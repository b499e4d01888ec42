"""Activation, clamp and softmax converters."""

import pytest
import torch
import torch.nn.functional as F

from tests.helpers import Fn, check_converter, refusal

torch.manual_seed(0)
X = torch.randn(2, 8, 5) * 3

CASES = {
    "elu": lambda m, x: F.elu(x, 0.7),
    "selu": lambda m, x: F.selu(x),
    "celu": lambda m, x: F.celu(x, 1.5),
    "softplus": lambda m, x: F.softplus(x),
    "mish": lambda m, x: F.mish(x),
    "logsigmoid": lambda m, x: F.logsigmoid(x),
    "relu": lambda m, x: torch.relu(x),
    "gelu": lambda m, x: F.gelu(x),
    "gelu_tanh": lambda m, x: F.gelu(x, approximate="tanh"),
    "silu": lambda m, x: F.silu(x),
    "sigmoid": lambda m, x: torch.sigmoid(x),
    "tanh": lambda m, x: torch.tanh(x),
    "hardswish": lambda m, x: F.hardswish(x),
    "hardsigmoid": lambda m, x: F.hardsigmoid(x),
    "relu6": lambda m, x: F.relu6(x),
    "leaky_relu": lambda m, x: F.leaky_relu(x, 0.2),
    "clamp": lambda m, x: torch.clamp(x, -1.0, 2.0),
    "clamp_min_only": lambda m, x: torch.clamp(x, min=0.5),
    "clamp_tensor": lambda m, x: torch.clamp(x, min=x.mean(-1, keepdim=True)),
    "softmax": lambda m, x: torch.softmax(x, dim=-1),
    "softmax_dim1": lambda m, x: torch.softmax(x, dim=1),
    "log_softmax": lambda m, x: torch.log_softmax(x, dim=-1),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_builds_engine(name: str) -> None:
    check_converter(Fn(CASES[name]), (X,))


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_honours_precision(precision: str) -> None:
    check_converter(Fn(lambda m, x: torch.softmax(F.gelu(x), -1) + F.hardswish(x)), (X,), precision=precision)


def test_refuses_integer_input() -> None:
    reasons = refusal(Fn(lambda m, x: torch.relu(x)), (torch.randint(-3, 3, (4,), dtype=torch.int32),))
    assert "dtype int32" in reasons["aten.relu.default"]
