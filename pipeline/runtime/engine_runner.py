"""Run a serialized TensorRT engine on PyTorch CUDA tensors (the GPU side of every numerical
check, the runtime's delegate executor, and the benchmark's raw-engine timing)."""

from __future__ import annotations

import atexit
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from pipeline.delegate.blob import IOBinding
from pipeline.engine import build_env, cache_files
from pipeline.engine.trt_api import flavour, trt
from pipeline.errors import BlobFormatError, InputError, RuntimeUnavailableError
from pipeline.runtime.options import RuntimeOptions

log = logging.getLogger(__name__)


def cuda_ready() -> bool:
    """True when CUDA is usable and TensorRT imports."""
    from pipeline.engine.trt_api import available

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
            major, minor = torch.cuda.get_device_capability()
            found = flavour()
            raise RuntimeUnavailableError(
                f"{found.module} {found.version} could not deserialize the engine (its error is in the log above): "
                f"built by another TensorRT version, or for compute capabilities without this GPU's {major}.{minor} "
                "(compile.target_compute_capabilities); rebuild the program with this toolchain for this GPU")


class EngineRunner:
    """Executes one engine (bytes, or a `LoadedEngine` shared with other runners) in its own execution
    context; inputs in delegate-argument order, outputs in binding order.

    Raises:
        RuntimeUnavailableError: no CUDA device, or the engine cannot be deserialized.
    """

    def __init__(self, engine: bytes | memoryview | LoadedEngine, bindings: Sequence[IOBinding],
                 options: RuntimeOptions | None = None, stream: torch.cuda.Stream | None = None) -> None:
        self.options = options or RuntimeOptions()
        self.loaded = engine if isinstance(engine, LoadedEngine) else LoadedEngine(engine)
        self.engine = self.loaded.engine
        self._context: Any = None
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
        self._profiles = _profiles(self.engine, self.inputs)
        self.profile = -1  # the context's optimization profile

    @property
    def context(self) -> Any:
        """The execution context, made at the first call (its device memory too). A context holds
        one optimization profile, which TensorRT may not let another context hold at the same time:
        made when first used, a context leaves the profiles free until then (a new one takes
        profile 0 if it is free)."""
        if self._context is None:
            self._context = self._make_context(trt())
            if self._context is None:  # TensorRT logged why (e.g. an NVIDIA_TF32_OVERRIDE other than at build)
                raise RuntimeUnavailableError(
                    f"{flavour().module} made no execution context for this engine (its error is in the log above; "
                    f"{build_env.VARIABLE} is {build_env.current() or 'unset'} here)")
            self.profile = int(getattr(self._context, "active_optimization_profile", 0))
        return self._context

    def _make_context(self, t: Any) -> Any:
        if not hasattr(self.engine, "create_runtime_config"):
            return self.engine.create_execution_context()
        config = self.engine.create_runtime_config()
        # under a method graph eager: the graph captured would keep generic kernels
        config.dynamic_shapes_kernel_specialization_strategy = t.DynamicShapesKernelSpecializationStrategy(
            self.options.kernel_strategy)
        if self.options.cuda_graph and not self.options.method_graph:
            config.cuda_graph_strategy = t.CudaGraphStrategy.WHOLE_GRAPH_CAPTURE
        if self.options.runtime_cache_path:
            config.set_runtime_cache(_runtime_cache(config, self.options.runtime_cache_path))
        return self.engine.create_execution_context(config)

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
        changed = []
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
                changed.append(k)
        if changed and len(self._profiles) > 1 and self._select_profile([x.shape for x in keep]):
            changed = list(range(len(keep)))  # a new profile forgets every shape and address
            self._addresses.clear()
        for k in changed:
            name = self.inputs[k].name
            if not self.context.set_input_shape(name, tuple(keep[k].shape)):
                raise InputError(f"engine input {name!r} has shape {list(keep[k].shape)}, which the engine's "
                                 "optimization profile does not take")
            self._shapes[name] = keep[k].shape
        for binding, x in zip(self.inputs, keep):
            self._bind(binding.name, x.data_ptr())
        return keep, bool(changed)

    def _select_profile(self, shapes: Sequence[torch.Size]) -> bool:
        """Switch the context to the narrowest optimization profile that takes `shapes` (a decoder's
        one-token profile for decode, the whole range for a prompt); True when it switched.
        A profile another context holds (TensorRT may let one context use a profile at a time) is
        passed over for the next narrowest."""
        fits = [p for p in self._profiles if all(
            all(lo <= d <= hi for d, lo, hi in zip(shapes[k], low, high)) for k, (low, high) in p.bounds.items())]
        context = self.context
        for profile in sorted(fits, key=lambda p: p.width):
            if profile.index == self.profile:
                return False
            if context.set_optimization_profile_async(profile.index, self.stream.cuda_stream):
                self.profile = profile.index
                return True
        raise InputError(f"no optimization profile of this engine that takes input shapes {[list(s) for s in shapes]} "
                         f"is free: another execution context holds each of profiles {[p.index for p in fits]} (one "
                         "method per profile; give the engine a profile for each method that calls it)")

    def _bind(self, name: str, address: int) -> None:
        if self._addresses.get(name) != address:
            # Refused, TensorRT would keep the tensor's previous address: the engine would read or
            # write memory the caller no longer means. (TensorRT asks for 256-byte alignment.)
            if not self.context.set_tensor_address(name, address):
                raise RuntimeUnavailableError(
                    f"TensorRT did not take the address of engine tensor {name!r} ({address:#x}, {address % 256} bytes "
                    "past a 256-byte boundary; its error is in the log above)")
            self._addresses[name] = address


