"""Quantization ops: QuantizeLinear / DequantizeLinear (opsets 10–21: per-tensor and per-axis, int8 and uint8),
QLinearConv, QLinearMatMul, MatMulInteger, ConvInteger, DynamicQuantizeLinear.

All of them become Kiln's core ops Quantize, Dequantize, MatMulInteger, ConvInteger and plain float ops
(kiln/graph/quant_ops.py); QLinearConv / QLinearMatMul (the "QOperator" format) are imported in their QDQ form
— Dequantize → Conv/MatMul → Quantize — so one graph pass (quantize_qdq) turns both formats into integer kernels.

A per-axis scale or zero point (1-D, along `axis`) is reshaped to broadcast against its tensor ([C] → [C, 1, 1]
for axis 1 of a rank-4 tensor). A Dequantize of a constant (a weight) is NOT folded at import: quantize_qdq
needs the integer weights; fold_constants folds whatever it leaves."""
from __future__ import annotations

import numpy as np

from kiln.frontend.context import Ctx
from kiln.frontend.importers.nn import _window
from kiln.frontend.importers.registry import _axis, _opt, importer
from kiln.graph.ir import Value
from kiln.graph.quant_ops import QUANT_DTYPES

_ONNX_TYPE_NAMES = {2: "uint8", 3: "int8"}


def _check_type(cx: Ctx, dtype: str, what: str, allowed: tuple[str, ...] = QUANT_DTYPES) -> None:
    if dtype not in allowed:
        raise cx.unsupported(f"{what} of type {dtype}: Kiln supports {', '.join(allowed)}")


def _param(cx: Ctx, p: Value, x: Value, axis: int | None, what: str) -> Value:
    """A scale or zero point made numpy-broadcastable to x: a scalar (or 1-element tensor) as a scalar, a 1-D
    per-axis parameter reshaped to [C, 1, …] at `axis`."""
    if cx.attr("block_size", 0):
        raise cx.unsupported(f"blocked quantization (block_size={cx.attr('block_size')})")
    if p.type.size == 1:
        return p if not p.shape else cx.add("Reshape", [p], shape=())
    rank = len(x.shape)
    if len(p.shape) != 1 or axis is None:
        raise cx.unsupported(f"{what} of shape {list(p.shape)}: a scalar or a 1-D per-axis tensor is supported "
                             f"(input of shape {list(x.shape)})")
    ax = _axis(axis, rank, cx)
    if p.shape[0] != x.shape[ax]:
        raise cx.unsupported(f"per-axis {what} of {p.shape[0]} values along axis {ax}, where the input "
                             f"{list(x.shape)} has {x.shape[ax]}")
    return cx.add("Reshape", [p], shape=(p.shape[0],) + (1,) * (rank - 1 - ax))


def _zero(cx: Ctx, dtype: str) -> Value:
    return cx.constant(np.array(0, dtype=dtype))


def _axis_attr(cx: Ctx) -> int | None:
    return int(cx.attr("axis", 1)) if cx.opset >= 13 else None


def quantize(cx: Ctx, x: Value, scale: Value, zp: Value | None, axis: int | None, to: str | None = None) -> Value:
    to = zp.dtype if zp is not None else (to or "uint8")
    _check_type(cx, to, "zero point")
    _check_type(cx, x.dtype, "QuantizeLinear input", ("float32",))
    zp = zp if zp is not None else _zero(cx, to)
    return cx.add("Quantize", [x, _param(cx, scale, x, axis, "scale"), _param(cx, zp, x, axis, "zero point")], to=to)


def dequantize(cx: Ctx, x: Value, scale: Value, zp: Value | None, axis: int | None) -> Value:
    """Dequantize, kept as a node even for a constant x (its integer weights are what quantize_qdq wants)."""
    _check_type(cx, x.dtype, "DequantizeLinear input", QUANT_DTYPES + ("int32",))
    _check_type(cx, scale.dtype, "DequantizeLinear scale", ("float32",))
    zp = zp if zp is not None else _zero(cx, x.dtype)
    if zp.dtype != x.dtype:
        raise cx.unsupported(f"zero point of type {zp.dtype} for a {x.dtype} input")
    args = [x, _param(cx, scale, x, axis, "scale"), _param(cx, zp, x, axis, "zero point")]
    return cx.graph.add("Dequantize", args, {}, name=cx.name)[0]


@importer("QuantizeLinear")
def imp_quantize_linear(cx: Ctx, ins: list[Value | None]) -> list[Value]:
    if cx.attr("saturate", 1) != 1 and cx.opset >= 19:
        raise cx.unsupported("saturate=0 (float8 outputs)")
    out = cx.attr("output_dtype", 0)
    if out and out not in _ONNX_TYPE_NAMES:
        raise cx.unsupported(f"output_dtype {out}: Kiln quantizes to int8 or uint8")
    return [quantize(cx, ins[0], ins[1], _opt(ins, 2), _axis_attr(cx), _ONNX_TYPE_NAMES.get(out))]


@importer("DequantizeLinear")
def imp_dequantize_linear(cx: Ctx, ins: list[Value | None]) -> list[Value]:
    return [dequantize(cx, ins[0], ins[1], _opt(ins, 2), _axis_attr(cx))]


