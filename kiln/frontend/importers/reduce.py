"""Reductions (ReduceSum … ReduceLogSumExp) and ArgMax/ArgMin."""
from __future__ import annotations

from kiln.frontend.context import Ctx
from kiln.frontend.importers.registry import _axis, importer
from kiln.graph.ir import Value

# -- reductions ----------------------------------------------------------------------------------------------
_REDUCE_KIND = {"ReduceSum": "sum", "ReduceMean": "mean", "ReduceMax": "max", "ReduceMin": "min",
                "ReduceProd": "prod", "ReduceL1": "l1", "ReduceL2": "l2", "ReduceSumSquare": "sumsquare",
                "ReduceLogSumExp": "logsumexp", "ReduceLogSum": "logsum"}


@importer(*_REDUCE_KIND)
def imp_reduce(cx: Ctx, ins: list[Value | None]) -> list[Value]:
    x = ins[0]
    rank = len(x.shape)
    axes_from_input = cx.opset >= 18 or (cx.node.op_type == "ReduceSum" and cx.opset >= 13)
    if axes_from_input:
        axes = cx.const(ins[1], "axes").tolist() if len(ins) > 1 and ins[1] is not None else None
    else:
        axes = cx.attr("axes")
    if not axes:
        if axes_from_input and cx.attr("noop_with_empty_axes", 0):  # over no axes: only the per-element term
            kind = _REDUCE_KIND[cx.node.op_type]
            if kind in ("l1", "l2"):
                return [cx.add("Abs", [x])]
            return [cx.add("Mul", [x, x]) if kind == "sumsquare" else cx.add("Log", [x]) if kind == "logsum"
                    else x]
        axes = list(range(rank))
    axes = tuple(sorted({_axis(int(a), rank, cx) for a in axes}))  # [1, -1] name one axis once
    return [cx.add("Reduce", [x], kind=_REDUCE_KIND[cx.node.op_type], axes=axes,
                   keepdims=bool(cx.attr("keepdims", 1)))]


@importer("ArgMax", "ArgMin")
def imp_argreduce(cx: Ctx, ins: list[Value | None]) -> list[Value]:
    x = ins[0]
    return [cx.add("ArgReduce", [x], kind=cx.node.op_type[3:].lower(),
                   axis=_axis(cx.attr("axis", 0), len(x.shape), cx), keepdims=bool(cx.attr("keepdims", 1)),
                   last=bool(cx.attr("select_last_index", 0)))]
