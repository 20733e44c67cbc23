"""Elementwise ATen ops: math and activations, arithmetic with torch's type promotion, comparisons and logic,
where/masked_fill, casts and the identities functionalization leaves (clone, alias, copy)."""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from kiln.frontend.torch.importer import Args, AtenCtx, aten
from kiln.graph import symbolic
from kiln.graph.ir import Value

# ATen op → Kiln unary core op: rewrite rules as data
UNARY: dict[str, str] = {
    "relu.default": "Relu", "sigmoid.default": "Sigmoid", "tanh.default": "Tanh", "exp.default": "Exp",
    "log.default": "Log", "sqrt.default": "Sqrt", "neg.default": "Neg", "abs.default": "Abs", "erf.default": "Erf",
    "reciprocal.default": "Reciprocal", "floor.default": "Floor", "ceil.default": "Ceil", "round.default": "Round",
    "sin.default": "Sin", "cos.default": "Cos", "tan.default": "Tan", "sinh.default": "Sinh", "cosh.default": "Cosh",
    "asin.default": "Asin", "acos.default": "Acos", "atan.default": "Atan", "asinh.default": "Asinh",
    "acosh.default": "Acosh", "atanh.default": "Atanh", "sign.default": "Sign", "hardswish.default": "HardSwish",
    "mish.default": "Mish",
}


@aten(*UNARY)
def unary(cx: AtenCtx, a: Args) -> Value:
    return cx.add(UNARY[cx.op], [cx.cast(a["self"], cx.out_dtype())])


@aten("isnan.default")
def isnan(cx: AtenCtx, a: Args) -> Value:
    return cx.add("IsNaN", [a["self"]])


@aten("rsqrt.default")
def rsqrt(cx: AtenCtx, a: Args) -> Value:
    return cx.add("Reciprocal", [cx.add("Sqrt", [cx.cast(a["self"], cx.out_dtype())])])


@aten("log1p.default", "expm1.default", "log2.default", "log10.default", "exp2.default", "trunc.default")
def composite_unary(cx: AtenCtx, a: Args) -> Value:
    x = cx.cast(a["self"], cx.out_dtype())
    one = cx.scalar(1, x.dtype)
    if cx.op == "log1p.default":
        return cx.add("Log", [cx.add("Add", [x, one])])
    if cx.op == "expm1.default":
        return cx.add("Sub", [cx.add("Exp", [x]), one])
    if cx.op in ("log2.default", "log10.default"):
        return cx.add("Mul", [cx.add("Log", [x]), cx.scalar(1 / math.log(2 if "2" in cx.op else 10), x.dtype)])
    if cx.op == "exp2.default":
        return cx.add("Exp", [cx.add("Mul", [x, cx.scalar(math.log(2), x.dtype)])])
    return cx.add("Where", [cx.add("Less", [x, cx.scalar(0, x.dtype)]), cx.add("Ceil", [x]), cx.add("Floor", [x])])


@aten("gelu.default")
def gelu(cx: AtenCtx, a: Args) -> Value:
    return cx.add("Gelu", [a["self"]], approximate=a["approximate"])


@aten("silu.default")
def silu(cx: AtenCtx, a: Args) -> Value:
    return cx.add("Swish", [a["self"]], alpha=1.0)


@aten("hardsigmoid.default")
def hardsigmoid(cx: AtenCtx, a: Args) -> Value:
    return cx.add("HardSigmoid", [a["self"]], alpha=1 / 6, beta=0.5)


@aten("leaky_relu.default")
def leaky_relu(cx: AtenCtx, a: Args) -> Value:
    return cx.add("LeakyRelu", [a["self"]], alpha=float(a["negative_slope"]))


