"""`ConversionContext`: the state converters share while one graph becomes one TensorRT network
(the network, the compile spec, the compute dtype, node values, and constants kept alive)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import sympy
import torch
from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

from pipeline import dtypes
from pipeline.engine.compile_spec import TensorRTCompileSpec
from pipeline.engine.trt_api import trt

_NUMPY_SAFE = {torch.float32, torch.int32, torch.int64, torch.bool, torch.int8, torch.uint8}


def torch_to_trt(dtype: torch.dtype) -> Any:
    """The TensorRT data type of a torch dtype."""
    return dtypes.engine_type(dtype, trt())


def trt_to_torch(dtype: Any) -> torch.dtype:
    """The torch dtype of a TensorRT data type."""
    for td in dtypes.ENGINE_DTYPES:
        if torch_to_trt(td) == dtype:
            return td
    raise TypeError(f"TensorRT dtype {dtype} has no torch equivalent ({trt().__name__})")


class ConversionContext:
    """Shared state while converting one graph; converters create layers through it."""

    def __init__(self, network: Any, spec: TensorRTCompileSpec) -> None:
        self.network = network
        self.spec = spec
        self.compute_dtype = dtypes.PRECISIONS[spec.precision]
        self.float32_kept: frozenset[torch.fx.Node] = frozenset()  # what the model keeps float32 (`kept_float32`)
        self.values: dict[torch.fx.Node, Any] = {}
        self.range_constraints: dict[Any, Any] = {}  # symbol -> value range of the program's dims
        self.constants: dict[torch.fx.Node, torch.Tensor] = {}  # constant placeholders and their values
        self.folded: set[torch.fx.Node] = set()  # nodes whose effect another node's layer already applies
        self.in_place: dict[torch.fx.Node, str] = {}  # node -> the network input its output updates in place
        self.symbols: dict[Any, tuple[Any, int]] = {}  # a dim's symbol -> (network input, dim) of that size
        self.channels_last: frozenset[str] = frozenset()  # the bindings held channels last (GraphSource)
        self._keep: list[np.ndarray] = []  # TensorRT reads weights at build time, not at add time
        # The bytes of each constant of a type NumPy lacks (int4, fp8, bfloat16, float16 read raw), by
        # its output's name: TensorRT's Python API gives no access to them (`engine.reference` reads them).
        self.raw_weights: dict[str, np.ndarray] = {}
        from pipeline.engine.quantize import QuantizationPlan

        self.quantized = QuantizationPlan()  # the weights and inputs stored quantized (`quantize.plan`)

    # ---- dtypes -------------------------------------------------------------------------------
    def compute(self, dtype: torch.dtype) -> torch.dtype:
        """Float dtypes become the spec's compute dtype inside the engine; others stay."""
        return self.compute_dtype if dtype in dtypes.FLOAT_DTYPES else dtype

    def node_dtype(self, node: torch.fx.Node) -> torch.dtype:
        """Dtype a node's (first) output has inside the engine: float32 where a half-precision engine keeps
        the model's float32 (`float32_kept`: values made from integers, normalization statistics), else
        its dtype in the compute precision."""
        val = node.meta["val"]
        if isinstance(val, (tuple, list)):
            val = val[0]
        return torch.float32 if node in self.float32_kept else self.compute(val.dtype)

    # ---- tensors ------------------------------------------------------------------------------
    def constant(self, value: Any, dtype: torch.dtype | None = None) -> Any:
        """A constant layer's output holding `value`, in `dtype` (default: compute dtype for floats)."""
        tensor = torch.as_tensor(value).detach().cpu()
        target = dtype if dtype is not None else self.compute(tensor.dtype)
        stored = tensor.to(torch.float32) if tensor.dtype not in _NUMPY_SAFE else tensor
        if stored.dtype == torch.bool:
            stored = stored.to(torch.int32)
        array = np.ascontiguousarray(stored.numpy())
        self._keep.append(array)
        shape = tuple(array.shape) if array.ndim else (1,)
        layer = self.network.add_constant(shape, trt().Weights(array.reshape(shape)))
        out = layer.get_output(0)
        if tensor.ndim == 0:
            out = self.reshape(out, ())
        return self.cast(out, target)

    def raw_constant(self, data: np.ndarray, dtype: Any, shape: tuple[int, ...], count: int) -> Any:
        """A constant of `count` values of TensorRT type `dtype` (int4 and fp8 too) in `shape`, read
        from the bytes of `data` as TensorRT lays that type out."""
        array = np.ascontiguousarray(data)
        self._keep.append(array)
        out = self.network.add_constant(shape, trt().Weights(dtype, array.ctypes.data, count)).get_output(0)
        self.raw_weights[out.name] = array
        return out

    def exact_constant(self, tensor: torch.Tensor) -> Any:
        """A constant holding `tensor` in its own dtype, with no cast layer (a quantization scale)."""
        t = tensor.detach().cpu().contiguous()
        return self.raw_constant(t.reshape(-1).view(torch.uint8).numpy(), torch_to_trt(t.dtype), tuple(t.shape), t.numel())

    def tensor(self, x: Any, like: Any = None, dtype: torch.dtype | None = None) -> Any:
        """`x` as an ITensor: ITensors pass, Python scalars become constants of `like`'s rank and dtype."""
        if _is_itensor(x):
            return x if dtype is None else self.cast(x, dtype)
        if dtype is None:
            dtype = trt_to_torch(like.dtype) if like is not None else None
        t = torch.as_tensor(x)
        if like is not None and t.ndim == 0:
            t = t.reshape((1,) * len(like.shape))
        return self.constant(t, dtype)

    def cast(self, x: Any, dtype: torch.dtype) -> Any:
        """`x` cast to a torch dtype (no layer when it already has it)."""
        target = torch_to_trt(dtype)
        if x.dtype == target:
            return x
        return self.network.add_cast(x, target).get_output(0)

    def reshape(self, x: Any, shape: Sequence[Any]) -> Any:
        """Reshape to `shape`: ints (-1 infers one dim) and, for dynamic sizes, 0-d int ITensors."""
        layer = self.network.add_shuffle(x)
        layer.zero_is_placeholder = False
        if any(_is_itensor(d) for d in shape):
            layer.set_input(1, self.shape_tensor(shape))
        else:
            layer.reshape_dims = tuple(int(d) for d in shape)
        return layer.get_output(0)

    def dims(self, x: Any) -> list[Any]:
        """Sizes of `x`: ints where static, 0-d int64 ITensors where dynamic."""
        return [d if d >= 0 else self.dim_of(x, i) for i, d in enumerate(x.shape)]

    def shape_tensor(self, dims: Sequence[Any]) -> Any:
        """A 1-D int64 shape tensor from ints and scalar/1-element int ITensors."""
        parts = []
        for d in dims:
            if _is_itensor(d):
                parts.append(self.reshape(self.cast(d, torch.int64), (1,)))
            else:
                parts.append(self.constant(torch.tensor([int(d)], dtype=torch.int64)))
        if not parts:
            return self.constant(torch.zeros(0, dtype=torch.int64))
        if len(parts) == 1:
            return parts[0]
        layer = self.network.add_concatenation(parts)
        layer.axis = 0
        return layer.get_output(0)

    def size(self, size: Any) -> Any:
        """A size of the program (an int or SymInt) as an int, or a 0-d int64 tensor computed from the
        dims of the network's inputs (sums and products of their symbols); None where none expresses it."""
        if isinstance(size, int):
            return size
        return self._size_expr(known_size(size))

    def _size_expr(self, expr: Any) -> Any:
        if expr.is_Integer:
            return int(expr)
        if expr.is_Symbol:
            found = self.symbols.get(expr)
            return None if found is None else self.dim_of(*found)
        if not (expr.is_Add or expr.is_Mul):
            return None
        parts = [self._size_expr(a) for a in expr.args]
        if any(p is None for p in parts):
            return None
        op = trt().ElementWiseOperation.SUM if expr.is_Add else trt().ElementWiseOperation.PROD
        out = self.tensor(parts[0], dtype=torch.int64)
        for part in parts[1:]:
            out = self.network.add_elementwise(out, self.tensor(part, dtype=torch.int64), op).get_output(0)
        return out

    def shape_of(self, x: Any) -> Any:
        """The runtime shape of `x` as a 1-D int64 tensor."""
        return self.cast(self.network.add_shape(x).get_output(0), torch.int64)

    def dim_of(self, x: Any, dim: int) -> Any:
        """The runtime size of dim `dim` of `x` as a 0-d int64 tensor."""
        index = self.constant(torch.tensor(dim, dtype=torch.int64), torch.int64)
        return self.network.add_gather(self.shape_of(x), index, 0).get_output(0)


def known_size(size: torch.SymInt) -> Any:
    """The expression of a symbolic size, each number read out of a tensor that a runtime assertion
    equates to other sizes replaced by them (TrOCR's end position `u0`, where export asserts
    `start + T == u0`)."""
    expr = size.node.expr
    for asserts in getattr(size.node.shape_env, "deferred_runtime_asserts", {}).values():
        for check in asserts:
            if not isinstance(check.expr, sympy.Eq):
                continue
            for symbol in sorted(free_unbacked_symbols(expr) & check.expr.free_symbols, key=str):
                solved = sympy.solve(check.expr, symbol)
                if len(solved) == 1 and symbol not in solved[0].free_symbols:
                    expr = sympy.expand(expr.subs(symbol, solved[0]))
    return expr


def _is_itensor(x: Any) -> bool:
    return isinstance(x, trt().ITensor)
