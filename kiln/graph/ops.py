"""Kiln's core op set: for each op, its type rule and a NumPy evaluation (used by constant folding).

Attributes are normalized by the frontend (explicit axes, pads, shapes), so every rule here is one line
or a short function and no rule knows about ONNX opsets."""
from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import sympy

from kiln.errors import ModelError
from kiln.graph import symbolic
from kiln.graph.symbolic import Dim
from kiln.graph.types import TensorType

Infer = Callable[[list[TensorType], dict[str, Any]], list[TensorType]]
Eval = Callable[[list[np.ndarray], dict[str, Any]], list[np.ndarray]]


@dataclass(frozen=True)
class OpDef:
    infer: Infer
    eval: Eval | None
    kind: str  # "unary" | "binary" | "reduce" | "anchor" | "data" | "norm"


OPS: dict[str, OpDef] = {}


def broadcast(*shapes: tuple[Dim, ...]) -> tuple[Dim, ...]:
    """NumPy broadcasting; on symbolic dims: s with 1 → s, s with s → s, anything else that is not provably equal
    (s with n > 1, s with t) is an error naming the dims (a symbol ranges over sizes where it would not broadcast)."""
    if all(symbolic.is_static(sh) for sh in shapes):
        try:
            return tuple(np.broadcast_shapes(*shapes))
        except ValueError as e:
            raise ModelError(f"shapes {list(shapes)} do not broadcast: {e}") from None
    rank = max(len(sh) for sh in shapes)
    out: list[Dim] = []
    for axis in range(rank):
        dims = [sh[axis - rank + len(sh)] for sh in shapes if axis - rank + len(sh) >= 0]
        kept: list[Dim] = []
        for d in dims:
            if d != 1 and not any(symbolic.equal(d, k) for k in kept):
                kept.append(d)
        if len(kept) > 1:
            raise ModelError(f"shapes {[symbolic.shape_str(sh) for sh in shapes]} do not broadcast: dims "
                             f"{', '.join(symbolic.dim_str(d) for d in kept)} of axis {axis} are not provably equal")
        out.append(kept[0] if kept else 1)
    return tuple(out)


def _same(ts: list[TensorType], a: dict) -> list[TensorType]:
    return [ts[0]]


def _bcast(dtype: str | None = None) -> Infer:
    return lambda ts, a: [TensorType(dtype or ts[-1 if len(ts) == 3 else 0].dtype,
                                     broadcast(*(t.shape for t in ts)))]


def _unary(name: str, fn: Callable[..., np.ndarray]) -> None:
    OPS[name] = OpDef(_same, lambda xs, a: [np.asarray(fn(xs[0], a)).astype(xs[0].dtype)], "unary")


def _erf(x: np.ndarray) -> np.ndarray:
    import math
    return np.vectorize(math.erf, otypes=[np.float64])(x)