@aten("elu.default")
def elu(cx: AtenCtx, a: Args) -> Value:
    alpha, scale, input_scale = float(a["alpha"]), float(a["scale"]), float(a["input_scale"])
    if input_scale != 1.0:
        raise cx.unsupported(f"input_scale={input_scale}")
    if scale == 1.0:
        return cx.add("Elu", [a["self"]], alpha=alpha)
    return cx.add("Selu", [a["self"]], alpha=alpha, gamma=scale)  # selu is elu with scale: scale·elu(x, alpha)


@aten("softplus.default")
def softplus(cx: AtenCtx, a: Args) -> Value:
    x, beta, threshold = a["self"], float(a["beta"]), float(a["threshold"])
    if threshold < 15:  # torch is linear above beta·x > threshold; log1p(exp(z)) is z within 3e-7 only from 15 on
        raise cx.unsupported(f"threshold {threshold} with beta {beta}")
    if beta == 1.0:
        return cx.add("Softplus", [x])
    y = cx.add("Softplus", [cx.add("Mul", [x, cx.scalar(beta, x.dtype)])])
    return cx.add("Mul", [y, cx.scalar(1 / beta, x.dtype)])


@aten("hardtanh.default", "clamp.default")
def clamp(cx: AtenCtx, a: Args) -> Value:
    lo, hi = (a["min_val"], a["max_val"]) if cx.op == "hardtanh.default" else (a["min"], a["max"])
    x = cx.cast(a["self"], cx.out_dtype())
    return cx.add("Clip", [x], min=-math.inf if lo is None else float(lo), max=math.inf if hi is None else float(hi))


@aten("clamp.Tensor", "clamp_min.default", "clamp_max.default", "clamp_min.Tensor", "clamp_max.Tensor")
def clamp_tensor(cx: AtenCtx, a: Args) -> Value:
    dt = cx.out_dtype()
    x = cx.cast(a["self"], dt)
    lo = a.get("min") if cx.op != "clamp_max.default" and cx.op != "clamp_max.Tensor" else None
    hi = a.get("max") if cx.op != "clamp_min.default" and cx.op != "clamp_min.Tensor" else None
    if lo is not None:
        x = cx.add("Max", [x, cx.tensor(lo, dt)])
    if hi is not None:
        x = cx.add("Min", [x, cx.tensor(hi, dt)])
    return x


# -- arithmetic ------------------------------------------------------------------------------------------------
ARITH: dict[str, str] = {"add": "Add", "sub": "Sub", "mul": "Mul", "div": "Div", "maximum": "Max",
                         "minimum": "Min", "pow": "Pow", "fmax": "Max", "fmin": "Min"}


@aten("add.Tensor", "add.Scalar", "sub.Tensor", "sub.Scalar", "mul.Tensor", "mul.Scalar", "div.Tensor",
      "div.Scalar", "maximum.default", "minimum.default", "pow.Tensor_Tensor", "pow.Scalar", "fmax.default",
      "fmin.default")
def arith(cx: AtenCtx, a: Args) -> Value:
    dt = cx.out_dtype()
    base = cx.op.split(".")[0]
    x, y = a["self"], a.get("other", a.get("exponent"))
    if base in ("add", "sub") and a.get("alpha", 1) != 1:
        y = cx.add("Mul", [cx.tensor(y, dt), cx.scalar(a["alpha"], dt)])
    return cx.add(ARITH[base], [cx.tensor(x, dt), cx.tensor(y, dt)])


@aten("rsub.Scalar", "rsub.Tensor")
def rsub(cx: AtenCtx, a: Args) -> Value:
    dt = cx.out_dtype()
    x = cx.tensor(a["self"], dt)
    if a.get("alpha", 1) != 1:
        x = cx.add("Mul", [x, cx.scalar(a["alpha"], dt)])
    return cx.add("Sub", [cx.tensor(a["other"], dt), x])