@importer("QLinearMatMul")
def imp_qlinear_matmul(cx: Ctx, ins: list[Value | None]) -> list[Value]:
    a, a_s, a_zp, b, b_s, b_zp, y_s, y_zp = ins[:8]
    if len(a.shape) < 2 or len(b.shape) < 2:
        raise cx.unsupported("QLinearMatMul on 1-D operands")
    # a's scale/zero point are per row (axis −2) when 1-D, b's per column (axis −1)
    y = cx.add("MatMul", [dequantize(cx, a, a_s, a_zp, -2), dequantize(cx, b, b_s, b_zp, -1)])
    return [quantize(cx, y, y_s, y_zp, None)]


@importer("QLinearConv")
def imp_qlinear_conv(cx: Ctx, ins: list[Value | None]) -> list[Value]:
    x, x_s, x_zp, w, w_s, w_zp, y_s, y_zp = ins[:8]
    bias = _opt(ins, 8)
    if len(x.shape) not in (3, 4, 5):
        raise cx.unsupported(f"QLinearConv on rank-{len(x.shape)} input")
    if x_s.type.size != 1 or (x_zp is not None and x_zp.type.size != 1):
        raise cx.unsupported("a per-channel input scale or zero point (ONNX allows only per-tensor)")
    win = _window(cx, x.shape, tuple(w.shape[2:]))
    win.pop("count_pads")
    args = [dequantize(cx, x, x_s, x_zp, None), dequantize(cx, w, w_s, w_zp, 0)]
    if bias is not None:  # int32 with scale x_scale · w_scale (per output channel), zero point 0
        _check_type(cx, bias.dtype, "QLinearConv bias", ("int32",))
        bscale = cx.add("Mul", [cx.add("Reshape", [x_s], shape=()), w_s if w_s.type.size > 1 else
                                cx.add("Reshape", [w_s], shape=())])
        args.append(dequantize(cx, bias, bscale, None, 0))
    y = cx.add("Conv", args, group=int(cx.attr("group", 1)), **win)
    return [quantize(cx, y, y_s, y_zp, None)]


@importer("MatMulInteger")
def imp_matmul_integer(cx: Ctx, ins: list[Value | None]) -> list[Value]:
    a, b = ins[0], ins[1]
    _check_type(cx, a.dtype, "A")
    _check_type(cx, b.dtype, "B")
    if len(a.shape) < 2 or len(b.shape) < 2:
        raise cx.unsupported("MatMulInteger on 1-D operands")
    a_zp = _opt(ins, 2) or _zero(cx, a.dtype)
    b_zp = _opt(ins, 3) or _zero(cx, b.dtype)
    if a_zp.dtype != a.dtype or b_zp.dtype != b.dtype:
        raise cx.unsupported(f"zero points of types {a_zp.dtype}/{b_zp.dtype} for inputs {a.dtype}/{b.dtype}")
    return [cx.add("MatMulInteger", [a, b, _param(cx, a_zp, a, -2, "a_zero_point"),
                                     _param(cx, b_zp, b, -1, "b_zero_point")])]


@importer("ConvInteger")
def imp_conv_integer(cx: Ctx, ins: list[Value | None]) -> list[Value]:
    x, w = ins[0], ins[1]
    _check_type(cx, x.dtype, "x")
    _check_type(cx, w.dtype, "w")
    if len(x.shape) not in (3, 4, 5):
        raise cx.unsupported(f"ConvInteger on rank-{len(x.shape)} input")
    x_zp = _opt(ins, 2) or _zero(cx, x.dtype)
    w_zp = _opt(ins, 3) or _zero(cx, w.dtype)
    if x_zp.type.size != 1:
        raise cx.unsupported("a per-channel x_zero_point (ONNX allows only per-tensor)")
    if x_zp.dtype != x.dtype or w_zp.dtype != w.dtype:
        raise cx.unsupported(f"zero points of types {x_zp.dtype}/{w_zp.dtype} for inputs {x.dtype}/{w.dtype}")
    win = _window(cx, x.shape, tuple(w.shape[2:]))
    win.pop("count_pads")
    return [cx.add("ConvInteger", [x, w, _param(cx, x_zp, x, None, "x_zero_point"),
                                   _param(cx, w_zp, w, 0, "w_zero_point")], group=int(cx.attr("group", 1)), **win)]


@importer("DynamicQuantizeLinear")
def imp_dynamic_quantize_linear(cx: Ctx, ins: list[Value | None]) -> list[Value]:
    """ONNX's definition, as core ops: the range always includes 0, uint8 with a computed zero point.

        scale = (max(0, max x) − min(0, min x)) / 255;  zp = saturate(round(−min(0, min x) / scale))
        y = saturate(round(x / scale) + zp)"""
    x = ins[0]
    _check_type(cx, x.dtype, "DynamicQuantizeLinear input", ("float32",))
    axes = tuple(range(len(x.shape)))
    f = lambda v: cx.constant(np.array(v, np.float32))  # noqa: E731
    lo = cx.add("Min", [cx.add("Reduce", [x], kind="min", axes=axes, keepdims=False), f(0.0)])
    hi = cx.add("Max", [cx.add("Reduce", [x], kind="max", axes=axes, keepdims=False), f(0.0)])
    scale = cx.add("Div", [cx.add("Sub", [hi, lo]), f(255.0)])
    zpf = cx.add("Clip", [cx.add("Round", [cx.add("Div", [cx.add("Neg", [lo]), scale])])], min=0.0, max=255.0)
    zp = cx.add("Cast", [zpf], to="uint8")
    return [cx.add("Quantize", [x, scale, zp], to="uint8"), scale, zp]
