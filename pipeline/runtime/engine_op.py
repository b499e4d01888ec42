"""`torch.ops.tensorrt.execute_engine`: the custom op through which an engine-bearing PyTorch
program calls a TensorRT engine. The engine bytes are a uint8 constant of the program; `metadata` is
the contract's op metadata string (`blob.encode_op_metadata`): bindings, and each output's shape as
ints or small expressions over input dims (`in0_1 + 1`), which the fake kernel evaluates so export
and lowering can trace it."""

from __future__ import annotations

import ast
import operator
from typing import Any

import torch

from pipeline.delegate.blob import decode_op_metadata
from pipeline.errors import RuntimeUnavailableError

OP_NAME = "tensorrt::execute_engine"
_BINOPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv}


def eval_dim(expr: int | str, inputs: list[torch.Tensor]) -> Any:
    """Evaluate an output-dim expression over input sizes (+, -, *, // on names `in<i>_<d>` and ints)."""
    if isinstance(expr, int):
        return expr

    def walk(node: ast.AST) -> Any:
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.Name) and node.id.startswith("in"):
            i, d = node.id[2:].split("_")
            return inputs[int(i)].shape[int(d)]
        if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
            return _BINOPS[type(node.op)](walk(node.left), walk(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -walk(node.operand)
        raise ValueError(f"unsupported output-dim expression {expr!r}")

    return walk(ast.parse(expr, mode="eval").body)


@torch.library.custom_op(OP_NAME, mutates_args=())
def execute_engine(inputs: list[torch.Tensor], engine: torch.Tensor, metadata: str) -> list[torch.Tensor]:
    """Run the engine on CUDA (inputs are moved there); outputs stay on the GPU."""
    if not torch.cuda.is_available():
        raise RuntimeUnavailableError(
            "this program calls TensorRT engines, which run only on a CUDA GPU with TensorRT installed; "
            "lower it to a .pte with pipeline.lowering.export.export instead, or run it on a GPU machine"
        )
    return [t.clone() for t in _runner(engine, metadata)(*inputs)]


@execute_engine.register_fake
def _(inputs: list[torch.Tensor], engine: torch.Tensor, metadata: str) -> list[torch.Tensor]:
    meta, shapes = decode_op_metadata(metadata)
    return [
        inputs[0].new_empty([eval_dim(d, inputs) for d in shape], dtype=b.torch_dtype)
        for b, shape in zip(meta.outputs, shapes)
    ]


_RUNNERS: dict[tuple[int, int, str], Any] = {}


def _runner(engine: torch.Tensor, metadata: str) -> Any:
    from pipeline.runtime.engine_runner import EngineRunner

    key = (engine.data_ptr(), engine.numel(), metadata)
    if key not in _RUNNERS:
        meta, _ = decode_op_metadata(metadata)
        _RUNNERS[key] = EngineRunner(engine.cpu().numpy().tobytes(), meta.io_bindings)
    return _RUNNERS[key]


def is_engine_call(node: torch.fx.Node) -> bool:
    """True for a call of `execute_engine` (ATen or Edge form)."""
    return node.op == "call_function" and "tensorrt.execute_engine" in str(node.target)
