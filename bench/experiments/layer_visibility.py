"""Which layers a comparison with eager PyTorch can see, on the CPU: for each leaf layer with a weight,
scramble that weight (a fixed permutation, as a converter that read it in the wrong order might) and
see whether the model's output moves by more than the tolerance. A layer it does not move is one
whose wrong conversion the suite's GPU check would pass. Factory weights against `model.init:
every_layer` (`pipeline/models/weights.py`).

    python -m bench.experiments.layer_visibility timm/resnet50 hf/bert_tiny
"""

from __future__ import annotations

import argparse
from dataclasses import replace

import torch

from pipeline.config import objects
from pipeline.coverage.run import entry_config
from pipeline.coverage.suite import first_output, select


def unseen_layers(model: torch.nn.Module, inputs: tuple[torch.Tensor, ...], tolerance: float) -> tuple[list[str], int]:
    """The leaf layers whose scrambled weight moves the output by at most `tolerance` (relative to its
    largest magnitude), and how many leaf layers have a weight."""
    unseen, total = [], 0
    with torch.no_grad():
        ref = first_output(model(*inputs))
        scale = float(ref.abs().max())
        for name, layer in model.named_modules():
            weight = getattr(layer, "weight", None)
            if not isinstance(weight, torch.nn.Parameter) or weight.numel() < 2 or next(layer.children(), None):
                continue
            total += 1
            saved = weight.detach().clone()
            order = torch.randperm(weight.numel(), generator=torch.Generator().manual_seed(0))
            weight.copy_(saved.flatten()[order].view_as(weight))
            if torch.equal(weight, saved):  # a constant weight (a norm's ones): scrambling it is a no-op
                weight.add_(saved.abs().mean() + 1e-3)
            moved = float((first_output(model(*inputs)) - ref).abs().max()) / scale if scale else 0.0
            weight.copy_(saved)
            if moved <= tolerance:
                unseen.append(name)
    return unseen, total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("models", nargs="+", help="suite names, e.g. timm/resnet50")
    parser.add_argument("--tolerance", type=float, default=2e-2, help="runtime.max_rel_error")
    args = parser.parse_args()
    for entry in select(args.models):
        cfg = entry_config(entry)
        inputs = objects.example_inputs(cfg.model.methods["forward"], 1)
        for init in ("factory", "every_layer"):
            model = objects.model(replace(cfg, model=replace(cfg.model, init=init)))
            unseen, total = unseen_layers(model, inputs, args.tolerance)
            print(f"{entry.name} {init}: {len(unseen)} of {total} layers unseen {unseen[:4]}", flush=True)


if __name__ == "__main__":
    main()