for _n, _f in {
    "Relu": lambda x, a: np.maximum(x, 0), "Sigmoid": lambda x, a: 1 / (1 + np.exp(-x)),
    "Tanh": lambda x, a: np.tanh(x), "Exp": lambda x, a: np.exp(x), "Log": lambda x, a: np.log(x),
    "Sqrt": lambda x, a: np.sqrt(x), "Neg": lambda x, a: -x, "Abs": lambda x, a: np.abs(x),
    "Erf": lambda x, a: _erf(x), "Reciprocal": lambda x, a: 1 / x, "Floor": lambda x, a: np.floor(x),
    "Ceil": lambda x, a: np.ceil(x), "Round": lambda x, a: np.round(x), "Sin": lambda x, a: np.sin(x),
    "Cos": lambda x, a: np.cos(x), "Softplus": lambda x, a: np.logaddexp(0, x),
    "Sign": lambda x, a: np.sign(x),
    "RoundFloat16": lambda x, a: x.astype(np.float16).astype(np.float32),  # float16 storage, float32 compute
    "Tan": lambda x, a: np.tan(x), "Sinh": lambda x, a: np.sinh(x), "Cosh": lambda x, a: np.cosh(x),
    "Asin": lambda x, a: np.arcsin(x), "Acos": lambda x, a: np.arccos(x), "Atan": lambda x, a: np.arctan(x),
    "Asinh": lambda x, a: np.arcsinh(x), "Acosh": lambda x, a: np.arccosh(x), "Atanh": lambda x, a: np.arctanh(x),
    "Softsign": lambda x, a: x / (1 + np.abs(x)),
    "Swish": lambda x, a: x / (1 + np.exp(-a["alpha"] * x)),
    "Shrink": lambda x, a: np.where(x < -a["lambd"], x + a["bias"], np.where(x > a["lambd"], x - a["bias"], 0)),
    "Identity": lambda x, a: x, "Not": lambda x, a: ~x,
    "Clip": lambda x, a: np.clip(x, a["min"], a["max"]),
    "LeakyRelu": lambda x, a: np.where(x >= 0, x, a["alpha"] * x),
    "Elu": lambda x, a: np.where(x >= 0, x, a["alpha"] * (np.exp(x) - 1)),
    "Celu": lambda x, a: np.maximum(x, 0) + np.minimum(0, a["alpha"] * (np.exp(x / a["alpha"]) - 1)),
    "ThresholdedRelu": lambda x, a: np.where(x > a["alpha"], x, 0),
    "HardSigmoid": lambda x, a: np.clip(a["alpha"] * x + a["beta"], 0, 1),
    "HardSwish": lambda x, a: x * np.clip(x * (1 / 6) + 0.5, 0, 1),  # as onnxruntime: alpha = 1/6 multiplies
    "Mish": lambda x, a: x * np.tanh(np.logaddexp(0, x)),
    "Selu": lambda x, a: a["gamma"] * np.where(x > 0, x, a["alpha"] * (np.exp(x) - 1)),
    "Gelu": lambda x, a: 0.5 * x * (1 + (_erf(x / np.sqrt(2)) if a["approximate"] == "none"
                                         else np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))),
}.items():
    _unary(_n, _f)

OPS["IsNaN"] = OpDef(lambda ts, a: [TensorType("bool", ts[0].shape)], lambda xs, a: [np.isnan(xs[0])], "unary")
OPS["IsInf"] = OpDef(lambda ts, a: [TensorType("bool", ts[0].shape)],
                     lambda xs, a: [(np.isposinf(xs[0]) & bool(a["positive"]))
                                    | (np.isneginf(xs[0]) & bool(a["negative"]))], "unary")
OPS["Cast"] = OpDef(lambda ts, a: [TensorType(a["to"], ts[0].shape)],
                    lambda xs, a: [xs[0].astype(a["to"])], "unary")


def _pow(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """numpy refuses negative integer exponents of integers; ONNX (and onnxruntime) go through double."""
    return np.trunc(np.power(a.astype(np.float64), b)) if a.dtype.kind in "iu" else np.power(a, b)


_BINARY: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "Add": np.add, "Sub": np.subtract, "Mul": np.multiply, "Pow": _pow, "Max": np.maximum,
    "Min": np.minimum, "PRelu": lambda x, s: np.where(x >= 0, x, x * s),
    "Div": lambda a, b: (np.trunc(a / b).astype(a.dtype) if a.dtype.kind in "iu" else a / b),
    "BitAnd": np.bitwise_and, "BitOr": np.bitwise_or, "BitXor": np.bitwise_xor,
}
_COMPARE: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "Equal": np.equal, "Less": np.less, "Greater": np.greater, "LessOrEqual": np.less_equal,
    "GreaterOrEqual": np.greater_equal, "And": np.logical_and, "Or": np.logical_or, "Xor": np.logical_xor,
}
for _n, _g in _BINARY.items():
    OPS[_n] = OpDef(_bcast(), (lambda g: lambda xs, a: [np.asarray(g(xs[0], xs[1])).astype(xs[0].dtype)])(_g),
                    "binary")
