"""Programs handed to ExecuTorch's own runtime, with the project's native TensorRT delegate
(`native/trt/backend.cpp`, built by the install) registered in it.

`load(pte, ptd)` checks both files as `pipeline.runtime.load` does (`pipeline.delegate.pte.read`: digests,
the `.ptd`'s identity, every blob), then loads the program with ExecuTorch 1.4.1's Python runtime:
`executorch.runtime` for a `.pte` alone (its methods share the program's state, so what prefill
writes decode reads), `_load_for_executorch(pte, data_path=ptd)` with a `.ptd` (whose methods do
not share state: a program two of whose methods use one buffer is refused there, in one line naming the
runner that runs it). Every call's inputs are checked against the program record before ExecuTorch
sees them (`TensorSpec`, the same checks as `pipeline.runtime`); the delegate checks them again
against each engine. Outputs are host tensors.

ExecuTorch's Python runtime reads torch's tensors through the torch headers it was built with: under
another torch its conversion may read a tensor wrongly (ExecuTorch 1.5.1's `_C` under torch 2.11 reads
every tensor as having no device; an H100, 2026-12-07). That is `ForeignTorchError`, one line.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from pipeline.delegate import record
from pipeline.delegate.pte import read
from pipeline.delegate.tensor_spec import check_call
from pipeline.errors import RuntimeUnavailableError, first_line
from pipeline.runtime.native_library import load_backend
from pipeline.runtime.options import RuntimeOptions
from pipeline.runtime.program import Program
from pipeline.runtime.values import state_values

FOREIGN_TORCH = "tensor does not have a device"  # what that runtime says of every tensor of a foreign torch


class ForeignTorchError(RuntimeUnavailableError):
    """ExecuTorch's Python runtime cannot read this torch's tensors (it was built for another torch)."""


def _refused(backend: Any, what: str, exc: RuntimeError) -> RuntimeUnavailableError:
    """The one line for a call ExecuTorch's runtime refused: the delegate's own, else the runtime's first."""
    line = backend.pipeline_trt_last_error().decode()
    if line:
        return RuntimeUnavailableError(line)
    said = first_line(exc, 400)
    if FOREIGN_TORCH in said:
        from pipeline.executorch_api import portable_lib

        return ForeignTorchError(
            f"ExecuTorch's Python runtime ({portable_lib().__name__}) cannot read torch {torch.__version__}'s tensors "
            f"({said!r}: it was built for another torch); install the torch it was built for, or run the program "
            "with the native runner (pipeline-runner) or pipeline.runtime")
    return RuntimeUnavailableError(f"ExecuTorch's runtime failed to {what} ({said})")


class NativeMethod:
    """One method of a program loaded in ExecuTorch's runtime."""

    def __init__(self, program: ExecuTorchProgram, name: str) -> None:
        self.name = name
        self._program = program
        self._specs = program.info.input_specs(program.plans[name])
        self.inputs = list(self._specs)
        self._checked: list[Any] = [None] * len(self._specs)  # (dtype, shape) last found in bounds
        self._run = program.runner(name)

    def input_buffer(self, index: int, shape: tuple[int, ...]) -> None:
        return None  # inputs are copied into ExecuTorch's planned memory: the caller keeps its own

    def execute(self, inputs: Sequence[Any], copy_outputs: bool = True) -> list[Any]:
        """Run the method on host copies of `inputs`; returns its outputs as host tensors.

        Raises:
            InputError: an input the program was not built for (before anything runs).
            RuntimeUnavailableError: the delegate refused the call (its line says why).
        """
        where = f"method {self.name!r}"
        check_call(where, self._specs, inputs, self._checked)
        host = [x.detach().cpu().contiguous() if isinstance(x, torch.Tensor) else x for x in inputs]
        backend = self._program.backend
        backend.pipeline_trt_clear_error()
        self._program.apply_options()  # for delegates initialized now
        try:
            outs = self._run(host)
        except RuntimeError as exc:
            raise _refused(backend, f"run {where}", exc) from exc
        return [o.clone() if copy_outputs and isinstance(o, torch.Tensor) else o for o in outs]


