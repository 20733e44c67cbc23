"""A small ONNX interpreter shared by the torch and JAX peers (neither reads ONNX).

`run_graph` walks the nodes in order. A value is either a numpy array (a constant: an initializer,
a Constant node, a Shape of a statically shaped tensor, or anything computed only from those) or a
backend tensor. Nodes whose inputs are all constants are folded here in numpy, so shape arithmetic
(Shape->Gather->Unsqueeze->Concat->Reshape) never reaches the backend, and static parameters
(Reshape targets, Clip bounds, Unsqueeze axes...) are plain Python values when the backend op runs.
Backends are objects with one method per ONNX op (`Conv(attrs, x, w, b)`) plus `const(np_array)`.
Running this under `jax.jit` or torch's `make_fx` gives a graph of backend ops with the weights as
constants: the interpreter itself costs nothing at run time.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from kiln.bench.peers.base import PeerError


class UnsupportedOp(PeerError, NotImplementedError):
    """The model uses an ONNX op (or an attribute value) that this interpreter does not implement."""


@dataclass
class Node:
    op: str
    inputs: list[str]
    outputs: list[str]
    attrs: dict[str, Any]
    name: str = ""


@dataclass
class Graph:
    inputs: list[str]                     # runtime inputs, in model order (initializers excluded)
    outputs: list[str]
    consts: dict[str, np.ndarray]
    nodes: list[Node] = field(default_factory=list)


def _attr(a: onnx.AttributeProto) -> Any:
    v = helper.get_attribute_value(a)
    if isinstance(v, onnx.TensorProto):
        return numpy_helper.to_array(v)
    if isinstance(v, bytes):
        return v.decode()
    if isinstance(v, list) and v and isinstance(v[0], bytes):
        return [x.decode() for x in v]
    return v


def parse(model: onnx.ModelProto) -> Graph:
    """Flatten the model into a Graph; only the default ONNX domain is supported."""
    for imp in model.opset_import:
        if imp.domain not in ("", "ai.onnx"):
            raise UnsupportedOp(f"opset domain {imp.domain!r}")
    g = model.graph
    consts = {t.name: numpy_helper.to_array(t) for t in g.initializer}
    g_out = Graph([i.name for i in g.input if i.name not in consts], [o.name for o in g.output], consts)
    for n in g.node:
        if n.domain not in ("", "ai.onnx"):
            raise UnsupportedOp(f"{n.domain}::{n.op_type} (node {n.name!r})")
        attrs = {a.name: _attr(a) for a in n.attribute}
        g_out.nodes.append(Node(n.op_type, list(n.input), list(n.output), attrs, n.name))
    return g_out


# ---- numpy folding of constant sub-graphs ---------------------------------------------------------
def _np_gather(a: dict, x: np.ndarray, idx: np.ndarray) -> np.ndarray:
    return np.take(x, idx, axis=a.get("axis", 0))


def _np_unsqueeze(a: dict, x: np.ndarray, axes: np.ndarray | None = None) -> np.ndarray:
    ax = static_ints(axes) if axes is not None else list(a["axes"])
    return np.reshape(x, unsqueeze_shape(x.shape, ax))


def _np_squeeze(a: dict, x: np.ndarray, axes: np.ndarray | None = None) -> np.ndarray:
    ax = static_ints(axes) if axes is not None else a.get("axes")
    return np.squeeze(x, axis=None if ax is None else tuple(ax))


def _np_slice(a: dict, x, starts, ends, axes=None, steps=None) -> np.ndarray:
    return x[slices(x.shape, starts, ends, axes, steps)]


def _np_div(a: dict, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    if np.issubdtype(x.dtype, np.integer):
        return (np.trunc(x / y)).astype(x.dtype)
    return x / y


NUMPY_OPS = {
    "Identity": lambda a, x: x,
    "Gather": _np_gather,
    "Unsqueeze": _np_unsqueeze,
    "Squeeze": _np_squeeze,
    "Concat": lambda a, *xs: np.concatenate(xs, axis=a["axis"]),
    "Reshape": lambda a, x, s: np.reshape(x, reshape_shape(x.shape, s, a.get("allowzero", 0))),
    "Cast": lambda a, x: x.astype(helper.tensor_dtype_to_np_dtype(a["to"])),
    "Slice": _np_slice,
    "Add": lambda a, x, y: x + y,
    "Sub": lambda a, x, y: x - y,
    "Mul": lambda a, x, y: x * y,
    "Div": _np_div,
    "Sqrt": lambda a, x: np.sqrt(x),
    "Neg": lambda a, x: -x,
    "Transpose": lambda a, x: np.transpose(x, a.get("perm")),
    "Flatten": lambda a, x: x.reshape(flatten_shape(x.shape, a.get("axis", 1))),
    "Equal": lambda a, x, y: np.equal(x, y),
    "Where": lambda a, c, x, y: np.where(c, x, y),
    "Range": lambda a, s, e, d: np.arange(s, e, d, dtype=np.result_type(s, e, d)),
    "ConstantOfShape": lambda a, s: np.full(static_ints(s), a["value"].reshape(-1)[0], a["value"].dtype)
    if "value" in a else np.zeros(static_ints(s), np.float32),
    "Expand": lambda a, x, s: x * np.ones(static_ints(s), dtype=x.dtype),
}


def _constant(attrs: dict) -> np.ndarray:
    for key, dt in (("value", None), ("value_float", np.float32), ("value_floats", np.float32),
                    ("value_int", np.int64), ("value_ints", np.int64)):
        if key in attrs:
            return np.asarray(attrs[key], dtype=dt)
    raise UnsupportedOp(f"Constant with attributes {sorted(attrs)}")


def run_graph(graph: Graph, backend: Any, feeds: dict[str, Any]) -> list[Any]:
    """Evaluate the graph; returns the outputs in model order (numpy constants converted by the backend)."""
    env: dict[str, Any] = dict(graph.consts)
    env[""] = None
    missing = [n for n in graph.inputs if n not in feeds]
    if missing:
        raise KeyError(f"missing inputs {missing}")
    env.update(feeds)
    for node in graph.nodes:
        ins = [env[i] for i in node.inputs]
        while ins and ins[-1] is None:  # trailing optional inputs
            ins.pop()
        if node.op == "Constant":
            outs: Sequence[Any] = [_constant(node.attrs)]
        elif node.op == "Shape":
            s = np.asarray(tuple(ins[0].shape), dtype=np.int64)
            outs = [s[node.attrs.get("start", 0):node.attrs.get("end", len(s))]]
        elif node.op in NUMPY_OPS and all(isinstance(x, np.ndarray) or x is None for x in ins):
            outs = [np.asarray(NUMPY_OPS[node.op](node.attrs, *ins))]
        else:
            fn = getattr(backend, node.op, None)
            if fn is None:
                raise UnsupportedOp(f"ONNX op {node.op!r} (node {node.name!r}) is not supported by "
                                    f"{type(backend).__name__}")
            res = fn(node.attrs, *ins)
            outs = res if isinstance(res, (tuple, list)) else [res]
        for name, val in zip(node.outputs, outs):
            env[name] = val
    return [backend.const(env[o]) if isinstance(env[o], np.ndarray) else env[o] for o in graph.outputs]


# ---- static-shape helpers used by both backends --------------------------------------------------
def static_ints(x: Any) -> list[int]:
    """A constant (numpy) value as a list of Python ints; a runtime tensor here cannot be made static."""
    if not isinstance(x, (np.ndarray, list, tuple)):
        raise UnsupportedOp(f"a shape/axes/bounds input that is not a constant ({type(x).__name__})")
    return [int(v) for v in np.asarray(x).reshape(-1)]


def static_scalar(x: Any) -> float | None:
    if x is None:
        return None
    if not isinstance(x, np.ndarray):
        raise UnsupportedOp("a Clip bound that is not a constant")
    return float(x.reshape(-1)[0])


def reshape_shape(in_shape: Sequence[int], shape: Any, allowzero: int = 0) -> tuple[int, ...]:
    s = static_ints(shape)
    if not allowzero:
        s = [in_shape[i] if v == 0 else v for i, v in enumerate(s)]
    if -1 in s:
        known = math.prod(v for v in s if v != -1)
        s[s.index(-1)] = math.prod(in_shape) // max(known, 1)
    return tuple(s)


def flatten_shape(in_shape: Sequence[int], axis: int) -> tuple[int, int]:
    axis = axis % (len(in_shape) + 1) if axis < 0 else axis
    return math.prod(in_shape[:axis]), math.prod(in_shape[axis:])


def unsqueeze_shape(in_shape: Sequence[int], axes: Sequence[int]) -> tuple[int, ...]:
    rank = len(in_shape) + len(axes)
    ax = sorted(a % rank for a in axes)
    out, it = [], iter(in_shape)
    for i in range(rank):
        out.append(1 if i in ax else next(it))
    return tuple(out)


def slices(shape: Sequence[int], starts, ends, axes=None, steps=None) -> tuple[slice, ...]:
    st, en = static_ints(starts), static_ints(ends)
    ax = static_ints(axes) if axes is not None else list(range(len(st)))
    sp = static_ints(steps) if steps is not None else [1] * len(st)
    sl = [slice(None)] * len(shape)
    for s, e, a, p in zip(st, en, ax, sp):
        a %= len(shape)
        dim = shape[a]
        e = max(min(e, dim), -dim - 1) if p < 0 else min(e, dim)
        sl[a] = slice(s, None if (p < 0 and e < -dim) else e, p)
    return tuple(sl)


def window_pads(attrs: dict, spatial: Sequence[int], kernel: Sequence[int], strides: Sequence[int],
                dilations: Sequence[int]) -> list[tuple[int, int]]:
    """(begin, end) padding per spatial dim from `pads` or `auto_pad` (Conv and pooling)."""
    n = len(spatial)
    auto = attrs.get("auto_pad", "NOTSET")
    if auto in ("NOTSET", ""):
        p = list(attrs.get("pads", [0] * 2 * n))
        return [(p[i], p[i + n]) for i in range(n)]
    if auto == "VALID":
        return [(0, 0)] * n
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        out = []
        for x, k, s, d in zip(spatial, kernel, strides, dilations):
            total = max((math.ceil(x / s) - 1) * s + (k - 1) * d + 1 - x, 0)
            small, big = total // 2, total - total // 2
            out.append((small, big) if auto == "SAME_UPPER" else (big, small))
        return out
    raise UnsupportedOp(f"auto_pad={auto!r}")


def ceil_extra(spatial: Sequence[int], kernel: Sequence[int], strides: Sequence[int],
               pads: Sequence[tuple[int, int]], dilations: Sequence[int]) -> list[int]:
    """Extra end padding turning floor-mode pooling into ONNX ceil_mode=1 (last window starts inside)."""
    extra = []
    for x, k, s, (b, e), d in zip(spatial, kernel, strides, pads, dilations):
        eff = (k - 1) * d + 1
        out_floor = (x + b + e - eff) // s + 1
        out_ceil = -(-(x + b + e - eff) // s) + 1
        if (out_ceil - 1) * s >= x + b:
            out_ceil -= 1
        extra.append((out_ceil - out_floor) * s if out_ceil > out_floor else 0)
    return extra


def window_attrs(attrs: dict, w_spatial: Sequence[int] | None,
                 n: int) -> tuple[list[int], list[int], list[int]]:
    """kernel, strides, dilations of a Conv/pool node (kernel from the weight when not an attribute)."""
    kernel = list(attrs.get("kernel_shape", w_spatial or []))
    if len(kernel) != n:
        raise UnsupportedOp(f"kernel_shape {kernel} for {n} spatial dims")
    return kernel, list(attrs.get("strides", [1] * n)), list(attrs.get("dilations", [1] * n))
