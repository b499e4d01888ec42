"""How far TF32 alone moves a suite model's output, emulated on the CPU: every 2-D convolution's and
linear layer's inputs and weights rounded to TF32's 10 mantissa bits (products exact, sums in fp32,
as on tensor cores), against the fp64 result of the same fp32 model. An engine's error on the GPU
near this number is TF32's, not a converter's.

    python -m bench.experiments.tf32_emulation torchvision/resnet50 timm/efficientvit_b0
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F

from pipeline.config import objects
from pipeline.coverage.run import entry_config
from pipeline.coverage.suite import first_output, select


def tf32(x: torch.Tensor) -> torch.Tensor:
    """`x` rounded to the nearest TF32 value (fp32 with the low 13 mantissa bits cleared)."""
    bits = x.contiguous().view(torch.int32)
    return ((bits + 0x1000) & ~0x1FFF).view(torch.float32)


@contextlib.contextmanager
def emulated(depthwise: bool) -> Iterator[None]:
    """`F.conv2d` and `F.linear` in TF32 while inside (depthwise convolutions too when `depthwise`)."""
    conv2d, linear = F.conv2d, F.linear

    def conv(x: torch.Tensor, w: torch.Tensor, b: Any = None, stride: Any = 1, padding: Any = 0, dilation: Any = 1,
             groups: int = 1) -> torch.Tensor:
        if groups > 1 and groups == x.shape[1] and not depthwise:
            return conv2d(x, w, b, stride, padding, dilation, groups)
        return conv2d(tf32(x), tf32(w), b, stride, padding, dilation, groups)

    F.conv2d, F.linear = conv, lambda x, w, b=None: linear(tf32(x), tf32(w), b)  # type: ignore[assignment]
    try:
        yield
    finally:
        F.conv2d, F.linear = conv2d, linear


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("models", nargs="+", help="suite names, e.g. timm/resnet50")
    args = parser.parse_args()
    for entry in select(args.models):
        cfg = entry_config(entry)
        model = objects.model(cfg)
        inputs = objects.example_inputs(cfg.model.methods["forward"], 1)  # bench/coverage_gpu.py's input
        with torch.no_grad():
            exact = first_output(model.double()(*[x.double() if x.is_floating_point() else x for x in inputs]))
            model.float()
            errors = {}
            for name, depthwise in (("tf32", False), ("tf32 with depthwise", True)):
                with emulated(depthwise):
                    out = first_output(model(*inputs)).double()
                errors[name] = float((out - exact).abs().max() / exact.abs().max())
        print(entry.name, ", ".join(f"{k} {v:.2e}" for k, v in errors.items()), flush=True)


if __name__ == "__main__":
    main()
