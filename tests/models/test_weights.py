"""`model.init`: a factory's own initialisation, or weights in which every layer changes the output."""

import pytest
import torch

from pipeline.config import objects
from pipeline.config.compose import compose, typed
from pipeline.errors import ConfigError
from pipeline.models.weights import show_every_layer
from pipeline.steps.validate import constant_output


class Hidden(torch.nn.Module):
    """Each way a training recipe keeps a layer out of the output at initialisation, next to
    parameters that are constant for other reasons."""

    def __init__(self) -> None:
        super().__init__()
        self.cls_token = torch.nn.Parameter(torch.zeros(1, 1, 8))  # an addition: a token
        self.gain = torch.nn.Parameter(torch.zeros(8, 1, 1))  # NFNet's zero gain on a residual branch
        self.conv = torch.nn.Conv2d(8, 8, 3, padding=1)
        self.norm = torch.nn.BatchNorm2d(8)
        torch.nn.init.zeros_(self.norm.weight)  # zero last norm of a residual branch
        self.gamma = torch.nn.Parameter(torch.full((8, 1, 1), 1e-6))  # layer scale
        self.resweight = torch.nn.Parameter(torch.zeros(()))  # ReZero's gate on a residual branch
        self.ln = torch.nn.LayerNorm(8)  # weight 1 hides nothing, bias 0 is an addition
        self.head = torch.nn.Linear(8, 4)
        torch.nn.init.zeros_(self.head.weight)
        torch.nn.init.zeros_(self.head.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.resweight * self.gamma * self.gain * self.norm(self.conv(x))
        return self.head(self.ln(x.mean((2, 3)) + self.cls_token[:, 0]))


def test_every_layer_sets_only_what_hides_a_layer() -> None:
    model = Hidden().eval()
    x = torch.randn(2, 8, 5, 5)
    assert constant_output(model(x))
    torch.manual_seed(0)
    assert sorted(show_every_layer(model)) == ["gain", "gamma", "head.weight", "norm.weight", "resweight"]
    assert bool((model.gamma == 1).all()) and bool((model.norm.weight == 1).all()) and bool(model.resweight == 1)
    assert float(model.head.weight.detach().std()) > 0.05 and bool((model.head.bias != 0).any())  # nn.Linear's own init
    assert bool((model.gain == 1).all()) and bool((model.ln.weight == 1).all())  # a norm's ones hide nothing
    for offset in (model.cls_token, model.ln.bias, model.norm.bias):  # zero additions stay
        assert bool((offset == 0).all())
    assert bool((model.conv.bias != 0).any()) and float(model(x).detach().std()) > 0
    assert show_every_layer(model) == []  # nothing is left to set


@pytest.mark.parametrize("init", ["factory", "every_layer"])
def test_every_layer_makes_the_blocks_of_timm_resnets_count(init: str) -> None:
    """timm zero-initialises each residual branch's last norm: with the factory's weights every block
    is the identity, and a wrong convolution inside one would not change the output."""
    cfg = typed(compose(["model._target_=timm.create_model", "+model.kwargs.model_name=resnet18",
                                          f"model.init={init}", "model.methods.forward.inputs=[{shape: [2, 3, 64, 64]}]"]))
    model, again = objects.model(cfg), objects.model(cfg)
    assert all(bool((a == b).all()) for a, b in zip(model.state_dict().values(), again.state_dict().values()))
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        before = model(x)
        model.layer1[0].conv1.weight.mul_(-1)
        after = model(x)
    assert torch.equal(before, after) == (init == "factory")


@pytest.mark.parametrize("init", ["factory", "every_layer"])
def test_every_layer_calibrates_batch_norms(init: str) -> None:
    """A fresh batch norm's statistics (0 and 1) let ShuffleNet's activations fade until its output
    hardly depends on the input; calibrated on example inputs, the output follows the input."""
    cfg = typed(compose(["model._target_=torchvision.models.shufflenet_v2_x0_5", f"model.init={init}",
                                          "model.methods.forward.inputs=[{shape: [2, 3, 64, 64]}]"]))
    model = objects.model(cfg)
    spec = cfg.model.methods["forward"]
    with torch.no_grad():
        first, second = model(*objects.example_inputs(spec, 1)), model(*objects.example_inputs(spec, 2))
    moved = float((first - second).abs().max() / first.abs().max())
    assert not model.training and (moved < 1e-3 if init == "factory" else moved > 0.1)
    norms = [m for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    assert all(m.momentum == 0.1 for m in norms)  # the module's own, once calibrated
    assert any(bool((m.running_var != 1).any()) for m in norms) == (init == "every_layer")


def test_a_model_that_cannot_take_a_stacked_batch_is_named() -> None:
    cfg = typed(compose(["model._target_=torchvision.models.shufflenet_v2_x0_5", "model.init=every_layer",
                                          "model.methods.forward.inputs=[{shape: [3, 64, 64]}]"]))
    with pytest.raises(ConfigError, match="model.init=every_layer calibrates batch norms on 8 example inputs of method "
                                          "'forward' stacked on dim 0, which the model cannot take"):
        objects.model(cfg)


@pytest.mark.parametrize("init", ["factory", "every_layer"])
def test_every_layer_makes_queries_and_keys_count(init: str) -> None:
    """At BERT's N(0, 0.02) weights every attention row is near uniform, so a wrong query or key
    projection barely moves the output; at 1/sqrt(fan_in) it does."""
    cfg = typed(compose(["model._target_=pipeline.models.hf.encoder", f"model.init={init}",
                                          "+model.kwargs={architecture: bert, hidden_size: 128, num_hidden_layers: 2, "
                                          "num_attention_heads: 2, intermediate_size: 512}",
                                          "model.methods.forward.inputs=[{shape: [2, 32], dtype: int64, high: 1000}]"]))
    model = objects.model(cfg)
    tokens = objects.example_inputs(cfg.model.methods["forward"], 1)
    query = model.model.encoder.layer[0].attention.self.query.weight
    with torch.no_grad():
        before = model(*tokens)
        query.copy_(query.flip(0))  # a converter that took the rows in the wrong order
        moved = float((model(*tokens) - before).abs().max() / before.abs().max())
    assert (moved < 2e-2) == (init == "factory")
    if init == "every_layer":
        assert abs(float(query.detach().std()) - 128 ** -0.5) < 1e-4