for _n, _g in _COMPARE.items():
    OPS[_n] = OpDef(_bcast("bool"), (lambda g: lambda xs, a: [np.asarray(g(xs[0], xs[1]))])(_g), "binary")
# fmod=0: the result takes the divisor's sign (Python %), fmod=1: the dividend's (C fmod)
OPS["Mod"] = OpDef(_bcast(), lambda xs, a: [np.asarray((np.fmod if a["fmod"] else np.mod)(xs[0], xs[1]))
                                            .astype(xs[0].dtype)], "binary")
OPS["Where"] = OpDef(_bcast(), lambda xs, a: [np.where(xs[0], xs[1], xs[2])], "binary")


# -- reductions ------------------------------------------------------------------------------------------
def _reduce_shape(ts: list[TensorType], a: dict) -> list[TensorType]:
    shape = ts[0].shape
    axes = a["axes"]
    out = tuple(1 if i in axes else d for i, d in enumerate(shape) if a["keepdims"] or i not in axes)
    return [TensorType(ts[0].dtype, out)]


_REDUCE_NP: dict[str, Callable[..., np.ndarray]] = {
    "sum": np.sum, "mean": np.mean, "max": np.max, "min": np.min, "prod": np.prod,
    "l1": lambda x, axis, keepdims: np.sum(np.abs(x), axis=axis, keepdims=keepdims),
    "l2": lambda x, axis, keepdims: np.sqrt(np.sum(x * x, axis=axis, keepdims=keepdims)),
    "sumsquare": lambda x, axis, keepdims: np.sum(x * x, axis=axis, keepdims=keepdims),
    "logsumexp": lambda x, axis, keepdims: np.log(np.sum(np.exp(x), axis=axis, keepdims=keepdims)),
    "logsum": lambda x, axis, keepdims: np.log(np.sum(x, axis=axis, keepdims=keepdims)),
}
OPS["Reduce"] = OpDef(_reduce_shape, lambda xs, a: [np.asarray(_REDUCE_NP[a["kind"]](
    xs[0], axis=tuple(a["axes"]), keepdims=a["keepdims"])).astype(xs[0].dtype)], "reduce")


def _argreduce_shape(ts: list[TensorType], a: dict) -> list[TensorType]:
    shape = _reduce_shape(ts, {"axes": (a["axis"],), "keepdims": a["keepdims"]})[0].shape
    return [TensorType("int64", shape)]


def _np_argreduce(x: np.ndarray, a: dict) -> np.ndarray:
    fn = np.argmax if a["kind"] == "max" else np.argmin
    if not a.get("last"):
        return np.asarray(fn(x, axis=a["axis"], keepdims=a["keepdims"])).astype(np.int64)
    n = x.shape[a["axis"]]
    return (n - 1 - np.asarray(fn(np.flip(x, a["axis"]), axis=a["axis"], keepdims=a["keepdims"]))).astype(np.int64)


OPS["ArgReduce"] = OpDef(_argreduce_shape, lambda xs, a: [_np_argreduce(xs[0], a)], "reduce")


# -- anchors ---------------------------------------------------------------------------------------------
def acc_dtype(dtype: str) -> str:
    """The element type an anchor accumulates and writes for operands of `dtype`: bf16 products accumulate in
    float32 (precision="bf16", graph/passes/precision.py); other types write their own type."""
    return "float32" if dtype == "bfloat16" else dtype


def _matmul_shape(ts: list[TensorType], a: dict) -> list[TensorType]:
    x, y = ts[0].shape, ts[1].shape
    if len(x) < 2 or len(y) < 2:
        raise ModelError(f"MatMul wants rank ≥ 2 after import, got {x} @ {y}")
    if not symbolic.equal(x[-1], y[-2]):
        raise ModelError(f"MatMul inner dimensions differ: {symbolic.shape_str(x)} @ {symbolic.shape_str(y)}")
    return [TensorType(acc_dtype(ts[0].dtype), broadcast(x[:-2], y[:-2]) + (x[-2], y[-1]))]


