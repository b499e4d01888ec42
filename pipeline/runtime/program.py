"""Load a `.pte` (and its `.ptd`), list methods with their inputs and outputs, and execute them.

Portable operator calls run as PyTorch kernels; TensorRT delegates run through the TensorRT runtime.
When a program has TensorRT delegates and CUDA is present, every tensor lives on the GPU and every
step (kernels and engines) runs on one shared CUDA stream, so nothing goes back to the host between
consecutive GPU steps.
"""

from __future__ import annotations

import logging
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from pipeline import dtypes
from pipeline.delegate import blob, record
from pipeline.delegate.pte import ProgramFile, read, unvouched
from pipeline.delegate.tensor_spec import TensorSpec, check_call
from pipeline.errors import RuntimeUnavailableError
from pipeline.runtime.delegates import TensorRTDelegate, make_delegate
from pipeline.runtime.engine_runner import LoadedEngine
from pipeline.runtime.fused_kernels import fuse, plan_runs
from pipeline.runtime.kernels import resolve
from pipeline.runtime.method_graph import MethodGraph
from pipeline.runtime.options import RuntimeOptions
from pipeline.runtime.plan_delegate import PlanDelegate
from pipeline.runtime.values import dtype_of, materialise, reads, state_arenas

log = logging.getLogger(__name__)


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
        self._values = materialise(plan, program.raw, program.file.named, program.device, program.state)
        instructions = [i for chain in plan.chains for i in chain.instructions]
        self._steps = [self._step(i) for i in instructions]
        self._donate(instructions)
        if program.options.fuse_kernels and program.device.type == "cuda":
            self._steps = fuse(plan_runs(plan, self._values, self._steps), self._steps)
        kinds = {type(i.instr_args).__name__ for c in plan.chains for i in c.instructions}
        self._has_kernels = "KernelCall" in kinds
        # Engines only read their inputs: a method of engine calls alone binds the caller's input
        # tensors directly (as the raw engine is driven) instead of copying them into planned memory,
        # and its engines write the method's outputs into new tensors handed to the caller as they are.
        self._bind_inputs = kinds <= {"DelegateCall", "FreeCall"} and not program.options.method_graph
        self._planned_inputs = {i: self._values[i] for i in plan.inputs if isinstance(self._values[i], torch.Tensor)}
        self._capacity = {i: t.numel() for i, t in self._planned_inputs.items()}  # planned for the largest shape
        self._specs = program.input_specs(plan)
        self._checked: list[Any] = [None] * len(self._specs)  # (dtype, shape) last found in bounds
        self._bound: dict[int, int] = {}  # input index -> address its engines last read it from
        self._engine_graphs = program.options.cuda_graph and not program.options.method_graph
        self._graph = MethodGraph(self) if program.options.method_graph and program.device.type == "cuda" else None
        handed = {i for i in plan.outputs if i not in plan.inputs} if self._bind_inputs else set()
        for step in self._steps:
            if isinstance(step, (TensorRTDelegate, PlanDelegate)):
                step.hand_out(handed)
        self._slots = {i: self._values[i] for i in handed if isinstance(self._values[i], torch.Tensor)}
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
            return make_delegate(delegate.id, payload, list(call.args), self._program)
        if kind == "MoveCall":
            return lambda values: values.__setitem__(call.move_to, values[call.move_from])
        if kind == "FreeCall":
            return lambda values: None
        raise RuntimeUnavailableError(f"instruction {kind} is not supported by pipeline.runtime")

    def _donate(self, instructions: list[Any]) -> None:
        """Engines that update program state in place (a KV cache) may do so where the state lives
        when nothing after them reads it but its write-back (`TensorRTDelegate.donate`)."""
        for at, step in enumerate(self._steps):
            if not isinstance(step, (TensorRTDelegate, PlanDelegate)) or not step.aliases:
                continue
            writes_back, read_later = set(), set(self._plan.outputs)
            for instruction in instructions[at + 1:]:
                call = instruction.instr_args
                if type(call).__name__ == "KernelCall" and self._plan.operators[call.op_index].name == "aten::copy_":
                    writes_back.add((call.args[0], call.args[1]))
                    read_later.add(call.args[1])
                else:
                    read_later.update(reads(call, self._values))
            step.donate(writes_back, read_later)

    def execute(self, inputs: Sequence[Any], copy_outputs: bool = True) -> list[Any]:
        """Run the method; tensor outputs are on the program's device.

        With `copy_outputs=False` outputs may alias the method's planned memory (as in ExecuTorch's
        own runtime) and then stay valid until the next call. Methods of engine calls alone hand out
        new tensors their engines wrote, never copies (`EngineRunner.__call__` says when, under CUDA
        graphs, they fall back to planned memory). Calling from inside `torch.cuda.stream(method.stream)`
        saves the two cross-stream event waits.
        """
        self._check(inputs)
        try:
            if self._program.record is None:  # nothing vouches for the program's structure
                with unvouched(self._program.file, self._program.where), torch.no_grad():
                    return self._execute_checked(inputs, copy_outputs)
            if torch.is_grad_enabled() and any(getattr(x, "requires_grad", False) for x in inputs):
                with torch.no_grad():  # an input that requires grad must not make planned memory autograd's
                    return self._execute_checked(inputs, copy_outputs)
            return self._execute_checked(inputs, copy_outputs)
        except BaseException as exc:
            if self._program.state:  # a step may have written part of the state: no later call may read it
                self._program.broken = (f"a call of method {self.name!r} failed after it started ({type(exc).__name__}), "
                                        "so the program's state (its KV cache) may be half-written; load the program "
                                        "again")
            raise

    def _execute_checked(self, inputs: Sequence[Any], copy_outputs: bool) -> list[Any]:
        values = self._values  # planned tensors alias arena memory, as in ExecuTorch: one run at a time
        start = time.perf_counter()
        caller = self._program.enter()
        try:
            run = self._run if self._graph is None else self._graph.run
            if self._has_kernels:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")  # out= resizes of dynamic shapes warn in PyTorch
                    outs = run(values, inputs)
            else:  # engines only: nothing warns, and the guard costs microseconds per call
                outs = run(values, inputs)
        finally:
            self._program.leave(caller)
            for i, slot in self._slots.items():  # drop our hold on outputs written to new tensors
                values[i] = slot
        if copy_outputs:  # outputs in arena memory, which the next run reuses: hand out copies, made
            # on the caller's stream (now ordered after the program's), so their memory belongs to it
            outs = [o if self._is_new(i, o) else o.clone() if isinstance(o, torch.Tensor) else o
                    for i, o in zip(self._plan.outputs, outs)]
        if self.first_run_seconds is None:
            self._program.synchronize()
            self.first_run_seconds = time.perf_counter() - start
        return outs

    def _check(self, inputs: Sequence[Any]) -> None:
        """Every input against the program's plan (count, dtype, each dim in its built range, the values
        of integer inputs that index): an input the program was not built for is refused, never
        stretched or cast to fit, before anything runs; a program whose state a failed call may have
        left half-written is refused too."""
        if self._program.broken is not None:
            raise RuntimeUnavailableError(self._program.broken)
        check_call(f"method {self.name!r}", self._specs, inputs, self._checked)

    def _is_new(self, index: int, out: Any) -> bool:
        """Whether output value `index` came back in a new tensor an engine wrote (not planned memory)."""
        slot = self._slots.get(index)
        return slot is not None and out is not slot

    def _binds(self, index: int, value: torch.Tensor, slot: torch.Tensor) -> bool:
        """Whether the engines read the caller's tensor itself rather than a copy in planned memory.

        Only for methods of engine calls alone, and a tensor already in the engine's dtype on the
        device. With CUDA graphs, only while the caller keeps handing in the same buffer: TensorRT-RTX
        captures its graph at fixed addresses and captures it again when one moves (MobileNetV3-Small on
        the H200: 0.98 instead of 0.32 ms a call), so a caller with fresh tensors every call gets a copy
        into planned memory, whose address never moves.
        """
        if not (self._bind_inputs and value.device == slot.device and value.dtype == slot.dtype
                and value.is_contiguous()):
            return False
        address = value.data_ptr()
        if self._engine_graphs and self._bound.get(index, address) != address:
            return False
        self._bound[index] = address
        return True

    def input_buffer(self, position: int, shape: Sequence[int]) -> torch.Tensor | None:
        """The method's own memory for input `position`, shaped `shape` (None for an input the plan
        gives no memory): a caller that writes the next call's input there (as `generate` writes each
        new token) saves the copy in, and with `method_graph` the graph reads it where it is. What is
        written there stays until the caller changes it. Where the plan lets later values reuse the
        input's memory, the input gets memory of its own, where every later call's input goes.

        Raises:
            InputError: `shape` is outside what the program was built for.
        """
        index = self._plan.inputs[position]
        slot = self._planned_inputs.get(index)
        spec = self._specs[position]
        if slot is None or spec is None:
            return None
        spec.check(f"method {self.name!r} input {position}", torch.empty(tuple(shape), dtype=slot.dtype, device="meta"))
        if not self._exclusive(index, slot):
            slot = torch.empty(self._capacity[index], dtype=slot.dtype, device=slot.device)
            self._planned_inputs[index] = slot
            if self._graph is not None:  # a graph captured before reads the planned memory
                self._graph.forget()
        if tuple(slot.shape) != tuple(shape):
            slot.resize_(tuple(shape))
        return slot

    def _exclusive(self, index: int, slot: torch.Tensor) -> bool:
        """No other tensor of the method is planned in any byte of input `index`'s memory `slot`."""
        begin = slot.data_ptr()
        end = begin + self._capacity[index] * slot.element_size()
        for value in self._values:
            if isinstance(value, torch.Tensor) and value is not slot and value.device == slot.device:
                start = value.data_ptr()
                if start < end and begin < start + value.numel() * value.element_size():
                    return False
        return True

    def _run(self, values: list[Any], inputs: Sequence[Any]) -> list[Any]:
        self._stage(values, inputs)
        return self._execute(values)

    def _stage(self, values: list[Any], inputs: Sequence[Any]) -> None:
        """Put the inputs where the steps read them: the caller's tensors, or copies in planned memory."""
        for index, value in zip(self._plan.inputs, inputs):
            slot = self._planned_inputs.get(index)
            if value is slot:  # the caller wrote it in place (`input_buffer`)
                values[index] = slot
            elif slot is None or not isinstance(value, torch.Tensor) or self._binds(index, value, slot):
                values[index] = value
            else:
                if slot.shape != value.shape:  # within the plan: `_check` bounds every dim by it
                    assert value.numel() <= self._capacity[index], "input outgrew its planned memory"
                    slot.resize_(value.shape)
                slot.copy_(value, non_blocking=True)
                values[index] = slot
                self._bound[index] = slot.data_ptr()

    def _execute(self, values: list[Any]) -> list[Any]:
        for step in self._steps:
            step(values)
        return [values[i] for i in self._plan.outputs]


