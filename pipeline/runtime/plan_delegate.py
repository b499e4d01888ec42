"""A TensorRT delegate that is a plan (`delegate/plan.py`): its engines and the project's kernels run in
turn on the program's stream, the values between them in device memory the delegate keeps, so a
decode step moves its token in and its logits out and nothing else."""

from __future__ import annotations

from typing import Any

import torch

from pipeline.delegate import plan as plans
from pipeline.engine import build_env
from pipeline.kernels import decode_attention, driver, formats
from pipeline.runtime.engine_runner import EngineRunner


class PlanDelegate:
    """One plan delegate of a method: its steps and its value indices (as `TensorRTDelegate`'s)."""

    def __init__(self, plan: plans.Plan, args: list[int], program: Any) -> None:
        self.plan = plan
        self.inputs = args[: len(plan.inputs)]
        self.outputs = args[len(plan.inputs):]
        names = [b.name for b in plan.inputs]
        self.aliases = {o: names.index(b.aliases) for o, b in enumerate(plan.outputs) if b.aliases}
        self.fresh: frozenset[int] = frozenset()
        self.donated: frozenset[int] = frozenset()
        self._buffers = {v.name: torch.empty(v.shape, dtype=v.torch_dtype, device="cuda") for v in plan.values}
        self._steps = [self._engine(s, program) if isinstance(s, plans.EngineStep) else
                       self._attention(s, program) if isinstance(s, plans.AttentionStep) else self._kernel(s, program)
                       for s in plan.steps]

    def _engine(self, step: plans.EngineStep, program: Any) -> Any:
        build_env.check(step.meta.tf32_override, f"this program's TensorRT engine {step.engine.sha256[:12]}")
        runner = EngineRunner(program.engine(step.engine), step.meta.io_bindings, program.options, program.stream)
        donated = frozenset(runner.aliases.values())  # the plan hands each step the memory it may write

        def run(local: dict[str, torch.Tensor]) -> None:
            outs = runner(*[local[n] for n in step.inputs], outputs=[local[n] for n in step.outputs], donated=donated)
            for name, out in zip(step.outputs, outs):
                local[name] = out
        return run

    @staticmethod
    def _module(step: plans.KernelStep | plans.AttentionStep, program: Any) -> driver.Module:
        named = program.file.named
        plans.check_data([step.module], named, checked=True)  # `read` checked the file holding it
        return driver.load(named[step.module.key])

    def _attention(self, step: plans.AttentionStep, program: Any) -> Any:
        module, stream = self._module(step, program), program.stream
        shapes = {v.name: v.shape for v in (*self.plan.io_bindings, *self.plan.values)}
        q, k, v, *mask = step.inputs
        sizes = decode_attention.sizes(shapes[q], shapes[k], shapes[v], shapes[mask[0]] if mask else None)
        assert not isinstance(sizes, str)  # the plan's check took it
        out, workspace = step.outputs

        def run(local: dict[str, torch.Tensor]) -> None:
            driver.attention(module, local[q], local[k], local[v], local[mask[0]] if mask else None, local[workspace],
                             local[out], step.scale, sizes, stream)
        return run

    def _kernel(self, step: plans.KernelStep, program: Any) -> Any:
        named = program.file.named
        module = self._module(step, program)

        def tensor(ref: plans.DataRef | None, dtype: torch.dtype) -> torch.Tensor | None:
            if ref is None:
                return None
            plans.check_data([ref], named, checked=True)  # `read` checked the files holding it
            return torch.frombuffer(bytearray(named[ref.key]), dtype=torch.uint8).view(dtype).cuda()

        weight = tensor(step.weight, torch.float16 if step.kernel.startswith("dp_fp16") else torch.uint8)
        format = step.kernel.split("_")[1]
        scales = tensor(step.scales, torch.float32 if format == "fp8" else torch.float16)
        bias = tensor(step.bias, torch.float16)
        assert weight is not None
        packed = formats.PackedWeight(format, step.n, step.k, step.group, weight.view(step.n, -1),
                                      None if scales is None else scales.view(step.n, -1))
        (x_name,), (y_name,) = step.inputs, step.outputs
        stream = program.stream  # the engines' (a method graph captures on it too)

        def run(local: dict[str, torch.Tensor]) -> None:
            x, y = local[x_name], local[y_name]
            driver.product(module, x.reshape(-1, step.k), packed, y.view(-1, step.n), bias, stream)
        return run

    def hand_out(self, indices: set[int]) -> None:
        """As `TensorRTDelegate.hand_out`."""
        self.fresh = frozenset(k for k, i in enumerate(self.outputs) if i in indices)

    def donate(self, writes_back: set[tuple[int, int]], read_later: set[int]) -> None:
        """As `TensorRTDelegate.donate`: state the plan may update where it lives."""
        self.donated = frozenset(k for o, k in self.aliases.items() if self.inputs[k] == self.outputs[o] or (
            (self.inputs[k], self.outputs[o]) in writes_back and self.inputs[k] not in read_later))

    def __call__(self, values: list[Any]) -> None:
        local = dict(self._buffers)
        for k, (binding, i) in enumerate(zip(self.plan.inputs, self.inputs)):
            value = values[i] if isinstance(values[i], torch.Tensor) else torch.tensor(values[i])
            value = value.to("cuda", non_blocking=True)
            local[binding.name] = value if k in self.donated or k not in self.aliases.values() else value.clone()
        into = set()  # outputs that are a state input's new value (`write_back.py`): copied in at the end
        for o, (binding, i) in enumerate(zip(self.plan.outputs, self.outputs)):
            if o in self.aliases:
                continue
            planned = values[i]
            fits = isinstance(planned, torch.Tensor) and planned.is_cuda and planned.shape == binding.shape
            if i in self.inputs:
                into.add(o)
            elif fits and o not in self.fresh:
                local[binding.name] = planned
                continue
            local[binding.name] = self._scratch(binding) if i in self.inputs else torch.empty(
                binding.shape, dtype=binding.torch_dtype, device="cuda")
        for step in self._steps:
            step(local)
        for o, (binding, i) in enumerate(zip(self.plan.outputs, self.outputs)):
            if o in into:
                values[i].copy_(local[binding.name])
            else:
                values[i] = local[binding.aliases or binding.name]

    def _scratch(self, binding: Any) -> torch.Tensor:
        if binding.name not in self._buffers:
            self._buffers[binding.name] = torch.empty(binding.shape, dtype=binding.torch_dtype, device="cuda")
        return self._buffers[binding.name]
