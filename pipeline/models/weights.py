"""How a model's random weights are initialised (`model.init`).

A factory's own initialisation is a training recipe, and several recipes hide layers from the output
at initialisation: zero heads (torchvision's ViT, timm's MLP-Mixer: every logit is 0), zero last
norms of residual branches (timm's ResNets, RegNets, CSP nets: every block is the identity), zero
gains (NFNet: the same) and layer scales of 1e-5 or 1e-6 (ConvNeXt, CaiT, PoolFormer: the blocks
add next to nothing). A comparison against eager PyTorch cannot see a wrong converter in a layer the
output does not depend on, so builds that check converters ask for `every_layer`: those parameters
are set so that every layer changes the output, linear layers are drawn at 1/sqrt(fan_in) (at
BERT's 0.02 every attention row is near uniform, and queries and keys do not count), and batch
norms get statistics from a batch of example inputs. Without them (a fresh batch norm's statistics
are 0 and 1) activations vanish or grow layer by layer until the output hardly depends on the
input: GoogLeNet's logits are its head's bias whatever the image, ShuffleNet's move by 5e-5 from
one image to another.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

INITS = ("factory", "every_layer")
# A constant vector below this is a layer scale (ConvNeXt 1e-6, CaiT 1e-5, ResMLP 1e-4), not a weight.
_TINY_SCALE = 1e-3


def calibrate_batch_norms(model: torch.nn.Module, function: str, inputs: Sequence[torch.Tensor]) -> None:
    """Give every batch norm the mean and variance it sees when `function` runs on `inputs` (one pass
    in training mode); the model is left in eval mode."""
    norms = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm) and m.track_running_stats]
    if not norms:
        return
    momenta = [m.momentum for m in norms]
    for m in norms:
        m.reset_running_stats()
        m.momentum = None  # the plain average over the pass
    model.train()
    with torch.no_grad():
        getattr(model, function)(*inputs)
    for m, momentum in zip(norms, momenta):
        m.momentum = momentum
    model.eval()


def show_every_layer(model: torch.nn.Module) -> list[str]:
    """Set, in place, what keeps layers out of the output at initialisation, and return the names of
    the parameters set. A constant parameter that multiplies (its name says weight, gain, scale, gamma
    or alpha) and is zero (a zero head, a zero last norm, NFNet's zero gains, a ReZero gate) becomes
    ones if it is a vector or scalar, else gets the layer's default init; any constant layer scale
    below 1e-3 becomes ones. Zero additions (biases, tokens, position tables) stay: drawn, they add
    constant offsets that in some models outweigh the input (EdgeNeXt's output then moved by 6e-3
    between two inputs, against 0.2 with them zero). Then every linear layer's weight is rescaled to a
    standard deviation of 1/sqrt(fan_in): at the 0.02 of BERT-style recipes attention scores are near
    zero, every softmax row near uniform, and the queries and keys do not change the output."""
    changed = []
    for module_name, module in model.named_modules():
        for name, p in list(module.named_parameters(recurse=False)):
            setting = _setting(name, p)
            if setting is None:
                continue
            with torch.no_grad():
                if setting == "ones":
                    p.fill_(1.0)
                elif isinstance(module, _LAYERS) and name == "weight":
                    module.reset_parameters()
                else:
                    torch.nn.init.kaiming_uniform_(p, a=math.sqrt(5))
            changed.append(f"{module_name}.{name}" if module_name else name)
    for module in model.modules():
        weight = module.weight if isinstance(module, torch.nn.Linear) else getattr(module, "in_proj_weight", None)
        if isinstance(weight, torch.nn.Parameter) and weight.dim() == 2 and float(weight.detach().std()) > 0:
            with torch.no_grad():  # the factory's draw, at a scale that keeps activations at unit size
                weight.mul_(weight.shape[1] ** -0.5 / weight.std())
    return changed


_LAYERS = (torch.nn.Linear, torch.nn.modules.conv._ConvNd)
_MULTIPLIERS = ("weight", "gain", "scale", "gamma", "alpha")


def _setting(name: str, p: torch.nn.Parameter) -> str | None:
    """How `show_every_layer` sets a parameter: "ones", "draw" (a multiplying matrix), or None (left
    as it is: not constant, an addition, or a constant that hides nothing, such as a norm's ones)."""
    if not p.is_floating_point() or p.numel() == 0:
        return None
    flat = p.detach().flatten()
    value = float(flat[0])
    if not bool((flat == value).all()):
        return None
    lowered = name.lower()
    multiplies = "bias" not in lowered and any(word in lowered for word in _MULTIPLIERS)
    if value == 0.0:
        if not multiplies:
            return None
        return "ones" if sum(size > 1 for size in p.shape) <= 1 else "draw"  # a vector, however shaped to broadcast
    return "ones" if "bias" not in lowered and abs(value) < _TINY_SCALE else None