class Program:
    """A loaded `.pte` program."""

    def __init__(self, file: ProgramFile, options: RuntimeOptions, device: str | None, where: str = "program") -> None:
        self.where = where
        self.file = file
        self.raw = file.program
        self.record = file.record
        self.options = options
        uses_trt = any(d.id == blob.BACKEND_ID for p in self.raw.execution_plan for d in p.delegates)
        wanted = device or ("cuda" if uses_trt and torch.cuda.is_available() else "cpu")
        self.device = torch.device(wanted)
        self.stream = torch.cuda.Stream() if self.device.type == "cuda" else None
        if self.stream is not None:  # reused for every call's handoffs (creating events costs a driver call)
            self._caller_ready, self._program_done = torch.cuda.Event(), torch.cuda.Event()
        self._methods: dict[str, Method] = {}
        # Buffers the methods write (a KV cache): one copy for the program, kept across calls.
        self.state = state_arenas([p for p in self.raw.execution_plan if p.name != record.METHOD], self.device)
        self.broken: str | None = None  # why no method may run any more (a failed call left state half-written)
        self._constants = {p.name: p for p in self.raw.execution_plan if p.name != record.METHOD and _constant_plan(p)}
        self._engines: dict[str, LoadedEngine] = {}

    def engine(self, ref: blob.EngineRef) -> LoadedEngine:
        """The engine a delegate names, deserialized once for the program: delegates (of any method)
        that call the same engine share its weights on the device, each with its own context."""
        if ref.sha256 not in self._engines:
            # A view of the mapped file: TensorRT deserializes straight from the page cache, no host copy.
            self._engines[ref.sha256] = LoadedEngine(blob.engine_bytes(ref, self.file.named, checked=True))
        return self._engines[ref.sha256]

    @property
    def method_names(self) -> list[str]:
        return [p.name for p in self.raw.execution_plan if p.name != record.METHOD]

    @property
    def constant_names(self) -> list[str]:
        """The program's constant methods (no inputs, no instructions: they return a stored value)."""
        return list(self._constants)

    def constant(self, name: str) -> Any:
        """The value a constant method returns (an int, float, bool or string)."""
        if name not in self._constants:
            raise KeyError(f"program has no constant method {name!r}; it has {sorted(self._constants)}")
        plan = self._constants[name]
        val = plan.values[plan.outputs[0]].val
        kind = type(val).__name__
        if kind in ("Int", "Bool"):
            return val.int_val if kind == "Int" else val.bool_val
        return float(val.double_val) if kind == "Double" else val.string_val

    def input_specs(self, plan: Any) -> list[TensorSpec | None]:
        """What each input of `plan` may be: the program record's bounds, or for programs without
        one, the planned sizes (dynamic dims up to their planned bound)."""
        if self.record is not None and plan.name in self.record.inputs:
            specs = list(self.record.inputs[plan.name])
            if len(specs) == len(plan.inputs):
                return specs
        out: list[TensorSpec | None] = []
        for index in plan.inputs:
            val = plan.values[index].val
            if type(val).__name__ != "Tensor":
                out.append(None)
                continue
            sizes = tuple(int(d) for d in val.sizes)
            dynamic = int(getattr(val.shape_dynamism, "value", val.shape_dynamism)) != 0
            dtype = dtypes.name_of(dtype_of(val.scalar_type))
            out.append(TensorSpec(dtype, tuple(0 for _ in sizes) if dynamic else sizes, sizes))
        return out

    def method(self, name: str) -> Method:
        """A method by name, loaded (engines deserialized) on first use."""
        if name not in self._methods:
            plans = {p.name: p for p in self.raw.execution_plan if p.name != record.METHOD}
            if name not in plans:
                raise KeyError(f"program has no method {name!r}; it has {self.method_names}")
            with unvouched(self.file, self.where):
                self._methods[name] = Method(self, plans[name])
        return self._methods[name]

    def enter(self) -> Any:
        """Make the program's stream current, ordered after the caller's (inputs may still be in
        flight there); returns the caller's stream for `leave`."""
        if self.stream is None:
            return None
        # The stream id alone answers "already on ours?" in 0.1 us; `torch.cuda.current_stream`
        # builds a Stream object for it (4 us a call on the H200's host).
        if torch._C._cuda_getCurrentStream(self.stream.device_index)[0] == self.stream.stream_id:
            return self.stream
        caller = torch.cuda.current_stream(self.stream.device_index)
        self._caller_ready.record(caller)
        self.stream.wait_event(self._caller_ready)
        torch.cuda.set_stream(self.stream)
        return caller

    def leave(self, caller: Any) -> None:
        """Give the caller back its stream, ordered after the program's (outputs are ready for it)."""
        if caller is None or caller is self.stream:
            return
        self._program_done.record(self.stream)
        torch.cuda.set_stream(caller)
        caller.wait_event(self._program_done)

    def synchronize(self) -> None:
        if self.stream is not None:
            self.stream.synchronize()


def _constant_plan(plan: Any) -> bool:
    return not plan.inputs and len(plan.outputs) == 1 and not any(c.instructions for c in plan.chains) and type(
        plan.values[plan.outputs[0]].val).__name__ in ("Int", "Bool", "Double", "String")


def load(pte: str | Path, ptd: str | Path | None = None, options: RuntimeOptions | None = None,
         device: str | None = None, verify: bool = True) -> Program:
    """Load a program; `ptd` supplies externally stored tensors. Both files are checked first
    (`pipeline.delegate.pte.read`): a damaged file, or a `.ptd` from another build, is refused.

    Raises:
        ArtifactError: a file is malformed or not the program's own.
    """
    file = read(pte, ptd, verify)
    with unvouched(file, str(pte)):
        return Program(file, options or RuntimeOptions(), device, str(pte))
