"""Runs of elementwise portable kernels fused into one CUDA kernel each (the runtime's `fuse_kernels`).

An op a program leaves outside TensorRT often runs as a few elementwise portable kernels (Edge
decomposes hardsigmoid into add, clamp and divide), each a launch of its own between two engines.
On CUDA, each run of consecutive elementwise kernels whose intermediate results nothing else reads
becomes one kernel, written from the ops' arithmetic and compiled at its first call (PyTorch's
jiterator, through NVRTC). Each op's result is rounded to the tensors' dtype, as its own kernel
rounds it; where the kernel cannot be compiled the run's kernels run as they are, with a warning.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from pipeline.runtime.kernels import schema_arguments
from pipeline.runtime.values import reads, state_values

log = logging.getLogger("pipeline.runtime.program")

_FLOATS = (torch.float32, torch.float16, torch.bfloat16)
_MAX_INPUTS = 8  # tensors a jiterator kernel takes


def _clamp(x: str, low: str | None, high: str | None) -> str:
    # Comparisons, not fminf/fmaxf: NaN passes through, as torch.clamp lets it.
    if low is not None:
        x = f"({x} < {low} ? {low} : {x})"
    return x if high is None else f"({x} > {high} ? {high} : {x})"


def _unary(template: str) -> Callable[[dict[str, Any]], str]:
    return lambda a: template.format(x=a["self"])


def _axpy(sign: str) -> Callable[[dict[str, Any]], str]:
    return lambda a: f"{a['self']} {sign} {a['alpha']} * {a['other']}"


def _binary(sign: str) -> Callable[[dict[str, Any]], str]:
    return lambda a: f"{a['self']} {sign} {a['other']}"


# Portable op -> its arithmetic in float, from its operands by schema name (None where absent).
_ARITHMETIC: dict[str, Callable[[dict[str, Any]], str]] = {
    "aten::add.out": _axpy("+"), "aten::add.Scalar_out": _axpy("+"),
    "aten::sub.out": _axpy("-"), "aten::sub.Scalar_out": _axpy("-"),
    "aten::mul.out": _binary("*"), "aten::mul.Scalar_out": _binary("*"),
    "aten::div.out": _binary("/"), "aten::div.Scalar_out": _binary("/"),
    "aten::clamp.out": lambda a: _clamp(a["self"], a["min"], a["max"]),
    "aten::clamp.Tensor_out": lambda a: _clamp(a["self"], a["min"], a["max"]),
    "aten::hardtanh.out": lambda a: _clamp(a["self"], a["min_val"], a["max_val"]),
    "aten::relu.out": lambda a: _clamp(a["self"], "0.0f", None),
    "aten::neg.out": _unary("-{x}"),
    "aten::abs.out": _unary("fabsf({x})"),
    "aten::exp.out": _unary("expf({x})"),
    "aten::sqrt.out": _unary("sqrtf({x})"),
    "aten::rsqrt.out": _unary("rsqrtf({x})"),
    "aten::tanh.out": _unary("tanhf({x})"),
    "aten::sigmoid.out": _unary("1.0f / (1.0f + expf(-{x}))"),
    "aten::silu.out": _unary("{x} / (1.0f + expf(-{x}))"),
    "aten::hardsigmoid.out": lambda a: f"{_clamp(a['self'] + ' + 3.0f', '0.0f', '6.0f')} / 6.0f",
    "aten::hardswish.out": lambda a: f"{a['self']} * {_clamp(a['self'] + ' + 3.0f', '0.0f', '6.0f')} / 6.0f",
}


@dataclass(frozen=True)
class _Op:
    """One elementwise kernel call: its arithmetic, operands by schema name (value indices of tensors,
    literals of scalars, None), and the value it writes."""

    key: str
    operands: dict[str, int | str | None]
    out: int


@dataclass(frozen=True)
class FusedRun:
    """Elementwise kernel calls (instruction positions, among consecutive ones) computed by one
    kernel at the last one's place: `code` of `inputs` (value indices) into value `out`."""

    positions: tuple[int, ...]
    code: str
    inputs: tuple[int, ...]
    out: int


