"""ONNX ops on jax arrays, and the ONNX -> jitted function translation used by the JAX peer.

The shared interpreter runs inside `jax.jit` tracing: tracers carry static shapes, the numpy constant
folding stays in numpy, and the weights are closed over as numpy arrays, so they become HLO constants
(XLA may fold layout changes of them at compile time). Products use `lax.dot_general` with the
contraction stated, never `x @ W.T`, which materializes the transpose on every call.
Imported only from inside prepare() (it imports jax).
"""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from onnx import helper

from kiln.bench.peers._onnx_interp import (
    UnsupportedOp,
    ceil_extra,
    flatten_shape,
    parse,
    reshape_shape,
    run_graph,
    slices,
    static_ints,
    static_scalar,
    unsqueeze_shape,
    window_attrs,
    window_pads,
)


def _dot(x, y, cx: int, cy: int):
    """Contract dim cx of x with dim cy of y (no batch dims): the layout-explicit product."""
    return lax.dot_general(x, y, (((cx,), (cy,)), ((), ())))


class JaxOps:
    """One method per ONNX op; numpy arguments are constants (embedded in the jitted program)."""

    def const(self, x: Any):
        return jnp.asarray(x) if isinstance(x, np.ndarray) else x

    t = const

    def Add(self, a, x, y): return jnp.add(self.t(x), self.t(y))
    def Sub(self, a, x, y): return jnp.subtract(self.t(x), self.t(y))
    def Mul(self, a, x, y): return jnp.multiply(self.t(x), self.t(y))

    def Div(self, a, x, y):
        x, y = self.t(x), self.t(y)
        if jnp.issubdtype(x.dtype, jnp.integer):
            return lax.div(x, y.astype(x.dtype))
        return jnp.divide(x, y)

    def Pow(self, a, x, y): return jnp.power(self.t(x), self.t(y))
    def Sqrt(self, a, x): return jnp.sqrt(x)
    def Neg(self, a, x): return jnp.negative(x)
    def Relu(self, a, x): return jnp.maximum(x, 0.0)
    def Sigmoid(self, a, x): return jax.nn.sigmoid(x)
    def Tanh(self, a, x): return jnp.tanh(x)
    def Erf(self, a, x): return lax.erf(x)
    def Identity(self, a, x): return x

    def Clip(self, a, x, lo=None, hi=None):
        lo = static_scalar(lo) if lo is not None else a.get("min")
        hi = static_scalar(hi) if hi is not None else a.get("max")
        return jnp.clip(x, lo, hi)

    def MatMul(self, a, x, y):
        x, y = self.t(x), self.t(y)
        if y.ndim == 2 and x.ndim >= 2:
            return _dot(x, y, x.ndim - 1, 0)
        if x.ndim == y.ndim and x.ndim > 2 and x.shape[:-2] == y.shape[:-2]:
            b = tuple(range(x.ndim - 2))
            return lax.dot_general(x, y, (((x.ndim - 1,), (y.ndim - 2,)), (b, b)))
        return jnp.matmul(x, y)

    def Gemm(self, a, x, w, c=None):
        x, w = self.t(x), self.t(w)
        y = _dot(x, w, 0 if a.get("transA", 0) else 1, 1 if a.get("transB", 0) else 0)
        if a.get("alpha", 1.0) != 1.0:
            y = y * a["alpha"]
        if c is not None:
            beta = a.get("beta", 1.0)
            y = y + (self.t(c) * beta if beta != 1.0 else self.t(c))
        return y

    def Conv(self, a, x, w, b=None):
        n = x.ndim - 2
        w = self.t(w)
        kernel, strides, dil = window_attrs(a, list(w.shape[2:]), n)
        pads = window_pads(a, list(x.shape[2:]), kernel, strides, dil)
        sp = "DHW"[-n:] if n <= 3 else None
        if sp is None:
            raise UnsupportedOp(f"Conv with {n} spatial dims")
        y = lax.conv_general_dilated(x, w, tuple(strides), [tuple(p) for p in pads], rhs_dilation=tuple(dil),
                                     dimension_numbers=("NC" + sp, "OI" + sp, "NC" + sp),
                                     feature_group_count=a.get("group", 1))
        if b is not None:
            y = y + self.t(b).reshape((1, -1) + (1,) * n)
        return y

    def BatchNormalization(self, a, x, scale, bias, mean, var):
        if not all(isinstance(v, np.ndarray) for v in (scale, bias, mean, var)):
            raise UnsupportedOp("BatchNormalization with runtime statistics")
        s = scale / np.sqrt(var + a.get("epsilon", 1e-5))
        shift = bias - mean * s
        shape = (1, -1) + (1,) * (x.ndim - 2)
        s, shift = (jnp.asarray(v.astype(np.float32)).reshape(shape) for v in (s, shift))
        return x * s + shift

    def LayerNormalization(self, a, x, scale, bias=None):
        axes = tuple(range(a.get("axis", -1) % x.ndim, x.ndim))
        mu = jnp.mean(x, axis=axes, keepdims=True)
        xc = x - mu
        var = jnp.mean(xc * xc, axis=axes, keepdims=True)
        y = xc * lax.rsqrt(var + a.get("epsilon", 1e-5)) * self.t(scale)
        return y if bias is None else y + self.t(bias)

    def _pool(self, a, x, kind: str):
        n = x.ndim - 2
        kernel, strides, dil = window_attrs(a, None, n)
        pads = window_pads(a, list(x.shape[2:]), kernel, strides, dil)
        if a.get("ceil_mode", 0):
            extra = ceil_extra(list(x.shape[2:]), kernel, strides, pads, dil)
            pads = [(p0, p1 + e) for (p0, p1), e in zip(pads, extra)]
        win, st, dl = (1, 1, *kernel), (1, 1, *strides), (1, 1, *dil)
        pd = [(0, 0), (0, 0), *[tuple(p) for p in pads]]
        if kind == "MaxPool":
            return lax.reduce_window(x, -jnp.inf, lax.max, win, st, pd, window_dilation=dl)
        total = lax.reduce_window(x, 0.0, lax.add, win, st, pd, window_dilation=dl)
        if a.get("count_include_pad", 0) and not a.get("ceil_mode", 0):
            return total / float(np.prod(kernel))
        ones = np.ones((1, 1, *x.shape[2:]), np.float32)
        count = lax.reduce_window(jnp.asarray(ones), 0.0, lax.add, win, st, pd, window_dilation=dl)
        return total / count

    def MaxPool(self, a, x): return self._pool(a, x, "MaxPool")
    def AveragePool(self, a, x): return self._pool(a, x, "AveragePool")
    def GlobalAveragePool(self, a, x): return jnp.mean(x, axis=tuple(range(2, x.ndim)), keepdims=True)
    def GlobalMaxPool(self, a, x): return jnp.max(x, axis=tuple(range(2, x.ndim)), keepdims=True)
    def Softmax(self, a, x): return jax.nn.softmax(x, axis=a.get("axis", -1))

    def ReduceMean(self, a, x, axes=None):
        ax = static_ints(axes) if axes is not None else a.get("axes", list(range(x.ndim)))
        return jnp.mean(x, axis=tuple(ax), keepdims=bool(a.get("keepdims", 1)))

    def Reshape(self, a, x, s): return jnp.reshape(x, reshape_shape(x.shape, s, a.get("allowzero", 0)))
    def Flatten(self, a, x): return jnp.reshape(x, flatten_shape(x.shape, a.get("axis", 1)))
    def Transpose(self, a, x): return jnp.transpose(self.t(x), a.get("perm"))

    def Unsqueeze(self, a, x, axes=None):
        ax = static_ints(axes) if axes is not None else a["axes"]
        return jnp.reshape(x, unsqueeze_shape(x.shape, ax))

    def Squeeze(self, a, x, axes=None):
        ax = static_ints(axes) if axes is not None else a.get("axes")
        return jnp.squeeze(x, None if ax is None else tuple(ax))

    def Concat(self, a, *xs): return jnp.concatenate([self.t(x) for x in xs], axis=a["axis"])
    def Gather(self, a, x, idx): return jnp.take(self.t(x), self.t(idx), axis=a.get("axis", 0))
    def Slice(self, a, x, starts, ends, axes=None, steps=None):
        return x[slices(x.shape, starts, ends, axes, steps)]

    def Cast(self, a, x): return x.astype(helper.tensor_dtype_to_np_dtype(a["to"]))


def to_jax_function(model: Any) -> tuple[Any, list[str]]:
    """A jitted function(*inputs in model order) -> tuple of outputs, with the weights as constants."""
    graph = parse(model)
    ops = JaxOps()

    def forward(*xs):
        return tuple(run_graph(graph, ops, dict(zip(graph.inputs, xs))))

    return jax.jit(forward), graph.inputs
