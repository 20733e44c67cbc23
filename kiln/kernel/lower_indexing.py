"""Lowerings of the indexing ops (GatherElements, GatherND, ScatterElements, ScatterND, CumSum, TopK's index,
ReverseSequence), registered in kernel/lower.py's `LOWERINGS`. Gather-form throughout: every output element reads
what it needs, so no two stores race."""
from __future__ import annotations

import numpy as np

from kiln.errors import UnsupportedOperator
from kiln.graph.ir import Node
from kiln.kernel.elementwise import cast, f
from kiln.kernel.ir import Bin, Buffer, Compute, Const, Expr, Load, Reduce, Select, Var, cmp, maximum, minimum
from kiln.kernel.lower import Lowered, _out, axes_for, clamp, ld, lowering


def _index(v: Expr, n: int) -> Expr:
    """A run-time index into an axis of size n: negative wraps, out of range clamps (never out of bounds)."""
    k = cast(v, "int64")
    return clamp(Select(cmp("<", k, 0), k + n, k), 0, max(n - 1, 0))


def _identity(op: str, dtype: str) -> Const:
    from kiln.kernel.ir import init_value
    return init_value({"add": "sum", "mul": "prod", "max": "max", "min": "min"}[op], dtype)


def _combine(op: str, a: Expr, b: Expr) -> Expr:
    return {"add": lambda: a + b, "mul": lambda: a * b, "max": lambda: maximum(a, b),
            "min": lambda: minimum(a, b)}[op]()


@lowering("GatherElements")
def lower_gather_elements(n: Node) -> Lowered:
    (x, ind), (y, ax), axis = n.inputs, _out(n), n.attrs["axis"]
    k = _index(ld(ind, ax), x.shape[axis])
    return Lowered([Compute(y.name, ax, y.shape, ld(x, ax[:axis] + (k,) + ax[axis + 1:]))])


@lowering("GatherND")
def lower_gather_nd(n: Node) -> Lowered:
    (x, ind), (y, ax), b = n.inputs, _out(n), n.attrs["batch_dims"]
    q, k = len(ind.shape), ind.shape[-1]
    lead = ax[:q - 1]
    idx = list(lead[:b]) + [_index(ld(ind, lead + (Const(j, "int64"),)), x.shape[b + j]) for j in range(k)]
    return Lowered([Compute(y.name, ax, y.shape, ld(x, tuple(idx) + ax[q - 1:]))])


@lowering("ScatterElements")
def lower_scatter_elements(n: Node) -> Lowered:
    """out[p] = data[p] combined with every update whose index along `axis` lands on p (the last one wins
    for reduction='none')."""
    (data, ind, upd), (y, ax), a = n.inputs, _out(n), n.attrs
    axis, red, u = a["axis"], a["reduction"], ind.shape
    kv = Var("rs")
    inside: Expr = Const(True, "bool")
    at = []
    for d, v in enumerate(ax):
        if d == axis:
            at.append(kv)
        else:
            inside = Bin("and", inside, cmp("<", v, u[d])) if u[d] < data.shape[d] else inside
            at.append(clamp(v, 0, u[d] - 1) if u[d] < data.shape[d] else v)
    at = tuple(at)
    hit = Bin("and", inside, cmp("==", _index(ld(ind, at), data.shape[axis]), ax[axis]))
    if red == "none":
        last = Buffer(f"{y.name}.t0", "int64", y.shape)
        c0 = Compute(last.name, ax, y.shape, Reduce("max", ((kv, u[axis]),), Select(hit, kv, Const(-1, "int64"))))
        lv = Load(last.name, ax, "int64")
        src = tuple(clamp(lv, 0, u[axis] - 1) if d == axis else e for d, e in enumerate(at))
        body = Select(cmp(">=", lv, 0), ld(upd, src), ld(data, ax))
        return Lowered([c0, Compute(y.name, ax, y.shape, body)], [last])
    if red not in ("add", "mul", "max", "min"):
        raise UnsupportedOperator("ScatterElements", n.name, detail=f"reduction {red!r}")
    ident = _identity(red, upd.dtype)
    r = Reduce({"add": "sum", "mul": "prod"}.get(red, red), ((kv, u[axis]),), Select(hit, ld(upd, at), ident))
    return Lowered([Compute(y.name, ax, y.shape, _combine(red, ld(data, ax), r))])