def plan_runs(plan: Any, values: list[Any], steps: Sequence[Any]) -> list[FusedRun]:
    """The runs of a method's elementwise kernel calls that can be one kernel each (two calls or
    more); `steps` are the method's steps, one per instruction (delegates name their outputs)."""
    instructions = [i.instr_args for chain in plan.chains for i in chain.instructions]
    written = set(plan.inputs)
    for call, step in zip(instructions, steps):
        written |= _writes(plan, call, step)
    constants = set(range(len(plan.values))) - written
    readers: dict[int, set[int]] = {}
    for at, call in enumerate(instructions):
        for index in reads(call, values):
            readers.setdefault(index, set()).add(at)
    kept = set(plan.outputs) | set(plan.inputs)
    fixed = set(plan.inputs) | state_values(plan).keys()  # written where they are: never a new tensor
    # Tensors read but never written: views memory planning left in place, over another value's
    # memory. A fused kernel writes a new tensor, which a view of its memory would miss.
    views = [values[i] for i in readers.keys() | kept if i not in written and isinstance(values[i], torch.Tensor)]
    runs, group = [], []
    for at, call in enumerate(instructions + [None]):
        if type(call).__name__ == "FreeCall":
            continue
        op = _op(plan, call, values, constants) if call is not None else None
        if op is not None:
            group.append((at, op))
            continue
        for run in _clusters(group, readers, kept, values):
            if run[-1][1].out not in fixed and not any(_overlap(values[op.out], view) for _, op in run for view in views):
                runs.append(_fused(run))
        group = []
    return runs


def fuse(runs: Sequence[FusedRun], steps: list[Callable[[list[Any]], None]]) -> list[Callable[[list[Any]], None]]:
    """`steps` with each run's calls replaced by one fused kernel (at the run's last position)."""
    out = list(steps)
    for run in runs:
        for at in run.positions:
            out[at] = _skip
        out[run.positions[-1]] = _FusedStep(run, [steps[at] for at in run.positions])
    return out


def _skip(values: list[Any]) -> None:
    return None


class _FusedStep:
    """A run's kernel, compiled at its first call; the run's own kernels where that fails."""

    def __init__(self, run: FusedRun, kernels: list[Callable[[list[Any]], None]]) -> None:
        self.run = run
        self._kernels = kernels
        self._fn: Any = None
        self._failed = False

    def __call__(self, values: list[Any]) -> None:
        inputs = [values[i] for i in self.run.inputs]
        if self._fn is None and not self._failed:
            try:
                fn = torch.cuda.jiterator._create_jit_fn(self.run.code)
                values[self.run.out] = fn(*inputs)
                self._fn = fn
                return
            except RuntimeError as exc:
                self._failed = True
                log.warning("elementwise kernels at instructions %s run one by one: their fused kernel does not "
                            "compile here (%s)", list(self.run.positions), str(exc).splitlines()[0])
        if self._fn is not None:
            values[self.run.out] = self._fn(*inputs)
            return
        for kernel in self._kernels:
            kernel(values)


def _op(plan: Any, call: Any, values: list[Any], constants: set[int]) -> _Op | None:
    """The call as an elementwise op of one floating dtype with constant scalars, or None."""
    if type(call).__name__ != "KernelCall":
        return None
    operator = plan.operators[call.op_index]
    key = f"{operator.name}.{operator.overload}"
    if key not in _ARITHMETIC:
        return None
    names = [spec.name for spec in schema_arguments(operator.name, operator.overload)]
    operands: dict[str, int | str | None] = {}
    dtypes = set()
    for name, index in zip(names, call.args):
        value = values[index]
        if isinstance(value, torch.Tensor):
            operands[name] = index
            dtypes.add(value.dtype)
        elif value is None:
            operands[name] = None
        elif isinstance(value, (int, float)) and not isinstance(value, bool) and index in constants and math.isfinite(value):
            operands[name] = f"{float(value)!r}f"
        else:
            return None
    out = operands.pop("out", None)
    if not isinstance(out, int) or len(dtypes) != 1 or dtypes.pop() not in _FLOATS:
        return None
    return _Op(key, operands, out)