OPS["MatMul"] = OpDef(_matmul_shape, lambda xs, a: [np.matmul(xs[0], xs[1]).astype(acc_dtype(str(xs[0].dtype)))],
                      "anchor")


def conv_out(size: Dim, k: int, stride: int, pad_lo: int, pad_hi: int, dil: int) -> Dim:
    if type(size) is int and type(k) is int:
        return (size + pad_lo + pad_hi - dil * (k - 1) - 1) // stride + 1
    for what, v in (("kernel size", k), ("stride", stride), ("dilation", dil), ("padding", pad_lo),
                    ("padding", pad_hi)):
        if not symbolic.is_static(v):
            raise ModelError(f"a symbolic {what} ({symbolic.dim_str(v)}) is not supported: it must be a constant")
    return symbolic.normalize((size + pad_lo + pad_hi - dil * (k - 1) - 1) // stride + 1)


def _spatial_out(shape: tuple[int, ...], kernel: tuple[int, ...], a: dict) -> tuple[int, ...]:
    nd = len(kernel)
    out = tuple(conv_out(shape[2 + i], kernel[i], a["strides"][i], a["pads"][i], a["pads"][i + nd],
                         a["dilations"][i]) for i in range(nd))
    if min(symbolic.lower(d) for d in out) < 1:  # symbolic: at the smallest size the bounds allow
        within = "" if symbolic.is_static(shape) else f" at every size within bounds {symbolic.current_bounds()}"
        raise ModelError(f"window {kernel} with pads {a['pads']} does not fit input {symbolic.shape_str(shape)}"
                         + within)
    return out


def _conv_shape(ts: list[TensorType], a: dict) -> list[TensorType]:
    x, w = ts[0].shape, ts[1].shape
    if not symbolic.equal(x[1], w[1] * a["group"]):
        raise ModelError(f"Conv input has {x[1]} channels, weight {w} with group {a['group']} "
                         f"wants {w[1] * a['group']}")
    return [TensorType(acc_dtype(ts[0].dtype), (x[0], w[0]) + _spatial_out(x, w[2:], a))]


OPS["Conv"] = OpDef(_conv_shape, None, "anchor")


def packed_conv_shape(ts: list[TensorType], a: dict) -> list[TensorType]:
    """PackedConv (graph/passes/pack_weights.py): NCHW output, or blocked [N, Co/cb, OH, OW, cb] with `out_block` =
    cb (graph/passes/block_layout.py)."""
    x = ts[0].shape
    nd = len(a["kernel"])
    sp = tuple(conv_out(x[2 + i], a["kernel"][i], a["strides"][i], a["pads"][i], a["pads"][i + nd],
                        a["dilations"][i]) for i in range(nd))
    ob = a.get("out_block", 0)
    dt = acc_dtype(ts[0].dtype)
    if ob:
        return [TensorType(dt, (x[0], a["co"] // ob) + sp + (ob,))]
    return [TensorType(dt, (x[0], a["co"]) + sp)]


OPS["Pool"] = OpDef(lambda ts, a: [TensorType(ts[0].dtype, ts[0].shape[:2] + _spatial_out(ts[0].shape, a["kernel"], a)
                                              + ts[0].shape[2 + len(a["kernel"]):])],  # + the channel block
                    None, "anchor")
OPS["MaxPoolIndex"] = OpDef(lambda ts, a: [TensorType("int64",
                                                      ts[0].shape[:2] + _spatial_out(ts[0].shape, a["kernel"], a))],
                            None, "anchor")


# -- the blocked channel layout (graph/passes/block_layout.py): x[N, C, H, W] ⇔ xb[N, C/cb, H, W, cb] -----------
def to_blocked(x: np.ndarray, cb: int) -> np.ndarray:
    n, c = x.shape[:2]
    return np.ascontiguousarray(np.moveaxis(x.reshape((n, c // cb, cb) + x.shape[2:]), 2, -1))


def from_blocked(x: np.ndarray) -> np.ndarray:
    n, cbs, cb = x.shape[0], x.shape[1], x.shape[-1]
    return np.ascontiguousarray(np.moveaxis(x, -1, 2).reshape((n, cbs * cb) + x.shape[2:-1]))


def _to_blocked_shape(ts: list[TensorType], a: dict) -> list[TensorType]:
    s, cb = ts[0].shape, a["cb"]
    if len(s) < 3 or s[1] % cb:
        raise ModelError(f"ToBlocked: {s} has no channel axis divisible by {cb}")
    return [TensorType(ts[0].dtype, (s[0], s[1] // cb) + s[2:] + (cb,))]


OPS["ToBlocked"] = OpDef(_to_blocked_shape, lambda xs, a: [to_blocked(xs[0], a["cb"])], "data")
OPS["FromBlocked"] = OpDef(lambda ts, a: [TensorType(ts[0].dtype, (ts[0].shape[0], ts[0].shape[1] * ts[0].shape[-1])
                                                     + ts[0].shape[2:-1])],
                           lambda xs, a: [from_blocked(xs[0])], "data")


def _conv_transpose_shape(ts: list[TensorType], a: dict) -> list[TensorType]:
    x, w = ts[0].shape, ts[1].shape
    nd = len(w) - 2
    sp = tuple(a["strides"][i] * (x[2 + i] - 1) + a["output_padding"][i] + (w[2 + i] - 1) * a["dilations"][i]
               + 1 - a["pads"][i] - a["pads"][i + nd] for i in range(nd))
    return [TensorType(ts[0].dtype, (x[0], w[1] * a["group"]) + sp)]


OPS["ConvTranspose"] = OpDef(_conv_transpose_shape, None, "anchor")

# -- normalizations ----------------------------------------------------------------------------------------
OPS["BatchNormalization"] = OpDef(_same, None, "norm")
OPS["LayerNormalization"] = OpDef(_same, None, "norm")
OPS["Softmax"] = OpDef(_same, None, "norm")
OPS["LogSoftmax"] = OpDef(_same, None, "norm")
OPS["LRN"] = OpDef(_same, None, "norm")
OPS["InstanceNormalization"] = OpDef(_same, None, "norm")


# -- data movement -------------------------------------------------------------------------------------------
def _reshape(ts: list[TensorType], a: dict) -> list[TensorType]:
    shape = tuple(a["shape"])
    if not symbolic.equal(symbolic.prod(shape), ts[0].size):
        raise ModelError(f"cannot reshape {symbolic.shape_str(ts[0].shape)} to {symbolic.shape_str(shape)}")
    return [TensorType(ts[0].dtype, shape)]


def _concat(ts: list[TensorType], a: dict) -> list[TensorType]:
    ax, base = a["axis"], ts[0].shape
    for t in ts[1:]:
        if len(t.shape) != len(base) or any(not symbolic.equal(d, e)
                                            for i, (d, e) in enumerate(zip(t.shape, base)) if i != ax):
            raise ModelError(f"Concat on axis {ax}: shapes {[t.shape for t in ts]} disagree off that axis")
    return [TensorType(ts[0].dtype, base[:ax] + (sum(t.shape[ax] for t in ts),) + base[ax + 1:])]


def slice_len(start: Dim, end: Dim, step: int) -> Dim:
    if not symbolic.is_static(step):
        raise ModelError(f"a symbolic slice step ({symbolic.dim_str(step)}) is not supported")
    n = (end - start + (step - (1 if step > 0 else -1))) // step
    if symbolic.is_static(n):
        return max(0, int(n))
    # symbolic: the importer clamps starts/ends into the axis, so the length is ≥ 0 at every size within the
    # bounds; where it is not provably so, max(0, ·) stays in the dim
    return symbolic.normalize(n) if symbolic.lower(n) >= 0 else symbolic.normalize(sympy.Max(0, n))


def _slice(ts: list[TensorType], a: dict) -> list[TensorType]:
    spans = zip(a["starts"], a["ends"], a["steps"])
    return [TensorType(ts[0].dtype, tuple(slice_len(s, e, st) for s, e, st in spans))]


def _np_slice(x: np.ndarray, a: dict) -> np.ndarray:
    spans = zip(a["starts"], a["ends"], a["steps"])
    idx = tuple(slice(s, (None if e < 0 and st < 0 else e), st) for s, e, st in spans)
    return x[idx]


def _gather(ts: list[TensorType], a: dict) -> list[TensorType]:
    ax, d = a["axis"], ts[0].shape
    return [TensorType(ts[0].dtype, d[:ax] + ts[1].shape + d[ax + 1:])]


def _np_gather(xs: list[np.ndarray], a: dict) -> np.ndarray:
    idx = np.where(xs[1] < 0, xs[1] + xs[0].shape[a["axis"]], xs[1])
    return np.take(xs[0], idx, axis=a["axis"])


def _pad(ts: list[TensorType], a: dict) -> list[TensorType]:
    n = len(ts[0].shape)
    pads = a["pads"]
    return [TensorType(ts[0].dtype, tuple(d + pads[i] + pads[i + n] for i, d in enumerate(ts[0].shape)))]


def _np_pad(x: np.ndarray, a: dict) -> np.ndarray:
    n = x.ndim
    lo, hi = a["pads"][:n], a["pads"][n:]
    crop = tuple(slice(max(0, -l), x.shape[i] - max(0, -h)) for i, (l, h) in enumerate(zip(lo, hi)))
    x = x[crop]
    width = [(max(0, l), max(0, h)) for l, h in zip(lo, hi)]
    if a["mode"] == "constant":
        return np.pad(x, width, mode="constant", constant_values=a["value"])
    return np.pad(x, width, mode={"reflect": "reflect", "edge": "edge", "wrap": "wrap"}[a["mode"]])


OPS["Reshape"] = OpDef(_reshape, lambda xs, a: [xs[0].reshape(a["shape"])], "data")
OPS["Transpose"] = OpDef(lambda ts, a: [TensorType(ts[0].dtype, tuple(ts[0].shape[p] for p in a["perm"]))],
                         lambda xs, a: [np.asarray(np.transpose(xs[0], a["perm"]), order="C")], "data")
OPS["Concat"] = OpDef(_concat, lambda xs, a: [np.concatenate(xs, axis=a["axis"])], "data")
OPS["Slice"] = OpDef(_slice, lambda xs, a: [np.asarray(_np_slice(xs[0], a), order="C")], "data")
OPS["Gather"] = OpDef(_gather, lambda xs, a: [_np_gather(xs, a)], "data")
OPS["Pad"] = OpDef(_pad, lambda xs, a: [_np_pad(xs[0], a)], "data")
OPS["Expand"] = OpDef(lambda ts, a: [TensorType(ts[0].dtype, tuple(a["shape"]))],
                      lambda xs, a: [np.broadcast_to(xs[0], a["shape"]).copy()], "data")
OPS["Tile"] = OpDef(lambda ts, a: [TensorType(ts[0].dtype,
                                              tuple(d * r for d, r in zip(ts[0].shape, a["repeats"])))],
                    lambda xs, a: [np.tile(xs[0], a["repeats"])], "data")
OPS["Resize"] = OpDef(lambda ts, a: [TensorType(ts[0].dtype, tuple(a["sizes"]))], None, "data")


def range_count(start: Dim | float, limit: Dim | float, delta: Dim | float) -> Dim:
    """max(ceil((limit - start) / delta), 0): the length of Range's output."""
    if not symbolic.is_static(delta):
        raise ModelError(f"Range with a symbolic delta ({symbolic.dim_str(delta)}) is not supported")
    if all(isinstance(v, (int, np.integer)) for v in (start, limit, delta)) or not (
            symbolic.is_static(start) and symbolic.is_static(limit)):
        n = symbolic.normalize(-((start - limit) // delta))  # ceiling division, exact on integers and dims
        if symbolic.is_static(n):
            return max(n, 0)
        return n if symbolic.lower(n) >= 0 else symbolic.normalize(sympy.Max(0, n))
    import math
    return max(math.ceil((float(limit) - float(start)) / float(delta)), 0)


# Range(start, limit, delta): the one data op whose output length may be symbolic at run time (position ids:
# Range(0, seq, 1)); its three operands are attributes (dims or numbers), its element type `dtype`.
OPS["Range"] = OpDef(lambda ts, a: [TensorType(a["dtype"], (range_count(a["start"], a["limit"], a["delta"]),))],
                     lambda xs, a: [np.arange(a["start"], a["limit"], a["delta"], dtype=a["dtype"])], "data")


MAX_TENSOR_BYTES = 8 << 30  # a bigger tensor is a malformed model here (the machine has 24 GiB), not a job


def check_size(nbytes: float, node_name: str) -> None:
    if nbytes > MAX_TENSOR_BYTES:
        raise ModelError(f"node '{node_name}': a tensor of {nbytes / 2**30:.1f} GiB is larger than Kiln compiles "
                         f"({MAX_TENSOR_BYTES >> 30} GiB)")


# ops whose inputs must share one element type (ONNX's type constraint T), and which inputs that covers
_SAME_TYPE: dict[str, slice] = {**{op: slice(0, None) for op in (
    "Add", "Sub", "Mul", "Div", "Max", "Min", "Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual", "And",
    "Or", "Xor", "Mod", "PRelu", "BitAnd", "BitOr", "BitXor", "MatMul", "Concat", "Conv", "ConvTranspose")},
    "Where": slice(1, 3), "GatherElements": slice(0, 1), "ScatterElements": slice(0, 3, 2),
    "ScatterND": slice(0, 3, 2), "LayerNormalization": slice(0, None), "InstanceNormalization": slice(0, None),
    "BatchNormalization": slice(0, None)}


def infer(op: str, types: list[TensorType], attrs: dict[str, Any], node_name: str = "",
          bounds: dict[str, tuple[int, int]] | None = None) -> list[TensorType]:
    """The output types of a node. `bounds`: the graph's symbol bounds, which decide comparisons of symbolic dims
    (None: the bounds in force, `symbolic.using_bounds`, which run_graph_passes sets to the graph's; a symbol
    missing there ranges over (1, symbolic.DEFAULT_BOUND))."""
    with symbolic.using_bounds(symbolic.current_bounds() if bounds is None else bounds):
        return _infer(op, types, attrs, node_name)


def _infer(op: str, types: list[TensorType], attrs: dict[str, Any], node_name: str) -> list[TensorType]:
    if op not in OPS:
        raise ModelError(f"node '{node_name}': '{op}' is not a Kiln core op")
    same = {t.dtype for t in types[_SAME_TYPE[op]]} if op in _SAME_TYPE else set()
    if op == "Conv" and len(types) == 3 and types[2].dtype == acc_dtype(types[0].dtype):
        same = {t.dtype for t in types[:2]}  # a bf16 conv's bias is float32 (its accumulator's type)
    if len(same) > 1:
        raise ModelError(f"node '{node_name}' ({op}): inputs of different element types "
                         f"{[str(t) for t in types]}")
    if op == "Where" and types and types[0].dtype != "bool":
        raise ModelError(f"node '{node_name}' (Where): the condition is {types[0].dtype}, not bool")
    try:
        out = OPS[op].infer(types, attrs)
    except ModelError as e:
        if str(e).startswith("node '"):
            raise
        raise ModelError(f"node '{node_name}' ({op}): {e}") from None
    except (IndexError, KeyError, TypeError, ValueError, ZeroDivisionError) as e:
        symbols = sorted(set().union(*(symbolic.free_symbols(t.shape) for t in types)) if types else set())
        if symbols and isinstance(e, TypeError):  # sympy's "cannot determine truth value" / "cannot convert"
            raise ModelError(f"node '{node_name}' ({op}) cannot take symbolic dimensions {symbols} of inputs "
                             f"{[str(t) for t in types]}: {e}") from None
        raise ModelError(f"node '{node_name}' ({op}): cannot infer output type from inputs "
                         f"{[str(t) for t in types]} and attributes {attrs}: {e}") from None
    for t in out:
        if t.is_static:
            if any(d < 0 for d in t.shape):
                raise ModelError(f"node '{node_name}' ({op}): negative dimension in {t}")
            check_size(float(np.prod(t.shape, dtype=np.float64)) * np.dtype(t.dtype).itemsize, node_name)
            continue
        try:
            negative, nbytes = _symbolic_extent(t, tuple(sorted(symbolic.current_bounds().items())))
        except ValueError as e:  # a dim undefined somewhere within the bounds (divided by a dim that can be 0)
            raise ModelError(f"node '{node_name}' ({op}): {t}: {e}") from None
        if negative:
            raise ModelError(f"node '{node_name}' ({op}): dimension negative within bounds "
                             f"{symbolic.current_bounds()} in {t}")
        check_size(float(nbytes), node_name)  # planned at the upper bounds
    return out


@functools.lru_cache(maxsize=1 << 14)  # verify() re-infers every node after every pass: the same types recur
def _symbolic_extent(t: TensorType, bounds: tuple[tuple[str, tuple[int, int]], ...]) -> tuple[bool, int]:
    """Whether a dim of `t` can be negative within `bounds`, and its largest size in bytes there."""
    b = dict(bounds)
    return any(symbolic.lower(d, b) < 0 for d in t.shape), symbolic.upper(t.nbytes, b)


def evaluate(op: str, arrays: list[np.ndarray], attrs: dict[str, Any]) -> list[np.ndarray] | None:
    """NumPy value of a node with constant inputs, or None where the op has no evaluator."""
    fn = OPS[op].eval
    if fn is None:
        return None
    with np.errstate(all="ignore"):
        return fn(arrays, attrs)


# -- indexing ops (added for the ONNX conformance suite) -------------------------------------------------------
def _wrap(idx: np.ndarray, n: int) -> np.ndarray:
    return np.where(idx < 0, idx + n, idx).astype(np.int64)


def _np_cumsum(x: np.ndarray, a: dict) -> np.ndarray:
    ax = a["axis"]
    y = np.flip(x, ax) if a["reverse"] else x
    c = np.cumsum(y, axis=ax, dtype=x.dtype)
    if a["exclusive"]:
        c = c - y
    return np.flip(c, ax) if a["reverse"] else c


def _gather_nd_shape(ts: list[TensorType], a: dict) -> list[TensorType]:
    d, i, b = ts[0].shape, ts[1].shape, a["batch_dims"]
    return [TensorType(ts[0].dtype, i[:-1] + d[b + i[-1]:])]


OPS["GatherElements"] = OpDef(lambda ts, a: [TensorType(ts[0].dtype, ts[1].shape)],
                              lambda xs, a: [np.take_along_axis(xs[0], _wrap(xs[1], xs[0].shape[a["axis"]]),
                                                                axis=a["axis"])], "data")
OPS["GatherND"] = OpDef(_gather_nd_shape, None, "data")
OPS["ScatterElements"] = OpDef(lambda ts, a: [ts[0]], None, "data")
OPS["ScatterND"] = OpDef(lambda ts, a: [ts[0]], None, "data")
OPS["CumSum"] = OpDef(_same, lambda xs, a: [_np_cumsum(xs[0], a)], "data")
OPS["TopKIndex"] = OpDef(lambda ts, a: [TensorType("int64", tuple(a["k"] if i == a["axis"] else d
                                                                 for i, d in enumerate(ts[0].shape)))],
                         None, "data")
OPS["ReverseSequence"] = OpDef(_same, None, "data")
