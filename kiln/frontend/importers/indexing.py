"""Indexing ops: GatherElements, ScatterElements, ScatterND, GatherND, TopK, …"""
from __future__ import annotations

from kiln.errors import ModelError
from kiln.frontend.context import Ctx
from kiln.frontend.importers.registry import _axis, importer
from kiln.graph import symbolic
from kiln.graph.ir import Value


# -- indexing ops ---------------------------------------------------------------------------------------------
@importer("GatherElements")
def imp_gather_elements(cx: Ctx, ins: list[Value | None]) -> list[Value]:
    x, idx = ins[0], ins[1]
    axis = _axis(cx.attr("axis", 0), len(x.shape), cx)
    if len(idx.shape) != len(x.shape):
        raise ModelError(f"node '{cx.name}': GatherElements indices of rank {len(idx.shape)} for data of rank "
                         f"{len(x.shape)}")
    return [cx.add("GatherElements", [x, idx], axis=axis)]


@importer("GatherND")
def imp_gather_nd(cx: Ctx, ins: list[Value | None]) -> list[Value]:
    x, idx = ins[0], ins[1]
    b = int(cx.attr("batch_dims", 0))
    if not idx.shape or idx.shape[-1] > len(x.shape) - b:
        raise ModelError(f"node '{cx.name}': GatherND indices {idx.shape} do not fit data {x.shape}")
    return [cx.add("GatherND", [x, idx], batch_dims=b)]


@importer("ScatterElements", "Scatter")
def imp_scatter_elements(cx: Ctx, ins: list[Value | None]) -> list[Value]:
    x, idx, upd = ins[:3]
    axis = _axis(cx.attr("axis", 0), len(x.shape), cx)
    if idx.shape != upd.shape or len(idx.shape) != len(x.shape):
        raise ModelError(f"node '{cx.name}': indices {idx.shape} and updates {upd.shape} must have the same shape "
                         f"and the rank of data {x.shape}")
    return [cx.add("ScatterElements", [x, idx, upd], axis=axis, reduction=cx.attr("reduction", "none"))]


@importer("ScatterND")
def imp_scatter_nd(cx: Ctx, ins: list[Value | None]) -> list[Value]:
    x, idx, upd = ins[:3]
    k = idx.shape[-1] if idx.shape else 0
    if not idx.shape or k > len(x.shape) or upd.shape != idx.shape[:-1] + x.shape[k:]:
        raise ModelError(f"node '{cx.name}': ScatterND indices {idx.shape} / updates {upd.shape} do not fit data "
                         f"{x.shape}")
    return [cx.add("ScatterND", [x, idx, upd], reduction=cx.attr("reduction", "none"))]


@importer("CumSum")
def imp_cumsum(cx: Ctx, ins: list[Value | None]) -> list[Value]:
    x = ins[0]
    axis = _axis(int(cx.const(ins[1], "axis").reshape(-1)[0]), len(x.shape), cx)
    return [cx.add("CumSum", [x], axis=axis, exclusive=int(cx.attr("exclusive", 0)),
                   reverse=int(cx.attr("reverse", 0)))]


@importer("TopK")
def imp_topk(cx: Ctx, ins: list[Value | None]) -> list[Value]:
    x = ins[0]
    axis = _axis(cx.attr("axis", -1), len(x.shape), cx)
    k = int(cx.attr("k")) if cx.opset < 10 else int(cx.const(ins[1], "K").reshape(-1)[0])
    if not 0 <= k <= symbolic.lower(x.shape[axis]):  # a symbolic axis: k must fit its smallest size
        raise ModelError(f"node '{cx.name}': TopK k={k} for an axis of size {symbolic.dim_str(x.shape[axis])}"
                         + ("" if symbolic.is_static(x.shape[axis]) else f" (≥ {symbolic.lower(x.shape[axis])})"))
    idx = cx.add("TopKIndex", [x], axis=axis, k=k, largest=int(cx.attr("largest", 1)))
    return [cx.add("GatherElements", [x, idx], axis=axis), idx]


@importer("ReverseSequence")
def imp_reverse_sequence(cx: Ctx, ins: list[Value | None]) -> list[Value]:
    return [cx.add("ReverseSequence", ins[:2], batch_axis=int(cx.attr("batch_axis", 1)),
                   time_axis=int(cx.attr("time_axis", 0)))]
