"""Run a serialized TensorRT engine on PyTorch CUDA tensors (the GPU side of every numerical
check, the runtime's delegate executor, and the benchmark's raw-engine timing)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from pipeline.errors import BlobFormatError, InputError, RuntimeUnavailableError
from pipeline.tensorrt.blob import IOBinding
from pipeline.tensorrt.trt_api import flavour, trt


@dataclass(frozen=True)
class RuntimeOptions:
    """Engine execution options.

    Attributes:
        cuda_graph: TensorRT-RTX captures the whole engine in a CUDA graph on first run.
        runtime_cache_path: TensorRT-RTX persistent cache of just-in-time compiled kernels.
        method_graph: `pipeline.runtime` captures a whole method (its engines and the kernels between
            them) in one CUDA graph and replays it while the input shapes stay the same: a call is
            one launch. Engines then compile their shape-specialized kernels before the first run
            returns (a graph must not capture the generic ones), and do not capture graphs of their own.
    """

    cuda_graph: bool = False
    runtime_cache_path: str | None = None
    method_graph: bool = False


def cuda_ready() -> bool:
    """True when CUDA is usable and TensorRT imports."""
    from pipeline.tensorrt.trt_api import available

    return torch.cuda.is_available() and available()


class LoadedEngine:
    """A deserialized engine (weights on the device once), from which any number of runners make
    their own execution contexts.

    Raises:
        RuntimeUnavailableError: no CUDA device, or the engine cannot be deserialized.
    """

    def __init__(self, engine: bytes | memoryview) -> None:
        if not torch.cuda.is_available():
            raise RuntimeUnavailableError("running a TensorRT engine needs a CUDA GPU; none is visible to PyTorch")
        t = trt()
        self._logger = t.Logger(t.Logger.WARNING)
        self._runtime = t.Runtime(self._logger)  # kept alive with the engine
        self.engine = self._runtime.deserialize_cuda_engine(engine)
        if self.engine is None:
            raise RuntimeUnavailableError(f"{flavour().module} could not deserialize the engine (built by another version?)")


class EngineRunner:
    """Executes one engine (bytes, or a `LoadedEngine` shared with other runners) in its own execution
    context; inputs in delegate-argument order, outputs in binding order.

    Raises:
        RuntimeUnavailableError: no CUDA device, or the engine cannot be deserialized.
    """

    def __init__(self, engine: bytes | memoryview | LoadedEngine, bindings: Sequence[IOBinding],
                 options: RuntimeOptions | None = None, stream: torch.cuda.Stream | None = None) -> None:
        t = trt()
        self.options = options or RuntimeOptions()
        self.loaded = engine if isinstance(engine, LoadedEngine) else LoadedEngine(engine)
        self.engine = self.loaded.engine
        self._runtime_cache: Any = None
        self.context = self._make_context(t)
        self.inputs = [b for b in bindings if b.is_input]
        self.outputs = [b for b in bindings if not b.is_input]
        self.stream = stream or torch.cuda.current_stream()
        self._in_dtypes = [b.torch_dtype for b in self.inputs]
        self._out_dtypes = [b.torch_dtype for b in self.outputs]
        self._shapes: dict[str, torch.Size] = {}
        self._addresses: dict[str, int] = {}
        self._out_shapes: list[tuple[int, ...]] | None = None
        self._held: set[str] = set()  # outputs that stay in the caller-given tensors (see __call__)
        self.aliases = _aliases(self.inputs, self.outputs)  # output position -> input it updates in place
        self._aliased = frozenset(self.aliases.values())

    def _make_context(self, t: Any) -> Any:
        if not hasattr(self.engine, "create_runtime_config"):
            return self.engine.create_execution_context()
        config = self.engine.create_runtime_config()
        if self.options.method_graph:  # captured by the method's graph: generic kernels would stay in it
            config.dynamic_shapes_kernel_specialization_strategy = t.DynamicShapesKernelSpecializationStrategy.EAGER
        elif self.options.cuda_graph:
            config.cuda_graph_strategy = t.CudaGraphStrategy.WHOLE_GRAPH_CAPTURE
        if self.options.runtime_cache_path:
            cache = config.create_runtime_cache()
            try:
                with open(self.options.runtime_cache_path, "rb") as f:
                    cache.deserialize(f.read())
            except FileNotFoundError:
                pass
            config.set_runtime_cache(cache)
            self._runtime_cache = cache
        return self.engine.create_execution_context(config)

    def save_runtime_cache(self) -> None:
        """Write the just-in-time kernel cache (TensorRT-RTX) to `runtime_cache_path`."""
        if self._runtime_cache is not None and self.options.runtime_cache_path:
            with open(self.options.runtime_cache_path, "wb") as f:
                f.write(bytes(self._runtime_cache.serialize()))

    def __call__(self, *args: torch.Tensor, outputs: list[torch.Tensor] | None = None,
                 fresh: frozenset[int] = frozenset(), donated: frozenset[int] = frozenset()) -> list[torch.Tensor]:
        """Run on `self.stream`; returns the tensors written, in binding order.

        An output the engine writes in place (`aliases`) is its input's tensor: the caller's own for
        input positions in `donated` (a KV cache updated where it lives), else a copy, so that the
        caller's inputs are only read. Without `outputs` every other output is a new tensor. With
        `outputs` (resized to fit) the engine writes into them, except at the positions in `fresh`,
        which get new tensors. Under a CUDA graph (captured at fixed addresses; TensorRT-RTX captures
        it again whenever a bound address moves) a new tensor is used only where the previous one
        was (the caller let it go and the allocator handed the block back); otherwise that output
        goes to `outputs` from then on.
        Shapes and addresses are handed to TensorRT only when they change: the steady state is one
        `execute_async_v3` call.
        """
        if len(args) != len(self.inputs):
            raise InputError(f"engine takes {len(self.inputs)} inputs, got {len(args)}")
        keep, shapes_changed = self._bind_inputs(args, donated)
        if shapes_changed or self._out_shapes is None:
            self._out_shapes = [tuple(self.context.get_tensor_shape(b.name)) for b in self.outputs]
        outs = []
        for i, (binding, dtype, shape) in enumerate(zip(self.outputs, self._out_dtypes, self._out_shapes)):
            out = keep[self.aliases[i]] if i in self.aliases else self._output(i, binding, dtype, shape, outputs, fresh)
            self._bind(binding.name, out.data_ptr())
            outs.append(out)
        if not self.context.execute_async_v3(self.stream.cuda_stream):
            raise RuntimeUnavailableError("TensorRT failed to execute the engine (see the TensorRT log)")
        return outs

    def _output(self, i: int, binding: IOBinding, dtype: torch.dtype, shape: tuple[int, ...],
                outputs: list[torch.Tensor] | None, fresh: frozenset[int]) -> torch.Tensor:
        """The tensor output `i` is written into (see `__call__`)."""
        if outputs is None or (i in fresh and binding.name not in self._held):
            out = torch.empty(shape, dtype=dtype, device="cuda")
            bound = self._addresses.get(binding.name)
            if outputs is None or not self.options.cuda_graph or bound in (None, out.data_ptr()):
                return out
            self._held.add(binding.name)  # the caller keeps its outputs: stay in `outputs`
        out = outputs[i]  # type: ignore[index]
        if tuple(out.shape) != shape:
            out.resize_(shape)
        return out

    def _bind_inputs(self, args: Sequence[torch.Tensor], donated: frozenset[int]) -> tuple[list[torch.Tensor], bool]:
        """Check and bind the inputs; returns the tensors bound (kept alive) and whether a shape changed."""
        keep = []
        shapes_changed = False
        copied = self._aliased - donated if self._aliased else self._aliased
        for k, (binding, dtype, tensor) in enumerate(zip(self.inputs, self._in_dtypes, args)):
            new_shape = self._shapes.get(binding.name) != tensor.shape
            if new_shape or tensor.dtype != dtype:
                binding.spec.check(f"engine input {binding.name!r}", tensor)  # before TensorRT sees it
            x = tensor if (tensor.is_cuda and tensor.is_contiguous()) else tensor.to(device="cuda").contiguous()
            if k in copied and x is tensor:
                x = x.clone()
            keep.append(x)
            if new_shape:
                if not self.context.set_input_shape(binding.name, tuple(x.shape)):
                    raise InputError(f"engine input {binding.name!r} has shape {list(x.shape)}, which the engine's "
                                     "optimization profile does not take")
                self._shapes[binding.name] = x.shape
                shapes_changed = True
            self._bind(binding.name, x.data_ptr())
        return keep, shapes_changed

    def _bind(self, name: str, address: int) -> None:
        if self._addresses.get(name) != address:
            self.context.set_tensor_address(name, address)
            self._addresses[name] = address


def _aliases(inputs: Sequence[IOBinding], outputs: Sequence[IOBinding]) -> dict[int, int]:
    """Output position -> input position, for outputs written in place into an input's memory.

    Raises:
        BlobFormatError: an output names an input the engine does not have, or one of another dtype or shape.
    """
    names = {b.name: k for k, b in enumerate(inputs)}
    out = {}
    for i, b in enumerate(outputs):
        if not b.aliases:
            continue
        k = names.get(b.aliases)
        if k is None or (inputs[k].dtype, inputs[k].shape) != (b.dtype, b.shape):
            raise BlobFormatError(f"engine output {b.name!r} updates input {b.aliases!r} in place, but the engine has no "
                                  "input of that name, dtype and shape")
        out[i] = k
    return out
