"""Load a `.pte` (and its `.ptd`), list methods with their inputs and outputs, and execute them.

Portable operator calls run as PyTorch kernels; TensorRT delegates run through the TensorRT runtime.
When a program has TensorRT delegates and CUDA is present, every tensor lives on the GPU and every
step (kernels and engines) runs on one shared CUDA stream, so nothing goes back to the host between
consecutive GPU steps.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from pipeline.errors import RuntimeUnavailableError
from pipeline.pte import load_program
from pipeline.runtime.delegates import make_delegate
from pipeline.runtime.kernels import resolve
from pipeline.runtime.values import dtype_of, materialise
from pipeline.tensorrt import blob
from pipeline.tensorrt.engine_runner import RuntimeOptions


@dataclass(frozen=True)
class TensorInfo:
    """A method input or output: dtype and (planned) shape."""

    dtype: torch.dtype
    shape: tuple[int, ...]


class Method:
    """One executable method of a program."""

    def __init__(self, program: Program, plan: Any) -> None:
        self.name = plan.name
        self._plan = plan
        self._program = program
        self._values = materialise(plan, program.raw, program.external, program.device)
        self._steps = [self._step(i) for chain in plan.chains for i in chain.instructions]
        self.first_run_seconds: float | None = None

    @property
    def stream(self) -> Any:
        """The CUDA stream every step of this program runs on (None on CPU)."""
        return self._program.stream

    @property
    def inputs(self) -> list[TensorInfo | type]:
        return [self._info(i) for i in self._plan.inputs]

    @property
    def outputs(self) -> list[TensorInfo | type]:
        return [self._info(i) for i in self._plan.outputs]

    def _info(self, index: int) -> TensorInfo | type:
        val = self._plan.values[index].val
        if type(val).__name__ != "Tensor":
            return type(self._values[index])
        return TensorInfo(dtype_of(val.scalar_type), tuple(int(s) for s in val.sizes))

    def _step(self, instruction: Any) -> Any:
        call = instruction.instr_args
        kind = type(call).__name__
        if kind == "KernelCall":
            op = self._plan.operators[call.op_index]
            fn = resolve(op.name, op.overload)
            args = list(call.args)
            return lambda values: fn(values, args)
        if kind == "DelegateCall":
            delegate = self._plan.delegates[call.delegate_index]
            payload = bytes(self._program.raw.backend_delegate_data[delegate.processed.index].data)
            return make_delegate(delegate.id, payload, list(call.args), self._program.options, self._program.stream)
        if kind == "MoveCall":
            return lambda values: values.__setitem__(call.move_to, values[call.move_from])
        if kind == "FreeCall":
            return lambda values: None
        raise RuntimeUnavailableError(f"instruction {kind} is not supported by pipeline.runtime")

    def execute(self, inputs: Sequence[Any], copy_outputs: bool = True) -> list[Any]:
        """Run the method; tensor outputs are on the program's device.

        With `copy_outputs=False` outputs alias the method's planned memory (as in ExecuTorch's own
        runtime) and stay valid until the next call.
        """
        if len(inputs) != len(self._plan.inputs):
            raise ValueError(f"method {self.name!r} takes {len(self._plan.inputs)} inputs, got {len(inputs)}")
        values = self._values  # planned tensors alias arena memory, as in ExecuTorch: one run at a time
        self._program.wait_for_caller()
        start = time.perf_counter()
        with self._program.stream_context(), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # out= resizes of dynamic shapes warn in PyTorch
            for index, value in zip(self._plan.inputs, inputs):
                if isinstance(value, torch.Tensor) and isinstance(values[index], torch.Tensor):
                    slot = values[index]
                    if slot.shape != value.shape:
                        slot.resize_(value.shape)
                    slot.copy_(value, non_blocking=True)
                else:
                    values[index] = value
            for step in self._steps:
                step(values)
            outs = [values[i] for i in self._plan.outputs]
            if copy_outputs:  # outputs live in arena memory that the next run reuses: hand out copies
                outs = [o.clone() if isinstance(o, torch.Tensor) else o for o in outs]
        if self.first_run_seconds is None:
            self._program.synchronize()
            self.first_run_seconds = time.perf_counter() - start
        self._program.release_to_caller()  # after the copies, so the caller waits for them too
        return outs


class Program:
    """A loaded `.pte` program."""

    def __init__(self, raw: Any, external: dict[str, bytes], options: RuntimeOptions, device: str | None) -> None:
        self.raw = raw
        self.external = external
        self.options = options
        uses_trt = any(d.id == blob.BACKEND_ID for p in raw.execution_plan for d in p.delegates)
        wanted = device or ("cuda" if uses_trt and torch.cuda.is_available() else "cpu")
        self.device = torch.device(wanted)
        self.stream = torch.cuda.Stream() if self.device.type == "cuda" else None
        self._methods: dict[str, Method] = {}

    @property
    def method_names(self) -> list[str]:
        return [p.name for p in self.raw.execution_plan]

    def method(self, name: str) -> Method:
        """A method by name, loaded (engines deserialized) on first use."""
        if name not in self._methods:
            plans = {p.name: p for p in self.raw.execution_plan}
            if name not in plans:
                raise KeyError(f"program has no method {name!r}; it has {self.method_names}")
            self._methods[name] = Method(self, plans[name])
        return self._methods[name]

    def stream_context(self) -> Any:
        return torch.cuda.stream(self.stream) if self.stream is not None else _Null()

    def wait_for_caller(self) -> None:
        """Order the program's stream after the caller's (inputs may still be in flight there)."""
        if self.stream is not None:
            self.stream.wait_stream(torch.cuda.current_stream())

    def release_to_caller(self) -> None:
        """Order the caller's stream after the program's (outputs are ready for it)."""
        if self.stream is not None:
            torch.cuda.current_stream().wait_stream(self.stream)

    def synchronize(self) -> None:
        if self.stream is not None:
            self.stream.synchronize()


class _Null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def load(pte: str | Path, ptd: str | Path | None = None, options: RuntimeOptions | None = None,
         device: str | None = None) -> Program:
    """Load a program; `ptd` supplies externally stored tensors."""
    return Program(load_program(pte), _read_ptd(ptd) if ptd else {}, options or RuntimeOptions(), device)


def _read_ptd(path: str | Path) -> dict[str, bytes]:
    from executorch.exir._serialize._cord import Cord
    from executorch.extension.flat_tensor.serialize.serialize import FlatTensorSerializer

    payload = FlatTensorSerializer().deserialize(Cord(Path(path).read_bytes()))
    return {key: bytes(payload.buffers[entry.buffer_index]) for key, entry in payload.named_data.items()}