@aten("pow.Tensor_Scalar")
def pow_scalar(cx: AtenCtx, a: Args) -> Value:
    x, e = cx.cast(a["self"], cx.out_dtype()), a["exponent"]
    if e == 1:
        return x
    if e == 2:
        return cx.add("Mul", [x, x])
    if e == 3:
        return cx.add("Mul", [cx.add("Mul", [x, x]), x])
    if e == 0.5 and x.dtype.startswith("float"):
        return cx.add("Sqrt", [x])
    if e == -1 and x.dtype.startswith("float"):
        return cx.add("Reciprocal", [x])
    return cx.add("Pow", [x, cx.scalar(e, x.dtype)])


@aten("div.Tensor_mode", "div.Scalar_mode", "floor_divide.default")
def div_mode(cx: AtenCtx, a: Args) -> Value:
    dt = cx.out_dtype()
    mode = "floor" if cx.op == "floor_divide.default" else a["rounding_mode"]
    x, y = cx.tensor(a["self"], dt), cx.tensor(a["other"], dt)
    q = cx.add("Div", [x, y])
    if mode is None or (mode == "trunc" and not dt.startswith("float")):  # integer Div truncates
        return q
    if dt.startswith("float"):
        return cx.add("Floor" if mode == "floor" else "Where", [q] if mode == "floor" else
                      [cx.add("Less", [q, cx.scalar(0, dt)]), cx.add("Ceil", [q]), cx.add("Floor", [q])])
    # integer floor division: the truncated quotient, one lower where it was inexact and the signs differ
    zero = cx.scalar(0, dt)
    inexact = cx.add("Not", [cx.add("Equal", [cx.add("Mul", [q, y]), x])])
    signs = cx.add("Xor", [cx.add("Less", [x, zero]), cx.add("Less", [y, zero])])
    return cx.add("Where", [cx.add("And", [inexact, signs]), cx.add("Sub", [q, cx.scalar(1, dt)]), q])


@aten("remainder.Tensor", "remainder.Scalar", "fmod.Tensor", "fmod.Scalar")
def remainder(cx: AtenCtx, a: Args) -> Value:
    dt = cx.out_dtype()
    return cx.add("Mod", [cx.tensor(a["self"], dt), cx.tensor(a["other"], dt)], fmod=int(cx.op.startswith("fmod")))


# -- comparisons, logic, selection -------------------------------------------------------------------------------
COMPARE: dict[str, str] = {"eq": "Equal", "lt": "Less", "gt": "Greater", "le": "LessOrEqual", "ge": "GreaterOrEqual",
                           "ne": "Equal"}


def promoted(x: Value, y: Value | float | int | bool) -> str:
    """torch.result_type of a tensor and a tensor or Python scalar (0-d tensors count as scalars, as in torch)."""
    import torch

    def probe(v: Any) -> Any:
        return torch.empty((1,) if v.shape else (), dtype=getattr(torch, v.dtype)) if isinstance(v, Value) else v
    return str(torch.result_type(probe(x), probe(y))).replace("torch.", "")


@aten(*(f"{c}.{k}" for c in COMPARE for k in ("Tensor", "Scalar")))
def compare(cx: AtenCtx, a: Args) -> Value:
    x, y = a["self"], a["other"]
    dt = promoted(x, y)
    base = cx.op.split(".")[0]
    r = cx.add(COMPARE[base], [cx.tensor(x, dt), cx.tensor(y, dt)])
    return cx.add("Not", [r]) if base == "ne" else r


@aten("logical_not.default", "bitwise_not.default")
def logical_not(cx: AtenCtx, a: Args) -> Value:
    x = a["self"]
    if cx.op == "bitwise_not.default" and x.dtype != "bool":
        raise cx.unsupported(f"bitwise_not of {x.dtype}")
    return cx.add("Not", [cx.cast(x, "bool")])


@aten("logical_and.default", "logical_or.default", "logical_xor.default", "bitwise_and.Tensor", "bitwise_or.Tensor",
      "bitwise_xor.Tensor", "bitwise_and.Scalar", "bitwise_or.Scalar", "bitwise_xor.Scalar")
