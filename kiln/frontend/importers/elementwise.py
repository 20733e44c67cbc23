"""Elementwise math, activations, casts, comparisons, Where and variadic ops."""
from __future__ import annotations

import numpy as np

from kiln.frontend.context import Ctx, dtype_of
from kiln.frontend.importers.registry import importer
from kiln.graph.ir import Value

# -- elementwise ---------------------------------------------------------------------------------------------
_UNARY = ["Relu", "Sigmoid", "Tanh", "Exp", "Log", "Sqrt", "Neg", "Abs", "Erf", "Reciprocal", "Floor", "Ceil",
          "Round", "Sin", "Cos", "Softplus", "Sign", "Not", "HardSwish", "Mish", "Tan", "Sinh", "Cosh", "Asin",
          "Acos", "Atan", "Asinh", "Acosh", "Atanh", "Softsign", "IsNaN"]


@importer(*_UNARY)
def imp_unary(cx: Ctx, ins: list[Value | None]) -> list[Value]:
    return [cx.add(cx.node.op_type, ins[:1])]


@importer("BitwiseNot")
def imp_bitwise_not(cx: Ctx, ins: list[Value | None]) -> list[Value]:
    return [cx.add("Not", ins[:1])]


@importer("Swish")
def imp_swish(cx: Ctx, ins: list[Value | None]) -> list[Value]:
    return [cx.add("Swish", ins[:1], alpha=float(cx.attr("alpha", 1.0)))]


@importer("Shrink")
def imp_shrink(cx: Ctx, ins: list[Value | None]) -> list[Value]:
    return [cx.add("Shrink", ins[:1], lambd=float(cx.attr("lambd", 0.5)), bias=float(cx.attr("bias", 0.0)))]


@importer("IsInf")
def imp_isinf(cx: Ctx, ins: list[Value | None]) -> list[Value]:
    return [cx.add("IsInf", ins[:1], positive=int(cx.attr("detect_positive", 1)),
                   negative=int(cx.attr("detect_negative", 1)))]


@importer("Identity", "Dropout")
def imp_identity(cx: Ctx, ins: list[Value | None]) -> list[Value]:
    training = len(ins) > 2 and ins[2] is not None and cx.const(ins[2], "training_mode").any()
    ratio = float(cx.const(ins[1], "ratio").reshape(-1)[0]) if len(ins) > 1 and ins[1] is not None else 0.5
    if cx.node.op_type == "Dropout" and training and ratio != 0.0:
        raise cx.unsupported("training_mode=True (random dropout)")
    if cx.node.op_type == "Dropout" and len(cx.node.output) > 1:  # inference: the mask is all true
        return [ins[0], cx.constant(np.ones(ins[0].shape, dtype=bool))]
    return [ins[0]]


@importer("LeakyRelu", "Elu", "HardSigmoid", "Selu", "Gelu", "ThresholdedRelu", "Celu")
def imp_param_unary(cx: Ctx, ins: list[Value | None]) -> list[Value]:
    op = cx.node.op_type
    if op == "LeakyRelu":
        return [cx.add(op, ins[:1], alpha=float(cx.attr("alpha", 0.01)))]
    if op in ("Elu", "Celu", "ThresholdedRelu"):
        return [cx.add(op, ins[:1], alpha=float(cx.attr("alpha", 1.0)))]
    if op == "HardSigmoid":
        return [cx.add(op, ins[:1], alpha=float(cx.attr("alpha", 0.2)), beta=float(cx.attr("beta", 0.5)))]
    if op == "Selu":
        return [cx.add(op, ins[:1], alpha=float(cx.attr("alpha", 1.67326319217681884765625)),
                       gamma=float(cx.attr("gamma", 1.05070102214813232421875)))]
    return [cx.add(op, ins[:1], approximate=cx.attr("approximate", "none"))]  # Gelu