class ExecuTorchProgram:
    """A `.pte` (and its `.ptd`) loaded in ExecuTorch's runtime with the native TensorRT delegate."""

    device = torch.device("cpu")  # inputs and outputs are host tensors
    stream = None

    def __init__(self, pte: str | Path, ptd: str | Path | None, options: RuntimeOptions) -> None:
        file = read(pte, ptd)
        self.where = str(pte)
        self.info = Program(file, RuntimeOptions(), "cpu", self.where)  # the program's plans, record and constants
        self.plans = {p.name: p for p in file.program.execution_plan if p.name != record.METHOD}
        self.options = options
        self.backend = load_backend()
        self._methods: dict[str, NativeMethod] = {}
        from pipeline.executorch_api import load_module, load_program

        if ptd is None:
            self._program = load_program(str(pte))
            self._module = None
        else:
            if _shared_state(file.program):
                raise RuntimeUnavailableError(
                    f"{pte}: its methods share state (a KV cache) and its data is in a .ptd, which ExecuTorch 1.4.1's "
                    "Python runtime loads only into methods that keep separate state; run it with the native runner "
                    "(pipeline-runner), with pipeline.runtime, or build it without external data")
            self._module = load_module(str(pte), str(ptd))

    @property
    def method_names(self) -> list[str]:
        return list(self.plans)

    @property
    def constant_names(self) -> list[str]:
        return self.info.constant_names

    def constant(self, name: str) -> Any:
        return self.info.constant(name)

    def method(self, name: str) -> NativeMethod:
        if name not in self._methods:
            if name not in self.plans:
                raise KeyError(f"program has no method {name!r}; it has {self.method_names}")
            self._methods[name] = NativeMethod(self, name)
        return self._methods[name]

    def apply_options(self) -> None:
        """Hand this program's runtime options to the delegate, for delegates initialized from now on."""
        graphs = 2 if self.options.method_graph else int(self.options.cuda_graph)  # each engine call one graph, or RTX's
        self.backend.pipeline_trt_set_cuda_graph(graphs)
        self.backend.pipeline_trt_set_kernel_specialization(self.options.kernel_strategy)

    def runner(self, name: str) -> Any:
        """A function running method `name` on host inputs (its delegates initialized now).

        Raises:
            RuntimeUnavailableError: a delegate refused to initialize (its line says why).
        """
        self.backend.pipeline_trt_clear_error()
        self.apply_options()
        try:
            if self._module is not None:
                module = self._module
                module.method_meta(name)
                return lambda inputs: module.run_method(name, tuple(inputs))
            method = self._program.load_method(name)
        except RuntimeError as exc:
            raise _refused(self.backend, f"load method {name!r} of {self.where}", exc) from exc
        return lambda inputs: method(list(inputs))


def _shared_state(program: Any) -> set[str]:
    """The state buffers more than one method of `program` uses."""
    seen: dict[str, int] = {}
    for plan in program.execution_plan:
        for name in set(state_values(plan).values()):
            seen[name] = seen.get(name, 0) + 1
    return {name for name, count in seen.items() if count > 1}


def load(pte: str | Path, ptd: str | Path | None = None, options: RuntimeOptions | None = None) -> ExecuTorchProgram:
    """Load a program into ExecuTorch's runtime (see the module docstring).

    Raises:
        ArtifactError: a file is malformed or not the program's own.
        RuntimeUnavailableError: the native delegate is not built, or the program cannot run there.
    """
    return ExecuTorchProgram(pte, ptd, options or RuntimeOptions())


def bytes_copied() -> tuple[int, int]:
    """Bytes the native delegate has copied (host to device, device to host) in this process."""
    backend = load_backend()
    return int(backend.pipeline_trt_bytes_to_device()), int(backend.pipeline_trt_bytes_to_host())