def logic(cx: AtenCtx, a: Args) -> Value:
    kind = cx.op.split(".")[0].split("_")[1]  # and / or / xor
    if cx.op.startswith("logical") or cx.out_dtype() == "bool":
        return cx.add(kind.capitalize(), [cx.tensor(a["self"], "bool"), cx.tensor(a["other"], "bool")])
    dt = cx.out_dtype()
    return cx.add({"and": "BitAnd", "or": "BitOr", "xor": "BitXor"}[kind],
                  [cx.tensor(a["self"], dt), cx.tensor(a["other"], dt)])


@aten("where.self", "where.ScalarSelf", "where.ScalarOther", "where.Scalar")
def where(cx: AtenCtx, a: Args) -> Value:
    dt = cx.out_dtype()
    return cx.add("Where", [cx.cast(a["condition"], "bool"), cx.tensor(a["self"], dt), cx.tensor(a["other"], dt)])


@aten("masked_fill.Scalar", "masked_fill.Tensor")
def masked_fill(cx: AtenCtx, a: Args) -> Value:
    dt = cx.out_dtype()
    return cx.add("Where", [cx.cast(a["mask"], "bool"), cx.tensor(a["value"], dt), cx.cast(a["self"], dt)])


# -- casts and identities ------------------------------------------------------------------------------------------
@aten("_to_copy.default", "clone.default", "alias.default", "detach.default", "lift_fresh_copy.default",
      "contiguous.default", "_conj.default", "positive.default", "dropout.default", "native_dropout.default")
def identity(cx: AtenCtx, a: Args) -> Value | list[Value]:
    x = cx.cast(a.get("self", a.get("input")), cx.out_dtype())
    if cx.op in ("dropout.default", "native_dropout.default") and a["train"] and a["p"] > 0:
        raise cx.unsupported("dropout in training mode (random): compile the module in eval()")
    if cx.op == "native_dropout.default":
        return [x, cx.constant(np.ones(x.shape, dtype=bool))]
    return x


@aten("_assert_tensor_metadata.default", "_assert_scalar.default", "_assert_async.msg")
def assertion(cx: AtenCtx, a: Args) -> None:
    """Checks torch.export leaves in the graph about what it traced; shapes and dtypes are fixed here anyway."""
    return None


@aten("copy.default")
def copy(cx: AtenCtx, a: Args) -> Value:
    src, dst = a["src"], a["self"]
    src = cx.cast(src, dst.dtype)
    return src if src.shape == dst.shape else cx.add("Expand", [src], shape=tuple(dst.shape))


@aten("full_like.default", "zeros_like.default", "ones_like.default", "empty_like.default", "full.default")
def full_like(cx: AtenCtx, a: Args) -> Value:
    """A constant; of a symbolic shape (traced with dynamic shapes), the scalar expanded to it at run time."""
    fill = {"zeros_like.default": 0, "ones_like.default": 1, "empty_like.default": 0}.get(cx.op)
    fill = a["fill_value"] if fill is None else fill
    shape = cx.out_shape()
    if symbolic.is_static(shape):
        return cx.constant(np.full(shape, fill, dtype=cx.out_dtype()))
    return cx.add("Expand", [cx.scalar(fill, cx.out_dtype())], shape=shape)


@aten("arange.default", "arange.start", "arange.start_step")
def arange(cx: AtenCtx, a: Args) -> Value:
    """An integer range whose end is a symbolic size (positions, causal masks under dynamic shapes); a constant
    range is evaluated by torch at import."""
    start, end, step = a.get("start") or 0, a["end"], a.get("step") or 1
    if np.dtype(cx.out_dtype()).kind not in "iu":
        raise cx.unsupported(f"a {cx.out_dtype()} arange over a symbolic size: only integer ranges take dims")
    return cx.add("Range", [], start=symbolic.normalize(start), limit=symbolic.normalize(end),
                  delta=symbolic.normalize(step), dtype=cx.out_dtype())
