"""Matrix products, convolutions, pooling, normalizations, softmax, upsampling and attention."""
from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from kiln.frontend.importers.resize import _resize
from kiln.frontend.torch.importer import Args, AtenCtx, aten
from kiln.graph.ir import Value
from kiln.graph.ops import conv_out


# -- matrix products ----------------------------------------------------------------------------------------------
@aten("mm.default", "bmm.default")
def mm(cx: AtenCtx, a: Args) -> Value:
    return cx.add("MatMul", [a["self"], a["mat2"]])


@aten("matmul.default")
def matmul(cx: AtenCtx, a: Args) -> Value:
    x, y = a["self"], a["other"]
    x2 = cx.reshape(x, (1,) + x.shape) if len(x.shape) == 1 else x
    y2 = cx.reshape(y, y.shape + (1,)) if len(y.shape) == 1 else y
    return cx.reshape(cx.add("MatMul", [x2, y2]), cx.out_shape())


@aten("addmm.default", "baddbmm.default")
def addmm(cx: AtenCtx, a: Args) -> Value:
    m1, m2 = (a["mat1"], a["mat2"]) if cx.op == "addmm.default" else (a["batch1"], a["batch2"])
    y = cx.add("MatMul", [m1, m2])
    if a["alpha"] != 1:
        y = cx.add("Mul", [y, cx.scalar(a["alpha"], y.dtype)])
    if a["beta"] == 0:
        return y
    bias = a["self"] if a["beta"] == 1 else cx.add("Mul", [a["self"], cx.scalar(a["beta"], y.dtype)])
    return cx.add("Add", [y, bias])


@aten("linear.default")
def linear(cx: AtenCtx, a: Args) -> Value:
    w = a["weight"]
    y = cx.add("MatMul", [a["input"], cx.add("Transpose", [w], perm=(1, 0))])
    return cx.add("Add", [y, a["bias"]]) if a["bias"] is not None else y


# -- convolution ---------------------------------------------------------------------------------------------------
def _per_dim(v: int | Sequence[int], nd: int) -> tuple[int, ...]:
    v = [v] if isinstance(v, int) else list(v)
    return tuple(v * nd if len(v) == 1 else v)


@aten("convolution.default", "conv2d.default", "conv1d.default")
def convolution(cx: AtenCtx, a: Args) -> Value:
    x, w, b = a["input"], a["weight"], a["bias"]
    nd = len(w.shape) - 2
    if len(x.shape) != nd + 2:
        raise cx.unsupported(f"unbatched convolution input {list(x.shape)}")
    if isinstance(a["padding"], str):
        raise cx.unsupported(f"padding={a['padding']!r}")
    pad = _per_dim(a["padding"], nd)
    attrs = dict(group=int(a["groups"]), strides=_per_dim(a["stride"], nd), pads=pad + pad,
                 dilations=_per_dim(a["dilation"], nd))
    args = [x, w] + ([b] if b is not None else [])
    if a.get("transposed"):
        return cx.add("ConvTranspose", args, output_padding=_per_dim(a["output_padding"], nd), **attrs)
    return cx.add("Conv", args, **attrs)


