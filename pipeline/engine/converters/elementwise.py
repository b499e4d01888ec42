"""Converters for binary arithmetic, comparisons, `where`, `pow` and elementwise math."""

from __future__ import annotations

import math
from typing import Any

import torch

from pipeline.engine.context import ConversionContext
from pipeline.engine.converters import _validators as v
from pipeline.engine.converters._layers import elementwise, ew_ops, promoted, unary, unary_ops, unsqueeze_to
from pipeline.engine.converters.registry import aten_op, converter

aten = torch.ops.aten
Node = torch.fx.Node


def _scaled(ctx: ConversionContext, node: Node, b: Any, kwargs: dict[str, Any]) -> Any:
    alpha = kwargs.get("alpha", 1)
    if alpha == 1:
        return b
    if isinstance(b, (int, float)):
        return b * alpha
    b, a = promoted(ctx, node, b, alpha, dtype=ctx.node_dtype(node))
    return elementwise(ctx, ew_ops().PROD, b, a)


_ARITH = v.tensor_dtypes(v.NUMERIC_DTYPES)


@converter(aten.add.Tensor, aten.add.Scalar, validator=_ARITH)
def add(ctx: ConversionContext, node: Node, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    a, b = promoted(ctx, node, args[0], _scaled(ctx, node, args[1], kwargs), ctx.node_dtype(node))
    return elementwise(ctx, ew_ops().SUM, a, b)


@converter(aten.sub.Tensor, aten.sub.Scalar, validator=_ARITH)
def sub(ctx: ConversionContext, node: Node, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    a, b = promoted(ctx, node, args[0], _scaled(ctx, node, args[1], kwargs), ctx.node_dtype(node))
    return elementwise(ctx, ew_ops().SUB, a, b)


@converter(aten.rsub.Scalar, aten.rsub.Tensor, validator=_ARITH)
def rsub(ctx: ConversionContext, node: Node, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    a, b = promoted(ctx, node, args[1], _scaled(ctx, node, args[0], kwargs), ctx.node_dtype(node))
    return elementwise(ctx, ew_ops().SUB, a, b)


@converter(aten.mul.Tensor, aten.mul.Scalar, validator=v.NUMERIC)
def mul(ctx: ConversionContext, node: Node, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    dtype = ctx.node_dtype(node)
    a, b = promoted(ctx, node, args[0], args[1], dtype)
    return elementwise(ctx, ew_ops().AND if dtype == torch.bool else ew_ops().PROD, a, b)


_div_mode = v.all_of(_ARITH, v.arg_in(2, "rounding_mode", (None, "floor"), None))


@converter(aten.div.Tensor, aten.div.Scalar, aten.div.Tensor_mode, aten.div.Scalar_mode, validator=_div_mode)
def div(ctx: ConversionContext, node: Node, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    mode = args[2] if len(args) > 2 else kwargs.get("rounding_mode")
    out_dtype = ctx.node_dtype(node)
    a, b = promoted(ctx, node, args[0], args[1], out_dtype)
    if mode == "floor" and not out_dtype.is_floating_point:
        return elementwise(ctx, ew_ops().FLOOR_DIV, a, b)
    q = elementwise(ctx, ew_ops().DIV, a, b)
    return unary(ctx, q, unary_ops().FLOOR) if mode == "floor" else q


@converter(aten.pow.Tensor_Scalar, aten.pow.Tensor_Tensor, aten.pow.Scalar, validator=v.tensor_dtypes(v.FLOAT_DTYPES))
def pow_(ctx: ConversionContext, node: Node, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    if args[1] == 2:
        x = ctx.tensor(args[0], dtype=ctx.node_dtype(node))
        return elementwise(ctx, ew_ops().PROD, x, x)
    return elementwise(ctx, ew_ops().POW, *promoted(ctx, node, args[0], args[1], ctx.node_dtype(node)))


@converter(aten.maximum.default, validator=v.NUMERIC)
def maximum(ctx: ConversionContext, node: Node, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return elementwise(ctx, ew_ops().MAX, *promoted(ctx, node, args[0], args[1], ctx.node_dtype(node)))


@converter(aten.minimum.default, validator=v.NUMERIC)
def minimum(ctx: ConversionContext, node: Node, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return elementwise(ctx, ew_ops().MIN, *promoted(ctx, node, args[0], args[1], ctx.node_dtype(node)))


# ---- comparisons -------------------------------------------------------------------------------
def _comparison(name: str, op: str, negate: bool, *ops: Any) -> None:
    """Register a comparison: `op` of the promoted operands, negated for ne/ge/le."""

    @converter(*ops, validator=v.NUMERIC)
    def convert(ctx: ConversionContext, node: Node, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        a, b = promoted(ctx, node, args[0], args[1])
        out = elementwise(ctx, getattr(ew_ops(), op), a, b)
        return unary(ctx, out, unary_ops().NOT) if negate else out

    convert.__qualname__ = convert.__name__ = name


_comparison("eq", "EQUAL", False, aten.eq.Tensor, aten.eq.Scalar)
_comparison("ne", "EQUAL", True, aten.ne.Tensor, aten.ne.Scalar)
_comparison("lt", "LESS", False, aten.lt.Tensor, aten.lt.Scalar)
_comparison("ge", "LESS", True, aten.ge.Tensor, aten.ge.Scalar)
_comparison("gt", "GREATER", False, aten.gt.Tensor, aten.gt.Scalar)
_comparison("le", "GREATER", True, aten.le.Tensor, aten.le.Scalar)


@converter(aten.logical_not.default, validator=v.tensor_dtypes({torch.bool}))
def logical_not(ctx: ConversionContext, node: Node, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return unary(ctx, args[0], unary_ops().NOT)


def _logical(name: str, op: Any) -> None:
    @converter(op, validator=v.tensor_dtypes({torch.bool}))
    def convert(ctx: ConversionContext, node: Node, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return elementwise(ctx, getattr(ew_ops(), name), *promoted(ctx, node, args[0], args[1], torch.bool))

    convert.__qualname__ = convert.__name__ = f"logical_{name.lower()}"


_logical("AND", aten.logical_and.default)
_logical("OR", aten.logical_or.default)
_logical("XOR", aten.logical_xor.default)


@converter(aten.where.self, validator=v.NUMERIC)
def where(ctx: ConversionContext, node: Node, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    cond = args[0]
    a, b = promoted(ctx, node, args[1], args[2], ctx.node_dtype(node))
    rank = max(len(cond.shape), len(a.shape), len(b.shape))
    a, b, cond = (unsqueeze_to(ctx, t, rank) for t in (a, b, cond))
    return ctx.network.add_select(cond, a, b).get_output(0)


# ---- elementwise math --------------------------------------------------------------------------
def _unary_converter(op_name: str, *ops: Any, floats_only: bool = True) -> None:
    check = v.tensor_dtypes(v.FLOAT_DTYPES if floats_only else v.NUMERIC_DTYPES)

    @converter(*ops, validator=check)
    def convert(ctx: ConversionContext, node: Node, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return unary(ctx, args[0], getattr(unary_ops(), op_name))

    convert.__qualname__ = convert.__name__ = op_name.lower()


_unary_converter("SQRT", aten.sqrt.default)
_unary_converter("EXP", aten.exp.default)
_unary_converter("LOG", aten.log.default)
_unary_converter("ERF", aten.erf.default)
_unary_converter("SIN", aten.sin.default)
_unary_converter("COS", aten.cos.default)
_unary_converter("RECIP", aten.reciprocal.default)
_unary_converter("FLOOR", aten.floor.default)
_unary_converter("CEIL", aten.ceil.default)
_unary_converter("ROUND", aten.round.default)  # both round half to even
_unary_converter("TAN", aten.tan.default)
_unary_converter("ASIN", aten.asin.default)
_unary_converter("ACOS", aten.acos.default)
_unary_converter("ATAN", aten.atan.default)
_unary_converter("SINH", aten.sinh.default)
_unary_converter("COSH", aten.cosh.default)
_unary_converter("ASINH", aten.asinh.default)
_unary_converter("ACOSH", aten.acosh.default)
_unary_converter("ATANH", aten.atanh.default)
_unary_converter("SIGN", aten.sign.default, floats_only=False)
_unary_converter("NEG", aten.neg.default, floats_only=False)
_unary_converter("ABS", aten.abs.default, floats_only=False)


@converter(aten.round.decimals, validator=v.tensor_dtypes(v.FLOAT_DTYPES))
def round_decimals(ctx: ConversionContext, node: Node, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """torch's `round(x, decimals=d)`: x times 10^d rounded half to even, divided back (for d < 0, x
    divided by 10^-d, rounded, multiplied back), as torch computes it."""
    decimals = int(v.arg(node, 1, "decimals", 0))
    x = args[0]
    scale = ctx.tensor(10.0 ** abs(decimals), like=x)
    if decimals >= 0:
        return elementwise(ctx, ew_ops().DIV, unary(ctx, elementwise(ctx, ew_ops().PROD, x, scale), unary_ops().ROUND), scale)
    return elementwise(ctx, ew_ops().PROD, unary(ctx, elementwise(ctx, ew_ops().DIV, x, scale), unary_ops().ROUND), scale)


@converter(aten.rsqrt.default, validator=v.tensor_dtypes(v.FLOAT_DTYPES))
def rsqrt(ctx: ConversionContext, node: Node, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return unary(ctx, unary(ctx, args[0], unary_ops().SQRT), unary_ops().RECIP)


def _plus_one(ctx: ConversionContext, x: Any, sign: float) -> Any:
    return elementwise(ctx, ew_ops().SUM, x, ctx.tensor(sign, like=x))


@converter(aten.expm1.default, validator=v.FLOAT_ONLY)
def expm1(ctx: ConversionContext, node: Node, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return _plus_one(ctx, unary(ctx, args[0], unary_ops().EXP), -1.0)


@converter(aten.log1p.default, validator=v.FLOAT_ONLY)
def log1p(ctx: ConversionContext, node: Node, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return unary(ctx, _plus_one(ctx, args[0], 1.0), unary_ops().LOG)


# erfinv by M. Giles' single-precision approximation ("Approximating the erfinv function", GPU
# Computing Gems, 2011): a polynomial in w = -log(1 - x^2), one for w < 5 (in w - 2.5), one beyond (in
# sqrt(w) - 3), highest degree first.
_ERFINV_CENTRAL = (2.81022636e-08, 3.43273939e-07, -3.5233877e-06, -4.39150654e-06, 0.00021858087, -0.00125372503,
                   -0.00417768164, 0.246640727, 1.50140941)
_ERFINV_TAIL = (-0.000200214257, 0.000100950558, 0.00134934322, -0.00367342844, 0.00573950773, -0.0076224613,
                0.00943887047, 1.00167406, 2.83297682)


@converter(aten.erfinv.default, validator=v.FLOAT_ONLY)
def erfinv(ctx: ConversionContext, node: Node, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The inverse error function in fp32 (relative error about 1e-7 inside (-1, 1)); +-inf at +-1 and NaN
    beyond, as torch gives."""
    x = ctx.cast(args[0], torch.float32)
    ops, f = ew_ops(), unary_ops()

    def poly(w: Any, coefficients: tuple[float, ...]) -> Any:
        p = ctx.tensor(coefficients[0], like=w)
        for c in coefficients[1:]:
            p = elementwise(ctx, ops.SUM, elementwise(ctx, ops.PROD, p, w), ctx.tensor(c, like=w))
        return p

    one = ctx.tensor(1.0, like=x)
    below, above = elementwise(ctx, ops.SUB, one, x), elementwise(ctx, ops.SUM, one, x)
    w = unary(ctx, unary(ctx, elementwise(ctx, ops.PROD, below, above), f.LOG), f.NEG)
    central = poly(elementwise(ctx, ops.SUB, w, ctx.tensor(2.5, like=w)), _ERFINV_CENTRAL)
    tail = poly(elementwise(ctx, ops.SUB, unary(ctx, w, f.SQRT), ctx.tensor(3.0, like=w)), _ERFINV_TAIL)
    near = elementwise(ctx, ops.LESS, w, ctx.tensor(5.0, like=w))
    out = elementwise(ctx, ops.PROD, ctx.network.add_select(near, central, tail).get_output(0), x)
    edge = elementwise(ctx, ops.EQUAL, unary(ctx, x, f.ABS), one)  # w is inf there, and the tail's sign wrong
    infinite = elementwise(ctx, ops.PROD, x, ctx.tensor(math.inf, like=x))
    return ctx.cast(ctx.network.add_select(edge, infinite, out).get_output(0), ctx.node_dtype(node))


@converter(aten.log2.default, aten.log10.default, validator=v.FLOAT_ONLY)
def log_base(ctx: ConversionContext, node: Node, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    base = 2.0 if aten_op(node.target) == aten.log2.default else 10.0
    log = unary(ctx, args[0], unary_ops().LOG)
    return elementwise(ctx, ew_ops().PROD, log, ctx.tensor(1.0 / math.log(base), like=log))


def _trunc(ctx: ConversionContext, x: Any) -> Any:
    """Round toward zero: floor of |x| with x's sign."""
    return elementwise(ctx, ew_ops().PROD, unary(ctx, unary(ctx, x, unary_ops().ABS), unary_ops().FLOOR),
                       unary(ctx, x, unary_ops().SIGN))


@converter(aten.trunc.default, validator=v.FLOAT_ONLY)
def trunc(ctx: ConversionContext, node: Node, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return _trunc(ctx, args[0])


_FLOORED = (aten.remainder.Scalar, aten.remainder.Tensor)  # remainder floors the quotient, fmod truncates it


@converter(*_FLOORED, aten.fmod.Scalar, aten.fmod.Tensor, validator=v.FLOAT_ONLY)
def remainder(ctx: ConversionContext, node: Node, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """x - q * y with q = floor(x / y) (remainder: the divisor's sign) or trunc(x / y) (fmod: the dividend's)."""
    a, b = promoted(ctx, node, args[0], args[1], ctx.node_dtype(node))
    q = elementwise(ctx, ew_ops().DIV, a, b)
    q = unary(ctx, q, unary_ops().FLOOR) if aten_op(node.target) in _FLOORED else _trunc(ctx, q)
    return elementwise(ctx, ew_ops().SUB, a, elementwise(ctx, ew_ops().PROD, q, b))


_BOOL = v.tensor_dtypes({torch.bool})
_LOGICAL = {aten.bitwise_and.Tensor: "AND", aten.bitwise_or.Tensor: "OR", aten.bitwise_xor.Tensor: "XOR"}


@converter(*_LOGICAL, validator=_BOOL)
def bitwise_bool(ctx: ConversionContext, node: Node, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    a, b = promoted(ctx, node, args[0], args[1], torch.bool)
    return elementwise(ctx, getattr(ew_ops(), _LOGICAL[aten_op(node.target)]), a, b)


@converter(aten.bitwise_not.default, validator=_BOOL)
def bitwise_not(ctx: ConversionContext, node: Node, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return unary(ctx, args[0], unary_ops().NOT)


@converter(aten.isnan.default, validator=v.FLOAT_ONLY)
def isnan(ctx: ConversionContext, node: Node, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return unary(ctx, args[0], unary_ops().ISNAN)