@importer("Clip")
def imp_clip(cx: Ctx, ins: list[Value | None]) -> list[Value]:
    x = ins[0]
    if cx.opset < 11:
        lo, hi = cx.attr("min", -np.inf), cx.attr("max", np.inf)
        return [cx.add("Clip", [x], min=float(lo), max=float(hi))]
    bounds = [ins[i] if len(ins) > i and ins[i] is not None else None for i in (1, 2)]
    if all(b is None or b.const is not None for b in bounds):
        lo, hi = (float(b.const.reshape(-1)[0]) if b is not None else d for b, d in zip(bounds, (-np.inf, np.inf)))
        return [cx.add("Clip", [x], min=lo, max=hi)]
    if bounds[0] is not None:  # run-time bounds: min(max(x, lo), hi), as the spec defines Clip
        x = cx.add("Max", [x, bounds[0]])
    if bounds[1] is not None:
        x = cx.add("Min", [x, bounds[1]])
    return [x]


def cast_to(cx: Ctx, x: Value, to: str) -> Value:
    """Cast; float16 is stored as float32 rounded to half precision (Kiln computes in float32)."""
    if to == "float16":
        y = cx.add("Cast", [x], to="float32") if x.dtype != "float32" else x
        return cx.add("RoundFloat16", [y])
    return cx.add("Cast", [x], to=to)


@importer("Cast")
def imp_cast(cx: Ctx, ins: list[Value | None]) -> list[Value]:
    if cx.attr("saturate", 1) != 1 or cx.attr("round_mode", "up") != "up":
        pass  # only meaningful for float8 targets, which Kiln refuses by type anyway
    return [cast_to(cx, ins[0], dtype_of(cx.attr("to"), cx.name))]


@importer("CastLike")
def imp_cast_like(cx: Ctx, ins: list[Value | None]) -> list[Value]:
    return [cx.add("Cast", [ins[0]], to=ins[1].dtype)]


@importer("Add", "Sub", "Mul", "Div", "Pow", "PRelu", "Equal", "Less", "Greater", "LessOrEqual",
          "GreaterOrEqual", "And", "Or", "Xor", "Mod")
def imp_binary(cx: Ctx, ins: list[Value | None]) -> list[Value]:
    a, b = ins[0], ins[1]
    if cx.node.op_type == "Mod":
        fmod = int(cx.attr("fmod", 0))
        return [cx.add("Mod", [a, b], fmod=fmod)]
    if cx.node.op_type == "PRelu" and len(b.shape) < len(a.shape) and b.shape and b.shape[-1] == a.shape[1] \
            and len(b.shape) == 1 and a.shape[-1] != b.shape[-1]:
        b = cx.add("Reshape", [b], shape=(b.shape[0],) + (1,) * (len(a.shape) - 2))  # opset-7 style slope
    return [cx.add(cx.node.op_type, [a, b])]


@importer("BitwiseAnd", "BitwiseOr", "BitwiseXor")
def imp_bitwise(cx: Ctx, ins: list[Value | None]) -> list[Value]:
    return [cx.add({"BitwiseAnd": "BitAnd", "BitwiseOr": "BitOr", "BitwiseXor": "BitXor"}[cx.node.op_type], ins[:2])]


@importer("Where")
def imp_where(cx: Ctx, ins: list[Value | None]) -> list[Value]:
    return [cx.add("Where", ins[:3])]


@importer("Sum", "Max", "Min", "Mean")
def imp_variadic(cx: Ctx, ins: list[Value | None]) -> list[Value]:
    op = {"Sum": "Add", "Mean": "Add", "Max": "Max", "Min": "Min"}[cx.node.op_type]
    acc = ins[0]
    for v in ins[1:]:
        acc = cx.add(op, [acc, v])
    if cx.node.op_type == "Mean" and len(ins) > 1:
        acc = cx.add("Mul", [acc, cx.constant(np.array(1.0 / len(ins), dtype=acc.dtype))])
    return [acc]