@dataclass(frozen=True)
class _Profile:
    """One optimization profile of an engine: each dynamic input's [min, max] shape."""

    index: int
    bounds: dict[int, tuple[tuple[int, ...], tuple[int, ...]]]  # input position -> (min shape, max shape)

    @property
    def width(self) -> int:
        return sum(h - lo for low, high in self.bounds.values() for lo, h in zip(low, high))


def _profiles(engine: Any, inputs: Sequence[IOBinding]) -> list[_Profile]:
    """The engine's optimization profiles, as it states them."""
    dynamic = [k for k, b in enumerate(inputs) if b.min_shape]
    out = []
    for index in range(engine.num_optimization_profiles if dynamic else 0):
        shapes = {k: engine.get_tensor_profile_shape(inputs[k].name, index) for k in dynamic}
        out.append(_Profile(index, {k: (tuple(s[0]), tuple(s[2])) for k, s in shapes.items()}))
    return out


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


# runtime_cache_path -> (the one cache every engine of the process shares, the file it was read from:
# (device, inode, size, mtime) or None where there was none)
_RUNTIME_CACHES: dict[str, tuple[Any, tuple[int, ...] | None]] = {}


def _identity(path: str) -> tuple[int, ...] | None:
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return None
    return (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns)


def _runtime_cache(config: Any, path: str) -> Any:
    """The runtime cache of `path`: made (from `config`) and filled from the file on first use. The
    file is claimed as it is read (`cache_files`): a path that holds anything but a TensorRT cache (a
    user's file, a link, a pipe) is refused, since it is replaced at exit.

    Raises:
        RuntimeUnavailableError: naming the path and the fix.
    """
    found = _RUNTIME_CACHES.get(path)
    if found is not None:
        return found[0]
    cache = config.create_runtime_cache()
    identity = _identity(path)
    data = cache_files.check(path, cache_files.RUNTIME)
    if data:
        cache.deserialize(data)  # a cache of another GPU or version is ignored by TensorRT-RTX
    if not _RUNTIME_CACHES:
        atexit.register(save_runtime_caches)
    _RUNTIME_CACHES[path] = (cache, identity)
    return cache


def save_runtime_caches() -> None:
    """Write every runtime cache to its file, whole or not at all (at exit; call it to keep the kernels
    compiled so far now). A file that changed since it was read (another process wrote it, a user put
    one there) is left alone."""
    for path, (cache, identity) in list(_RUNTIME_CACHES.items()):
        if _identity(path) != identity:
            log.warning("runtime cache %s changed since it was read; left as it is (the kernels compiled here are "
                        "not kept)", path)
            continue
        cache_files.write(path, bytes(cache.serialize()), cache_files.RUNTIME)
        _RUNTIME_CACHES[path] = (cache, _identity(path))
