"""ONNX ops on torch tensors, and the ONNX -> torch.nn.Module translation used by the torch/inductor peers.

`to_torch_module` runs the shared interpreter once under `make_fx` on the real inputs: the result is
an `fx.GraphModule` of aten ops with every shape resolved and the interpreter gone; the weights, which
make_fx records as tensor constants, are re-registered as buffers so `torch.compile` freezing sees
them as the module's state. Imported only from inside prepare() (it imports torch).
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from onnx import helper

from kiln.bench.peers._onnx_interp import (
    UnsupportedOp,
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


class TorchOps:
    """One method per ONNX op; numpy arguments are constants, turned into tensors by `t`."""

    def __init__(self) -> None:
        self._cache: dict[int, tuple[np.ndarray, torch.Tensor]] = {}

    def const(self, x: Any) -> torch.Tensor:
        if isinstance(x, torch.Tensor):
            return x
        hit = self._cache.get(id(x))
        if hit is None or hit[0] is not x:
            hit = (x, torch.from_numpy(np.array(x)))  # np.array: own a writable contiguous copy
            self._cache[id(x)] = hit
        return hit[1]

    t = const

    # -- elementwise
    def Add(self, a, x, y): return torch.add(self.t(x), self.t(y))
    def Sub(self, a, x, y): return torch.sub(self.t(x), self.t(y))
    def Mul(self, a, x, y): return torch.mul(self.t(x), self.t(y))

    def Div(self, a, x, y):
        x, y = self.t(x), self.t(y)
        if not x.is_floating_point():
            return torch.div(x, y, rounding_mode="trunc")
        return torch.div(x, y)

    def Pow(self, a, x, y): return torch.pow(self.t(x), self.t(y))
    def Sqrt(self, a, x): return torch.sqrt(x)
    def Neg(self, a, x): return torch.neg(x)
    def Relu(self, a, x): return F.relu(x)
    def Sigmoid(self, a, x): return torch.sigmoid(x)
    def Tanh(self, a, x): return torch.tanh(x)
    def Erf(self, a, x): return torch.erf(x)
    def Identity(self, a, x): return x

    def Clip(self, a, x, lo=None, hi=None):
        lo = static_scalar(lo) if lo is not None else a.get("min")
        hi = static_scalar(hi) if hi is not None else a.get("max")
        if lo == 0.0 and hi == 6.0:
            return F.relu6(x)
        return torch.clamp(x, lo, hi)

    # -- linear algebra
    def MatMul(self, a, x, y): return torch.matmul(self.t(x), self.t(y))

    def Gemm(self, a, x, w, c=None):
        alpha, beta = a.get("alpha", 1.0), a.get("beta", 1.0)
        x, w = self.t(x), self.t(w)
        if a.get("transA", 0):
            x = x.t()
        if a.get("transB", 0) and alpha == 1.0 and beta == 1.0 and (c is None or c.ndim == 1):
            return F.linear(x, w, None if c is None else self.t(c))
        y = torch.matmul(x, w.t() if a.get("transB", 0) else w)
        if alpha != 1.0:
            y = y * alpha
        if c is not None:
            y = y + (self.t(c) * beta if beta != 1.0 else self.t(c))
        return y

    # -- convolution, normalization, pooling
    def Conv(self, a, x, w, b=None):
        n = x.ndim - 2
        if n != 2:
            raise UnsupportedOp(f"Conv with {n} spatial dims")
        w = self.t(w)
        kernel, strides, dil = window_attrs(a, list(w.shape[2:]), n)
        pads = window_pads(a, list(x.shape[2:]), kernel, strides, dil)
        if any(p0 != p1 for p0, p1 in pads):
            x = F.pad(x, [v for p in reversed(pads) for v in p])
            pads = [(0, 0)] * n
        return F.conv2d(x, w, None if b is None else self.t(b), strides, [p[0] for p in pads], dil,
                        a.get("group", 1))

    def BatchNormalization(self, a, x, scale, bias, mean, var):
        return F.batch_norm(x, self.t(mean), self.t(var), self.t(scale), self.t(bias), False, 0.0,
                            a.get("epsilon", 1e-5))

    def LayerNormalization(self, a, x, scale, bias=None):
        axis = a.get("axis", -1) % x.ndim
        return F.layer_norm(x, tuple(x.shape[axis:]), self.t(scale), None if bias is None else self.t(bias),
                            a.get("epsilon", 1e-5))

    def _pool(self, a, x, kind: str):
        n = x.ndim - 2
        kernel, strides, dil = window_attrs(a, None, n)
        pads = window_pads(a, list(x.shape[2:]), kernel, strides, dil)
        if n != 2:
            raise UnsupportedOp(f"{kind} with {n} spatial dims")
        ceil = bool(a.get("ceil_mode", 0))
        if kind == "MaxPool":
            if any(p0 != p1 or p0 > kernel[i] // 2 for i, (p0, p1) in enumerate(pads)):
                x = F.pad(x, [v for p in reversed(pads) for v in p], value=float("-inf"))
                pads = [(0, 0)] * n
            return F.max_pool2d(x, kernel, strides, [p[0] for p in pads], dil, ceil_mode=ceil)
        if any(d != 1 for d in dil) or any(p0 != p1 for p0, p1 in pads):
            raise UnsupportedOp("AveragePool with dilations or asymmetric pads")
        return F.avg_pool2d(x, kernel, strides, [p[0] for p in pads], ceil_mode=ceil,
                            count_include_pad=bool(a.get("count_include_pad", 0)))

    def MaxPool(self, a, x): return self._pool(a, x, "MaxPool")
    def AveragePool(self, a, x): return self._pool(a, x, "AveragePool")
    def GlobalAveragePool(self, a, x): return torch.mean(x, dim=tuple(range(2, x.ndim)), keepdim=True)
    def GlobalMaxPool(self, a, x): return torch.amax(x, dim=tuple(range(2, x.ndim)), keepdim=True)

    def Softmax(self, a, x): return torch.softmax(x, a.get("axis", -1))

    def ReduceMean(self, a, x, axes=None):
        ax = static_ints(axes) if axes is not None else a.get("axes", list(range(x.ndim)))
        return torch.mean(x, dim=tuple(ax), keepdim=bool(a.get("keepdims", 1)))

    # -- shape ops on runtime tensors
    def Reshape(self, a, x, s): return torch.reshape(x, reshape_shape(x.shape, s, a.get("allowzero", 0)))
    def Flatten(self, a, x): return torch.reshape(x, flatten_shape(x.shape, a.get("axis", 1)))

    def Transpose(self, a, x):
        return torch.permute(self.t(x), a.get("perm", list(range(x.ndim))[::-1]))

    def Unsqueeze(self, a, x, axes=None):
        ax = static_ints(axes) if axes is not None else a["axes"]
        return torch.reshape(x, unsqueeze_shape(x.shape, ax))

    def Squeeze(self, a, x, axes=None):
        ax = static_ints(axes) if axes is not None else a.get("axes")
        return torch.squeeze(x) if ax is None else torch.squeeze(x, tuple(ax))

    def Concat(self, a, *xs): return torch.cat([self.t(x) for x in xs], a["axis"])

    def Gather(self, a, x, idx):
        x, axis = self.t(x), a.get("axis", 0)
        if isinstance(idx, np.ndarray) and idx.ndim == 0:
            return torch.select(x, axis, int(idx))
        idx = self.t(idx)
        flat = torch.index_select(x, axis, idx.reshape(-1))
        return flat.reshape(x.shape[:axis % x.ndim] + idx.shape + x.shape[axis % x.ndim + 1:])

    def Slice(self, a, x, starts, ends, axes=None, steps=None):
        sl = slices(x.shape, starts, ends, axes, steps)
        if any(s.step is not None and s.step < 0 for s in sl):
            raise UnsupportedOp("Slice with negative steps")
        return x[sl]

    def Cast(self, a, x):
        return x.to(torch.from_numpy(np.zeros(0, helper.tensor_dtype_to_np_dtype(a["to"]))).dtype)


def to_torch_module(model: Any, inputs: dict[str, np.ndarray]) -> tuple[torch.fx.GraphModule, list[str]]:
    """Translate an ONNX model into an fx.GraphModule(*inputs in model order) -> tuple of outputs."""
    from torch.fx.experimental.proxy_tensor import make_fx

    graph = parse(model)
    ops = TorchOps()

    def forward(*xs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(run_graph(graph, ops, dict(zip(graph.inputs, xs))))

    example = [torch.from_numpy(np.ascontiguousarray(inputs[n])) for n in graph.inputs]
    with torch.no_grad():
        gm = make_fx(forward)(*example)
    for node in list(gm.graph.nodes):
        # make_fx wraps every constant created in the trace in lift_fresh_copy, which copies the
        # weight on every call (64 MB per run for the mlp): use the constant itself.
        if node.op == "call_function" and node.target == torch.ops.aten.lift_fresh_copy.default:
            node.replace_all_uses_with(node.args[0])
            gm.graph.erase_node(node)
    for node in gm.graph.nodes:  # tensor constants -> buffers (freezing folds buffers, not attributes)
        if node.op == "get_attr":
            val = getattr(gm, node.target)
            if isinstance(val, torch.Tensor) and node.target not in dict(gm.named_buffers()):
                delattr(gm, node.target)
                gm.register_buffer(node.target, val)
    gm.recompile()
    return gm, graph.inputs