def _clusters(group: list[tuple[int, _Op]], readers: dict[int, set[int]], kept: set[int],
              values: list[Any]) -> list[list[tuple[int, _Op]]]:
    """Consecutive elementwise calls (`group`) as kernels of two ops or more: from the last call back,
    each takes the calls before it whose results only it (and what it took) reads."""
    producer = {op.out: k for k, (_, op) in enumerate(group)}
    taken: set[int] = set()
    out = []
    for root in reversed(range(len(group))):
        if root in taken:
            continue
        cluster, frontier = {root}, [root]
        while frontier:
            for operand in group[frontier.pop()][1].operands.values():
                if not isinstance(operand, int):
                    continue
                k = producer.get(operand)
                if k is None or k in cluster or k in taken or operand in kept:
                    continue
                grown = cluster | {k}
                if readers.get(operand, set()) <= {group[m][0] for m in grown} and _fits(group, grown, values):
                    cluster = grown
                    frontier.append(k)
        taken |= cluster
        if len(cluster) > 1:
            out.append([group[k] for k in sorted(cluster)])
    return out[::-1]


def _fits(group: list[tuple[int, _Op]], cluster: set[int], values: list[Any]) -> bool:
    """Whether the calls `cluster` of `group` can run as one kernel at the last one's place: at most
    `_MAX_INPUTS` tensors in, none of which the calls left in between overwrite (memory planning may
    have given an input's memory to a later value once its last reader, now moved, was done)."""
    produced = {group[k][1].out for k in cluster}
    inputs = {i for k in cluster for i in group[k][1].operands.values() if isinstance(i, int) and i not in produced}
    if len(inputs) > _MAX_INPUTS:
        return False
    between = [group[k][1].out for k in range(min(cluster), max(cluster)) if k not in cluster]
    return not any(o in inputs or _overlap(values[o], values[i]) for o in between for i in inputs)


def _fused(run: list[tuple[int, _Op]]) -> FusedRun:
    """One kernel's code: each op in float, rounded to the dtype as its kernel rounds."""
    names: dict[int, str] = {}
    inputs: list[int] = []
    lines = []
    for n, (_, op) in enumerate(run):
        operands: dict[str, Any] = {}
        for name, operand in op.operands.items():
            if isinstance(operand, int) and operand not in names:
                names[operand] = f"float(in{len(inputs)})"
                inputs.append(operand)
            operands[name] = names[operand] if isinstance(operand, int) else operand
        lines.append(f"  float v{n} = float(T({_ARITHMETIC[op.key](operands)}));")
        names[op.out] = f"v{n}"
    params = ", ".join(f"T in{k}" for k in range(len(inputs)))
    code = "template <typename T> T fused(" + params + ") {\n" + "\n".join(lines) + f"\n  return T(v{len(run) - 1});\n}}"
    return FusedRun(tuple(at for at, _ in run), code, tuple(inputs), run[-1][1].out)


def _writes(plan: Any, call: Any, step: Any) -> set[int]:
    """The value indices an instruction writes."""
    kind = type(call).__name__
    if kind == "MoveCall":
        return {call.move_to}
    if kind == "DelegateCall":
        return set(getattr(step, "outputs", call.args))
    if kind != "KernelCall":
        return set()
    operator = plan.operators[call.op_index]
    if not operator.name.startswith("aten::"):
        return {call.args[-1]}  # executorch_prim ops write their last argument
    arguments = schema_arguments(operator.name, operator.overload)
    out = set(call.args[len(arguments):])  # the returns
    out.update(i for spec, i in zip(arguments, call.args) if spec.alias_info is not None and spec.alias_info.is_write)
    return out


def _overlap(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.device != b.device or a.numel() == 0 or b.numel() == 0:
        return False
    start, other = a.data_ptr(), b.data_ptr()
    return start < other + b.numel() * b.element_size() and other < start + a.numel() * a.element_size()
