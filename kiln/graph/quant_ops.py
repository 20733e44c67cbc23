"""Kiln's quantized core ops: type rules and NumPy evaluations (registered in `kiln.graph.ops.OPS`).

The frontend normalizes ONNX's quantization ops onto these (kiln/frontend/importers/quant.py):

    Quantize(x f32, scale, zp)          → to        y = saturate(roundeven(x / scale) + zp)      (QuantizeLinear)
    Dequantize(x, scale, zp)            → float32   y = (x − zp) · scale, the subtraction in int32 (DequantizeLinear)
    MatMulInteger(a, b, a_zp, b_zp)     → int32     Σ_k (a − a_zp)(b − b_zp)                     (ONNX's own op)
    ConvInteger(x, w, x_zp, w_zp)       → int32     Σ (x − x_zp)(w − w_zp), padding reads x_zp   (ONNX's own op)

scale and zp are numpy-broadcastable to x: a per-axis parameter of ONNX (`axis`) is reshaped to [C, 1, …] at
import, so every rule here is plain broadcasting and the blocked layout can carry them like any per-channel
constant. The integer anchors that the graph pass quantize_qdq builds from them live in
kiln/graph/passes/quantize_qdq.py (QMatMul, QConv: packed weights, int32 accumulators)."""
from __future__ import annotations

import numpy as np

from kiln.errors import ModelError
from kiln.graph.ops import OPS, OpDef, _conv_shape, _matmul_shape, broadcast, packed_conv_shape
from kiln.graph.types import TensorType
from kiln.target import Target

QUANT_DTYPES = ("int8", "uint8")


def activation_dtype(target: Target) -> str:
    """The 8-bit type integer anchors want their activations in on `target`: x86's `vpdpbusd` (and its widening
    fallback) multiplies unsigned by signed bytes; AArch64's SDOT / SMMLA signed by signed; RVV any (uint8)."""
    return "int8" if target.arch == "aarch64" else "uint8"


def qrange(dtype: str) -> tuple[int, int]:
    info = np.iinfo(dtype)
    return int(info.min), int(info.max)


def quantize_np(x: np.ndarray, scale: np.ndarray, zp: np.ndarray, to: str) -> np.ndarray:
    lo, hi = qrange(to)
    q = np.rint(x.astype(np.float32) / scale.astype(np.float32)) + zp.astype(np.float32)
    return np.clip(q, lo, hi).astype(to)


def dequantize_np(x: np.ndarray, scale: np.ndarray, zp: np.ndarray) -> np.ndarray:
    return ((x.astype(np.int32) - zp.astype(np.int32)).astype(np.float32) * scale.astype(np.float32)).astype(np.float32)


def _quantize_shape(ts: list[TensorType], a: dict) -> list[TensorType]:
    if a["to"] not in QUANT_DTYPES:
        raise ModelError(f"Quantize to {a['to']}: Kiln quantizes to {', '.join(QUANT_DTYPES)}")
    return [TensorType(a["to"], broadcast(*(t.shape for t in ts)))]


def _dequantize_shape(ts: list[TensorType], a: dict) -> list[TensorType]:
    if ts[0].dtype not in QUANT_DTYPES + ("int32",) or ts[2].dtype != ts[0].dtype:
        raise ModelError(f"Dequantize of {ts[0].dtype} with a {ts[2].dtype} zero point")
    return [TensorType("float32", broadcast(*(t.shape for t in ts)))]


def _matmul_integer_shape(ts: list[TensorType], a: dict) -> list[TensorType]:
    (out,) = _matmul_shape([TensorType("int32", ts[0].shape), TensorType("int32", ts[1].shape)], a)
    return [out]


def _conv_integer_shape(ts: list[TensorType], a: dict) -> list[TensorType]:
    (out,) = _conv_shape([TensorType("int32", ts[0].shape), TensorType("int32", ts[1].shape)], a)
    return [out]


def _matmul_integer_np(xs: list[np.ndarray], a: dict) -> list[np.ndarray]:
    x, w, xz, wz = (v.astype(np.int64) for v in xs)
    return [np.matmul(x - xz, w - wz).astype(np.int32)]


OPS["Quantize"] = OpDef(_quantize_shape, lambda xs, a: [quantize_np(xs[0], xs[1], xs[2], a["to"])], "binary")
OPS["Dequantize"] = OpDef(_dequantize_shape, lambda xs, a: [dequantize_np(xs[0], xs[1], xs[2])], "binary")
OPS["MatMulInteger"] = OpDef(_matmul_integer_shape, _matmul_integer_np, "anchor")
OPS["ConvInteger"] = OpDef(_conv_integer_shape, None, "anchor")


# -- the integer anchors quantize_qdq builds (kiln/graph/passes/quantize_qdq.py) ---------------------------------------
#   QMatMul(a, w[K, N] int8, addend[N] (, negwsum[N], a_zp))        → int32  Σ_k a·w + addend (+ a_zp·negwsum)
#   QConv(x, w[Co, Ci/g, kh, kw] int8, addend[Co]) attrs fill, acc → acc    Σ x·w + addend, padding reads `fill`
# a is in the target's activation domain (uint8 for x86's u8 × s8 dot products), w re-centered to zero point 0;
# addend = bias_q − a_zp·Σw folds every zero-point correction that is a constant. A depthwise QConv accumulates in
# float32 (exact: ≤ 512 products of ≤ 2^15 each stay below 2^24), which its vector tile does fastest.
#   QPackedMatMul(a, Bp[⌈N/NR⌉, ⌈K/G⌉, NR, G], addend, …) attrs n, nr   (the VNNI layout: G = 4 int8, or 2 int16)
#   QPackedConv(xb, Wp, addend) attrs as PackedConv + fill, acc      blocked in and out (graph/passes/block_layout.py)
def _qmatmul_shape(ts: list[TensorType], a: dict) -> list[TensorType]:
    return _matmul_integer_shape(ts, a)


def _qconv_shape(ts: list[TensorType], a: dict) -> list[TensorType]:
    (out,) = _conv_integer_shape(ts, a)
    return [TensorType(a.get("acc", "int32"), out.shape)]


def _qpacked_matmul_shape(ts: list[TensorType], a: dict) -> list[TensorType]:
    x, bp = ts[0].shape, ts[1].shape
    group = {"int8": 4, "int16": 2}.get(ts[1].dtype, 0)
    if not group or -(-x[-1] // group) != bp[1] or bp[3] != group:
        raise ModelError(f"QPackedMatMul: K of {x} does not fit panels {bp}")
    return [TensorType("int32", x[:-1] + (a["n"],))]


def _qpacked_conv_shape(ts: list[TensorType], a: dict) -> list[TensorType]:
    (out,) = packed_conv_shape(ts, a)
    return [TensorType(a.get("acc", "int32"), out.shape)]


OPS["QMatMul"] = OpDef(_qmatmul_shape, None, "anchor")
OPS["QConv"] = OpDef(_qconv_shape, None, "anchor")
OPS["QPackedMatMul"] = OpDef(_qpacked_matmul_shape, None, "anchor")
OPS["QPackedConv"] = OpDef(_qpacked_conv_shape, None, "anchor")
