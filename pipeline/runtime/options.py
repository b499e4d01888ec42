"""How programs run: which runtime (`EXECUTORS`) and the engine execution options (`RuntimeOptions`,
which the `runtime` config section extends). Imports nothing heavy: the config schema is built on it."""

from __future__ import annotations

from dataclasses import dataclass

EXECUTORS = ("pipeline", "executorch")  # pipeline.runtime, or ExecuTorch's runtime with the native delegate
# When TensorRT-RTX compiles kernels specialized to a new input shape (`kernels`): in the background,
# generic kernels running until then; in the first call with that shape; never. In this order they
# are TensorRT-RTX's own strategy values (its native API takes the index).
KERNELS = ("lazy", "eager", "none")


@dataclass
class RuntimeOptions:
    """Engine execution options.

    Attributes:
        cuda_graph: TensorRT-RTX captures the whole engine in a CUDA graph on first run.
        runtime_cache_path: a file of TensorRT-RTX's just-in-time compiled kernels: read when the first engine
            starts, shared by every engine of the process, written back at exit (`save_runtime_caches`).
        method_graph: `pipeline.runtime` captures a whole method (its engines and the kernels between
            them) in one CUDA graph and replays it while the input shapes stay the same: a call is
            one launch. Engines then compile their shape-specialized kernels before the first run
            returns (a graph must not capture the generic ones), and do not capture graphs of their own.
        fuse_kernels: on CUDA, `pipeline.runtime` runs each run of consecutive elementwise portable
            kernels whose intermediate results nothing else reads as one kernel (`fused_kernels.py`).
        kernels: when TensorRT-RTX compiles kernels specialized to a new input shape, one of
            `KERNELS`: in the background, generic kernels running until then (lazy); in the first
            call with that shape (eager); never (none).
    """

    cuda_graph: bool = False
    runtime_cache_path: str | None = None
    method_graph: bool = False
    fuse_kernels: bool = True
    kernels: str = "lazy"

    @property
    def kernel_strategy(self) -> int:
        """`kernels` as TensorRT-RTX's strategy value (eager under `method_graph`)."""
        return KERNELS.index("eager" if self.method_graph else self.kernels)