@lowering("ScatterND")
def lower_scatter_nd(n: Node) -> Lowered:
    (data, ind, upd), (y, ax), red = n.inputs, _out(n), n.attrs["reduction"]
    k, lead = ind.shape[-1], ind.shape[:-1]
    us = tuple(Var(f"ru{d}") for d in range(len(lead)))
    hit: Expr = Const(True, "bool")
    for j in range(k):
        hit = Bin("and", hit, cmp("==", _index(ld(ind, us + (Const(j, "int64"),)), data.shape[j]), ax[j]))
    axes = tuple(zip(us, lead))
    if red == "none":
        flat: Expr = Const(0, "int64")
        for v, m in zip(us, lead):
            flat = flat * m + v
        last = Buffer(f"{y.name}.t0", "int64", y.shape)
        c0 = Compute(last.name, ax, y.shape, Reduce("max", axes, Select(hit, flat, Const(-1, "int64"))))
        lv = clamp(Load(last.name, ax, "int64"), 0, max(int(np.prod(lead)) - 1, 0))
        src, stride = [], int(np.prod(lead))
        for m in lead:
            stride //= m
            src.append((lv // stride) % m if stride > 1 else lv % m)
        body = Select(cmp(">=", Load(last.name, ax, "int64"), 0), ld(upd, tuple(src) + ax[k:]), ld(data, ax))
        return Lowered([c0, Compute(y.name, ax, y.shape, body)], [last])
    if red not in ("add", "mul", "max", "min"):
        raise UnsupportedOperator("ScatterND", n.name, detail=f"reduction {red!r}")
    r = Reduce({"add": "sum", "mul": "prod"}.get(red, red), axes,
               Select(hit, ld(upd, us + ax[k:]), _identity(red, upd.dtype)))
    return Lowered([Compute(y.name, ax, y.shape, _combine(red, ld(data, ax), r))])


@lowering("CumSum")
def lower_cumsum(n: Node) -> Lowered:
    (x,), (y, ax), a = n.inputs, _out(n), n.attrs
    axis = a["axis"]
    kv, i = Var("rc"), ax[axis]
    op = {(0, 0): "<=", (1, 0): "<", (0, 1): ">=", (1, 1): ">"}[(int(a["exclusive"]), int(a["reverse"]))]
    body = Reduce("sum", ((kv, x.shape[axis]),),
                  Select(cmp(op, kv, i), ld(x, ax[:axis] + (kv,) + ax[axis + 1:]), f(0, ld(x, ax))))
    return Lowered([Compute(y.name, ax, y.shape, body)])


@lowering("TopKIndex")
def lower_topk_index(n: Node) -> Lowered:
    """Rank every element (how many come before it: larger/smaller, ties by index), then the k-th output is
    the element of rank k. Two O(n²) passes along the axis."""
    (x,), (y, ax), a = n.inputs, _out(n), n.attrs
    axis = a["axis"]
    size = x.shape[axis]
    xax = axes_for(x.shape, "t")
    rank = Buffer(f"{y.name}.rank", "int64", x.shape)
    j = Var("rj")
    me, other = ld(x, xax), ld(x, xax[:axis] + (j,) + xax[axis + 1:])
    better = cmp(">" if a["largest"] else "<", other, me)
    before = Bin("or", better, Bin("and", cmp("==", other, me), cmp("<", j, xax[axis])))
    c0 = Compute(rank.name, xax, x.shape, Reduce("sum", ((j, size),), Select(before, Const(1, "int64"),
                                                                              Const(0, "int64"))))
    i = Var("ri")
    pick = Reduce("sum", ((i, size),), Select(cmp("==", Load(rank.name, ax[:axis] + (i,) + ax[axis + 1:], "int64"),
                                                  ax[axis]), i, Const(0, "int64")))
    return Lowered([c0, Compute(y.name, ax, y.shape, pick)], [rank])


@lowering("ReverseSequence")
def lower_reverse_sequence(n: Node) -> Lowered:
    (x, lens), (y, ax), a = n.inputs, _out(n), n.attrs
    t, b = a["time_axis"], a["batch_axis"]
    length = clamp(cast(ld(lens, (ax[b],)), "int64"), 0, x.shape[t])
    src = Select(cmp("<", ax[t], length), length - 1 - ax[t], ax[t])
    return Lowered([Compute(y.name, ax, y.shape, ld(x, tuple(src if d == t else v for d, v in enumerate(ax))))])
