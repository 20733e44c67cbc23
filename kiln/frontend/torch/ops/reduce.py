"""Reductions: sum/mean/prod/amax/amin, max/min with indices, argmax/argmin, var/std, any/all, logsumexp,
cumsum."""
from __future__ import annotations

from collections.abc import Sequence

from kiln.frontend.torch.importer import Args, AtenCtx, aten
from kiln.graph.ir import Value


def _axes(x: Value, dim: int | Sequence[int] | None) -> tuple[int, ...]:
    """torch's dim argument: None or [] is every axis."""
    rank = max(len(x.shape), 1)
    if dim is None or (not isinstance(dim, int) and len(dim) == 0):
        return tuple(range(len(x.shape)))
    dims = [dim] if isinstance(dim, int) else dim
    return tuple(sorted({d % rank for d in dims}))


def reduce(cx: AtenCtx, x: Value, kind: str, dim: int | Sequence[int] | None, keepdim: bool) -> Value:
    axes = _axes(x, dim)
    if not x.shape or not axes:
        return cx.reshape(x, cx.out_shape())
    return cx.add("Reduce", [x], kind=kind, axes=axes, keepdims=bool(keepdim))


@aten("sum.dim_IntList", "sum.default", "mean.dim", "mean.default", "prod.dim_int", "prod.default", "amax.default",
      "amin.default", "max.default", "min.default")
def simple(cx: AtenCtx, a: Args) -> Value:
    kind = {"sum": "sum", "mean": "mean", "prod": "prod", "amax": "max", "amin": "min", "max": "max",
            "min": "min"}[cx.op.split(".")[0]]
    x = a["self"]
    if kind in ("sum", "mean", "prod"):
        x = cx.cast(x, cx.out_dtype())
    return reduce(cx, x, kind, a.get("dim"), a.get("keepdim", False))


@aten("max.dim", "min.dim")
def max_dim(cx: AtenCtx, a: Args) -> list[Value]:
    x, kind = a["self"], cx.op.split(".")[0]
    axis = a["dim"] % max(len(x.shape), 1)
    keep = bool(a["keepdim"])
    return [reduce(cx, x, kind, axis, keep),
            cx.add("ArgReduce", [x], kind=kind, axis=axis, keepdims=keep, last=False)]


@aten("argmax.default", "argmin.default")
def argmax(cx: AtenCtx, a: Args) -> Value:
    x, dim = a["self"], a["dim"]
    if dim is None:
        x, dim = cx.reshape(x, (x.type.size,)), 0
    return cx.add("ArgReduce", [x], kind=cx.op[3:6], axis=dim % max(len(x.shape), 1),
                  keepdims=bool(a["keepdim"]) and a["dim"] is not None, last=False)


@aten("var.correction", "var_mean.correction", "std.correction", "var.dim", "std.dim")
def var(cx: AtenCtx, a: Args) -> Value | list[Value]:
    x = a["self"]
    axes = _axes(x, a["dim"])
    count = 1
    for d in axes:
        count *= x.shape[d]
    correction = a.get("correction")
    correction = (1 if a.get("unbiased", True) else 0) if correction is None else correction
    mean = cx.add("Reduce", [x], kind="mean", axes=axes, keepdims=True)
    d = cx.add("Sub", [x, mean])
    ss = cx.add("Reduce", [cx.add("Mul", [d, d])], kind="sum", axes=axes, keepdims=bool(a["keepdim"]))
    v = cx.add("Mul", [ss, cx.scalar(1.0 / max(count - correction, 0) if count > correction else float("nan"),
                                     x.dtype)])
    if cx.op.startswith("std"):
        return cx.add("Sqrt", [v])
    if cx.op.startswith("var_mean"):
        return [v, cx.reshape(mean, cx.out_shape(1))]
    return v


@aten("any.dim", "any.dims", "any.default", "all.dim", "all.dims", "all.default")
def any_all(cx: AtenCtx, a: Args) -> Value:
    return reduce(cx, cx.cast(a["self"], "bool"), "max" if cx.op.startswith("any") else "min", a.get("dim"),
                  a.get("keepdim", False))


@aten("logsumexp.default")
def logsumexp(cx: AtenCtx, a: Args) -> Value:
    x = cx.cast(a["self"], cx.out_dtype())
    axes = _axes(x, a["dim"])
    m = cx.add("Reduce", [x], kind="max", axes=axes, keepdims=True)
    s = cx.add("Reduce", [cx.add("Exp", [cx.add("Sub", [x, m])])], kind="sum", axes=axes, keepdims=True)
    y = cx.add("Add", [cx.add("Log", [s]), m])  # max-shifted: exp never overflows
    return cx.reshape(y, cx.out_shape())


@aten("cumsum.default")
def cumsum(cx: AtenCtx, a: Args) -> Value:
    x = cx.cast(a["self"], cx.out_dtype())
    return cx.add("CumSum", [x], axis=a["dim"] % max(len(x.shape), 1), exclusive=0, reverse=0)
