"""Delegate execution: TensorRT delegates run through the TensorRT runtime on the program's shared
CUDA stream; any other backend gets a clear error naming what would be needed."""

from __future__ import annotations

from typing import Any

import torch

from pipeline.delegate import blob
from pipeline.delegate import plan as plans
from pipeline.engine import build_env
from pipeline.engine.trt_api import available
from pipeline.errors import RuntimeUnavailableError
from pipeline.runtime.engine_runner import EngineRunner
from pipeline.runtime.plan_delegate import PlanDelegate


class TensorRTDelegate:
    """One TensorRT delegate of a method: its engine runner and its value indices."""

    def __init__(self, meta: blob.BlobMetadata, ref: blob.EngineRef, args: list[int], program: Any) -> None:
        self.inputs = args[: len(meta.inputs)]
        self.outputs = args[len(meta.inputs):]
        self.runner = EngineRunner(program.engine(ref), meta.io_bindings, program.options, program.stream)
        self.fresh: frozenset[int] = frozenset()  # output positions that may go to new tensors
        self.donated: frozenset[int] = frozenset()  # input positions the engine may update in place
        # Output positions whose value is a state input's own (`write_back.py`) that the engine does not
        # alias: written into a tensor of the delegate's, then copied into the state.
        self.into = frozenset(o for o, v in enumerate(self.outputs) if v in self.inputs and o not in self.runner.aliases)
        self._scratch: dict[int, torch.Tensor] = {}

    @property
    def aliases(self) -> dict[int, int]:
        """Output position -> the input position it updates in place."""
        return self.runner.aliases

    def hand_out(self, indices: set[int]) -> None:
        """Let the outputs at these value indices (the method's own outputs) be written into new
        tensors, which the caller then owns, instead of planned memory that needs a copy."""
        self.fresh = frozenset(k for k, i in enumerate(self.outputs) if i in indices)

    def donate(self, writes_back: set[tuple[int, int]], read_later: set[int]) -> None:
        """Let the engine update in place the inputs the program has it write into (its output value is
        the input's: `write_back.py`), or whose only later use is being overwritten by the output it
        writes into them (`writes_back`: (input value, output value) of the program's state
        write-back): a KV cache then stays where it lives, and the write-back copies nothing."""
        self.donated = frozenset(k for o, k in self.runner.aliases.items() if self.inputs[k] == self.outputs[o] or (
            (self.inputs[k], self.outputs[o]) in writes_back and self.inputs[k] not in read_later))

    def __call__(self, values: list[Any]) -> None:
        # The engine writes straight into planned (or new) output tensors: no copies, no host trips.
        for o in self.into - self._scratch.keys():
            self._scratch[o] = torch.empty_like(values[self.outputs[o]])
        outputs = [self._scratch[o] if o in self.into else values[i] for o, i in enumerate(self.outputs)]
        outs = self.runner(*[values[i] for i in self.inputs], outputs=outputs, fresh=self.fresh, donated=self.donated)
        for o, (i, out) in enumerate(zip(self.outputs, outs)):
            if o in self.into:
                values[i].copy_(out)
            else:
                values[i] = out


def make_delegate(backend: str, payload: bytes, args: list[int], program: Any) -> Any:
    """The executor of one delegate call.

    Raises:
        BlobFormatError: a TensorRT blob that is not whole.
        RuntimeUnavailableError: a backend other than TensorRT, an engine built for another
            NVIDIA_TF32_OVERRIDE (`build_env.py`), or no CUDA / TensorRT here.
    """
    if backend != blob.BACKEND_ID:
        raise RuntimeUnavailableError(
            f"this program has a {backend} delegate, which pipeline.runtime cannot execute; run it with "
            "ExecuTorch's runtime (executorch.runtime), or lower without that backend"
        )
    if plans.is_plan(payload):
        planned = plans.decode(payload)
        meta, ref = planned.engines[0].meta, planned.engines[0].engine
    else:
        planned = None
        meta, ref = blob.decode(payload)
    build_env.check(meta.tf32_override, f"this program's TensorRT engine {ref.sha256[:12]}")
    if not torch.cuda.is_available():
        raise RuntimeUnavailableError("this program has TensorRT delegates, which run on a CUDA GPU; this machine has none "
                                      "visible to PyTorch (run it on a GPU machine)")
    if not available():
        raise RuntimeUnavailableError(
            "this program has TensorRT delegates, which need TensorRT (`pip install -e '.[tensorrt]'` or "
            "'.[tensorrt-rtx]'); neither tensorrt nor tensorrt_rtx imports here"
        )
    if planned is not None:
        return PlanDelegate(planned, args, program)
    return TensorRTDelegate(meta, ref, args, program)
