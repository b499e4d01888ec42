"""`torch.ops.tensorrt.execute_engine`: the custom op through which an engine-bearing PyTorch
program calls a TensorRT engine. The engine bytes are a uint8 constant of the program; `metadata`
is JSON holding the blob metadata (bindings) and each output's shape as ints or small expressions
over input dims (`in0_1 + 1`), which the fake kernel evaluates so export and lowering can trace it.
"""

from __future__ import annotations

import ast
import functools
import json
import operator
from typing import Any

import torch

from pipeline.errors import RuntimeUnavailableError
from pipeline.tensorrt.blob import BlobMetadata, IOBinding
from pipeline.tensorrt.network import dtype_from_name

OP_NAME = "tensorrt::execute_engine"
_BINOPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv}


def encode_metadata(meta: BlobMetadata, out_shapes: list[list[int | str]], build: dict[str, Any] | None = None) -> str:
    """The op's metadata string (`build`: statistics of the engine build, for lowering reports)."""
    doc = {"io_bindings": [b.to_json() for b in meta.io_bindings], "out_shapes": out_shapes, "build": build or {}}
    return json.dumps(doc, separators=(",", ":"))


def build_info(text: str) -> dict[str, Any]:
    """The build statistics stored with an engine call."""
    return dict(json.loads(text).get("build", {}))


@functools.lru_cache(maxsize=256)
def decode_metadata(text: str) -> tuple[BlobMetadata, list[list[int | str]]]:
    """Inverse of `encode_metadata`."""
    doc = json.loads(text)
    bindings = tuple(IOBinding.from_json(b) for b in doc["io_bindings"])
    return BlobMetadata(io_bindings=bindings), doc["out_shapes"]


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
            "lower it to a .pte with pipeline.export.export instead, or run it on a GPU machine"
        )
    return [t.clone() for t in _runner(engine, metadata)(*inputs)]


@execute_engine.register_fake
def _(inputs: list[torch.Tensor], engine: torch.Tensor, metadata: str) -> list[torch.Tensor]:
    meta, shapes = decode_metadata(metadata)
    return [
        inputs[0].new_empty([eval_dim(d, inputs) for d in shape], dtype=dtype_from_name(b.dtype))
        for b, shape in zip(meta.outputs, shapes)
    ]


_RUNNERS: dict[tuple[int, int, str], Any] = {}


def _runner(engine: torch.Tensor, metadata: str) -> Any:
    from pipeline.tensorrt.engine_runner import EngineRunner

    key = (engine.data_ptr(), engine.numel(), metadata)
    if key not in _RUNNERS:
        meta, _ = decode_metadata(metadata)
        _RUNNERS[key] = EngineRunner(engine.cpu().numpy().tobytes(), meta.io_bindings)
    return _RUNNERS[key]


def is_engine_call(node: torch.fx.Node) -> bool:
    """True for a call of `execute_engine` (ATen or Edge form)."""
    return node.op == "call_function" and "tensorrt.execute_engine" in str(node.target)