# -- pooling ---------------------------------------------------------------------------------------------------------
def _window(cx: AtenCtx, x: Value, kernel: tuple[int, ...], stride: Sequence[int], padding: Sequence[int],
            dilation: Sequence[int], ceil: bool) -> dict:
    """Kiln's Pool attributes; ceil_mode grows the high pads so the floor formula gives torch's size (a window
    must start inside the input or its low padding, as torch requires)."""
    nd = len(kernel)
    strides = _per_dim(stride, nd) if stride else kernel
    pads = list(_per_dim(padding, nd)) * 2
    dil = _per_dim(dilation, nd)
    count_pads = tuple(pads)
    if ceil:
        for i in range(nd):
            size, k, s = x.shape[2 + i], dil[i] * (kernel[i] - 1) + 1, strides[i]
            want = -(-(size + 2 * pads[i] - k) // s) + 1
            if (want - 1) * s >= size + pads[i]:
                want -= 1
            while conv_out(size, kernel[i], s, pads[i], pads[i + nd], dil[i]) < want:
                pads[i + nd] += 1
    return {"kernel": kernel, "strides": tuple(strides), "pads": tuple(pads), "dilations": dil,
            "count_pads": count_pads}


@aten("avg_pool2d.default", "avg_pool1d.default", "avg_pool3d.default")
def avg_pool(cx: AtenCtx, a: Args) -> Value:
    x = a["self"]
    if a.get("divisor_override") is not None:
        raise cx.unsupported("divisor_override")
    nd = len(x.shape) - 2
    win = _window(cx, x, _per_dim(a["kernel_size"], nd), a["stride"], a["padding"], [1] * nd, a["ceil_mode"])
    return cx.add("Pool", [x], kind="avg", include_pad=bool(a["count_include_pad"]), p=2, **win)


@aten("max_pool2d_with_indices.default", "max_pool2d.default", "max_pool1d.default", "max_pool3d_with_indices.default")
def max_pool(cx: AtenCtx, a: Args) -> Value | list[Value]:
    x = a["self"]
    nd = len(x.shape) - 2
    win = _window(cx, x, _per_dim(a["kernel_size"], nd), a["stride"], a["padding"], a["dilation"], a["ceil_mode"])
    y = cx.add("Pool", [x], kind="max", include_pad=False, p=2, **win)
    if "with_indices" not in cx.op:
        return y
    win.pop("count_pads")
    flat = cx.add("MaxPoolIndex", [x], storage_order=0, **win)  # flat over N·C·spatial; torch's is per plane
    plane = int(np.prod(x.shape[2:]))
    base = (np.arange(x.shape[0] * x.shape[1], dtype=np.int64) * plane).reshape(x.shape[:2] + (1,) * nd)
    return [y, cx.add("Sub", [flat, cx.constant(base)])]


@aten("_adaptive_avg_pool2d.default", "adaptive_avg_pool2d.default", "_adaptive_avg_pool3d.default",
      "adaptive_max_pool2d.default", "adaptive_avg_pool1d.default")
def adaptive_pool(cx: AtenCtx, a: Args) -> Value | list[Value]:
    x = a["self"]
    kind = "max" if "max" in cx.op else "avg"
    nd = len(x.shape) - 2
    out = _per_dim(a["output_size"], nd)
    if kind == "max":
        raise cx.unsupported("adaptive max pooling (with its indices)")
    if all(o == 1 for o in out):
        return cx.add("Reduce", [x], kind="mean", axes=tuple(range(2, 2 + nd)), keepdims=True)
    if any(s % o for s, o in zip(x.shape[2:], out)):
        raise cx.unsupported(f"output size {list(out)} does not divide the input {list(x.shape[2:])}")
    k = tuple(s // o for s, o in zip(x.shape[2:], out))
    return cx.add("Pool", [x], kind="avg", kernel=k, strides=k, pads=(0,) * 2 * nd, dilations=(1,) * nd,
                  count_pads=(0,) * 2 * nd, include_pad=False, p=2)


# -- normalizations ----------------------------------------------------------------------------------------------------
def _ones_if_none(cx: AtenCtx, v: Value | None, shape: tuple[int, ...], fill: float = 1.0) -> Value:
    return v if v is not None else cx.constant(np.full(shape, fill, dtype=np.float32))


def _rsqrt(cx: AtenCtx, var: Value, eps: float) -> Value:
    return cx.add("Reciprocal", [cx.add("Sqrt", [cx.add("Add", [var, cx.scalar(eps, var.dtype)])])])


def _moments(cx: AtenCtx, x: Value, axes: tuple[int, ...]) -> tuple[Value, Value, Value]:
    """(mean, x - mean, biased variance), reduced over `axes` with the dims kept."""
    mean = cx.add("Reduce", [x], kind="mean", axes=axes, keepdims=True)
    d = cx.add("Sub", [x, mean])
    return mean, d, cx.add("Reduce", [cx.add("Mul", [d, d])], kind="mean", axes=axes, keepdims=True)


@aten("_native_batch_norm_legit_no_training.default", "native_batch_norm.default", "_native_batch_norm_legit.default",
      "_native_batch_norm_legit.no_stats", "batch_norm.default", "_native_batch_norm_legit_functional.default")
def batch_norm(cx: AtenCtx, a: Args) -> Value | list[Value | None]:
    x = a["input"]
    c = x.shape[1]
    w, b = _ones_if_none(cx, a["weight"], (c,)), _ones_if_none(cx, a["bias"], (c,), 0.0)
    training = a.get("training", False) or cx.op == "_native_batch_norm_legit.no_stats"
    if not training:
        y = cx.add("BatchNormalization", [x, w, b, a["running_mean"], a["running_var"]], epsilon=float(a["eps"]))
        return y if cx.op == "batch_norm.default" else [y, None, None]
    if cx.op != "_native_batch_norm_legit.no_stats":
        raise cx.unsupported("batch norm in training mode (it updates the running statistics): compile in eval()")
    # batch statistics (instance norm arrives this way): normalize over every axis but the channels
    axes = (0,) + tuple(range(2, len(x.shape)))
    mean, d, var = _moments(cx, x, axes)
    rstd = _rsqrt(cx, var, float(a["eps"]))
    cshape = (c,) + (1,) * (len(x.shape) - 2)
    y = cx.add("Add", [cx.add("Mul", [cx.add("Mul", [d, rstd]), cx.reshape(w, cshape)]), cx.reshape(b, cshape)])
    return [y, cx.reshape(mean, (c,)), cx.reshape(rstd, (c,))]


@aten("native_layer_norm.default", "layer_norm.default")
def layer_norm(cx: AtenCtx, a: Args) -> Value | list[Value]:
    x, shape = a["input"], tuple(a["normalized_shape"])
    axis = len(x.shape) - len(shape)
    w = _ones_if_none(cx, a["weight"], shape)
    args = [x, w] + ([a["bias"]] if a["bias"] is not None else [])
    y = cx.add("LayerNormalization", args, axis=axis, epsilon=float(a["eps"]))
    if cx.op == "layer_norm.default":
        return y
    mean, _, var = _moments(cx, x, tuple(range(axis, len(x.shape))))  # dropped unless read (dead code)
    return [y, mean, _rsqrt(cx, var, float(a["eps"]))]


@aten("native_group_norm.default", "group_norm.default")
def group_norm(cx: AtenCtx, a: Args) -> Value | list[Value]:
    x = a["input"]
    g, eps = int(a["group"] if "group" in a else a["num_groups"]), float(a["eps"])
    n, c = x.shape[:2]
    xr = cx.reshape(x, (n, g, x.type.size // (n * g)))
    mean, d, var = _moments(cx, xr, (2,))
    rstd = _rsqrt(cx, var, eps)
    y = cx.reshape(cx.add("Mul", [d, rstd]), x.shape)
    cshape = (c,) + (1,) * (len(x.shape) - 2)
    if a["weight"] is not None:
        y = cx.add("Mul", [y, cx.reshape(a["weight"], cshape)])
    if a["bias"] is not None:
        y = cx.add("Add", [y, cx.reshape(a["bias"], cshape)])
    if cx.op == "group_norm.default":
        return y
    return [y, cx.reshape(mean, (n, g)), cx.reshape(rstd, (n, g))]


@aten("_softmax.default", "_log_softmax.default", "softmax.int", "log_softmax.int")
def softmax(cx: AtenCtx, a: Args) -> Value:
    x = cx.cast(a["self"], cx.out_dtype())
    axis = a["dim"] % max(len(x.shape), 1)
    if not x.shape:
        return cx.constant(np.array(0.0 if "log" in cx.op else 1.0, dtype=x.dtype))
    return cx.add("LogSoftmax" if "log" in cx.op else "Softmax", [x], axis=axis)


# -- upsampling --------------------------------------------------------------------------------------------------------
@aten("upsample_nearest2d.vec", "upsample_nearest2d.default", "upsample_bilinear2d.vec",
      "upsample_bilinear2d.default", "upsample_nearest1d.vec", "upsample_linear1d.vec")
def upsample(cx: AtenCtx, a: Args) -> Value:
    x = a["input"] if "input" in a else a["self"]
    nd = len(x.shape) - 2
    out = cx.out_shape()
    factors = a.get("scale_factors") or [a.get(k) for k in (("scales_h", "scales_w") if nd == 2 else ("scales",))]
    if not factors or any(f is None for f in factors):  # from the sizes: torch's scale is then in/out
        factors = [out[2 + i] / x.shape[2 + i] for i in range(nd)]
    scales = [1.0, 1.0] + [float(f) for f in factors]
    if "nearest" in cx.op:
        return _resize(cx, x, scales, list(out), "nearest", "asymmetric", "floor", None)
    coord = "align_corners" if a["align_corners"] else "pytorch_half_pixel"
    return _resize(cx, x, scales, list(out), "linear", coord, "floor", None)


# -- attention (when a graph keeps the fused op; Core ATen decomposes it) ----------------------------------------------
@aten("scaled_dot_product_attention.default")
def sdpa(cx: AtenCtx, a: Args) -> Value:
    q, k, v, mask = a["query"], a["key"], a["value"], a["attn_mask"]
    if a["dropout_p"] or a.get("enable_gqa"):
        raise cx.unsupported("dropout or grouped-query attention")
    scale = a["scale"] if a["scale"] is not None else 1 / math.sqrt(q.shape[-1])
    rank = len(k.shape)
    kt = cx.add("Transpose", [k], perm=tuple(range(rank - 2)) + (rank - 1, rank - 2))
    s = cx.add("Mul", [cx.add("MatMul", [q, kt]), cx.scalar(scale, q.dtype)])
    lq, lk = q.shape[-2], k.shape[-2]
    if a["is_causal"]:
        keep = np.tril(np.ones((lq, lk), dtype=bool))
        s = cx.add("Where", [cx.constant(keep), s, cx.scalar(-np.inf, s.dtype)])
    if mask is not None:
        s = cx.add("Where", [mask, s, cx.scalar(-np.inf, s.dtype)]) if mask.dtype == "bool" else \
            cx.add("Add", [s, mask])
    return cx.add("MatMul", [cx.add("Softmax", [s], axis=len(s.shape) - 1), v])
