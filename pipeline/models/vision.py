"""torchvision classifiers with random weights whose activations do not vanish.

Freshly initialised MobileNetV3 outputs ~1e-9 (its batch-norm statistics are the defaults), so a
numerical comparison against it proves nothing: we calibrate batch-norm statistics on one
fixed-seed batch and give linear heads PyTorch's default init, which keeps every layer's
activations, and the logits, at unit scale.
"""

from __future__ import annotations

import torch
import torchvision

from pipeline.models.registry import model_factory
from pipeline.models.weights import calibrate_batch_norms


def _calibrated(model: torch.nn.Module, seed: int, image_size: int) -> torch.nn.Module:
    gen = torch.Generator().manual_seed(seed)
    for m in model.modules():
        if isinstance(m, torch.nn.Linear):  # torchvision's N(0, 0.01) heads shrink logits to ~1e-2
            m.reset_parameters()
    calibrate_batch_norms(model, "forward", [torch.randn(8, 3, image_size, image_size, generator=gen)])
    return model


@model_factory
def mobilenet_v3_small(seed: int = 0, num_classes: int = 1000, image_size: int = 224) -> torch.nn.Module:
    """MobileNetV3-Small, random weights from `seed`, calibrated batch norm, eval mode."""
    torch.manual_seed(seed)
    return _calibrated(torchvision.models.mobilenet_v3_small(num_classes=num_classes), seed, image_size)


@model_factory
def resnet18(seed: int = 0, num_classes: int = 1000, image_size: int = 224) -> torch.nn.Module:
    """ResNet-18, random weights from `seed`, calibrated batch norm, eval mode."""
    torch.manual_seed(seed)
    return _calibrated(torchvision.models.resnet18(num_classes=num_classes), seed, image_size)
