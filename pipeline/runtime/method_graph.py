"""A method's steps captured and replayed as one CUDA graph (the runtime's `method_graph` option)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from pipeline.errors import RuntimeUnavailableError

if TYPE_CHECKING:
    from pipeline.runtime.program import Method

log = logging.getLogger("pipeline.runtime.program")


class MethodGraph:
    """A method's steps (engines and the kernels between them) as one CUDA graph (the runtime's
    `method_graph` option). A call with the same input dtypes and shapes as the call before it
    is captured, and from then on replayed: the inputs are copied into the method's planned memory
    (nothing, when the caller wrote them there: `Method.input_buffer`) and the graph is launched.
    Other calls run step by step (the first one, which also compiles the engines' kernels, and
    whenever shapes change: one execution context is never replayed under another shape). Outputs
    are the method's planned memory, as with `copy_outputs=False`. A method that cannot be captured
    (a kernel that waits for the host) runs step by step from then on, with a warning.
    """

    def __init__(self, method: Method) -> None:
        self._method = method
        self._key: Any = None  # the last call's input signature
        self._graph: torch.cuda.CUDAGraph | None = None
        self._outs: list[Any] = []
        self._capturable = True

    def forget(self) -> None:
        """Capture again at the next calls: memory a captured graph reads has moved."""
        self._key, self._graph = None, None

    def run(self, values: list[Any], inputs: Sequence[Any]) -> list[Any]:
        method = self._method
        key = tuple((x.dtype, tuple(x.shape)) if isinstance(x, torch.Tensor) else x for x in inputs)
        if self._graph is not None and key == self._key:
            method._stage(values, inputs)
            self._graph.replay()
            return self._outs
        if key != self._key or not self._capturable:
            self._key, self._graph = key, None
            return method._run(values, inputs)
        method._stage(values, inputs)
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph, stream=method.stream):
                outs = method._execute(values)
        except (RuntimeError, RuntimeUnavailableError) as exc:
            self._capturable = False
            log.warning("method %r cannot be captured as one CUDA graph (%s); it runs step by step", method.name, exc)
            return method._run(values, inputs)
        self._graph, self._outs = graph, outs
        graph.replay()
        return outs
