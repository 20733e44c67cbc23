"""Indexing: embedding, index_select, gather, index (integer index tensors on adjacent dims), index_put of a
mask, topk."""
from __future__ import annotations

import numpy as np

from kiln.frontend.torch.importer import Args, AtenCtx, aten
from kiln.graph.ir import Value


def _index(cx: AtenCtx, idx: Value) -> Value:
    if idx.dtype not in ("int64", "int32"):
        raise cx.unsupported(f"{idx.dtype} indices")
    return idx


@aten("embedding.default")
def embedding(cx: AtenCtx, a: Args) -> Value:
    return cx.add("Gather", [a["weight"], _index(cx, a["indices"])], axis=0)


@aten("index_select.default")
def index_select(cx: AtenCtx, a: Args) -> Value:
    x = a["self"]
    return cx.add("Gather", [x, _index(cx, a["index"])], axis=a["dim"] % max(len(x.shape), 1))


@aten("gather.default")
def gather(cx: AtenCtx, a: Args) -> Value:
    x, idx = a["self"], _index(cx, a["index"])
    return cx.add("GatherElements", [x, idx], axis=a["dim"] % max(len(x.shape), 1))


@aten("index.Tensor")
def index(cx: AtenCtx, a: Args) -> Value:
    """x[..., i0, i1, ..., :] with integer index tensors on adjacent dims (broadcast together): one Gather on those
    dims merged, at the flat index i0·n1·n2… + i1·n2… + … (torch keeps the result dims in place when the indexed
    dims are adjacent)."""
    x, indices = a["self"], list(a["indices"])
    given = [i for i, v in enumerate(indices) if v is not None]
    if not given:
        return x
    d0, k = given[0], len(given)
    if given != list(range(d0, d0 + k)):
        raise cx.unsupported("index tensors on dims that are not adjacent")
    sizes = x.shape[d0:d0 + k]
    flat = None
    for j, d in enumerate(given):
        idx = cx.cast(_index(cx, indices[d]), "int64")
        n = x.shape[d]
        wrapped = cx.add("Add", [idx, cx.scalar(n, "int64")])
        idx = cx.add("Where", [cx.add("Less", [idx, cx.scalar(0, "int64")]), wrapped, idx])
        stride = int(np.prod(sizes[j + 1:], dtype=np.int64))
        term = idx if stride == 1 else cx.add("Mul", [idx, cx.scalar(stride, "int64")])
        flat = term if flat is None else cx.add("Add", [flat, term])
    merged = cx.reshape(x, x.shape[:d0] + (int(np.prod(sizes, dtype=np.int64)),) + x.shape[d0 + k:])
    return cx.add("Gather", [merged, flat], axis=d0)


@aten("topk.default")
def topk(cx: AtenCtx, a: Args) -> list[Value]:
    x = a["self"]
    axis = a["dim"] % max(len(x.shape), 1)
    if not a["sorted"]:
        raise cx.unsupported("sorted=False")
    idx = cx.add("TopKIndex", [x], axis=axis, k=int(a["k"]), largest=int(bool(a["largest"])))
    return [cx.add("GatherElements", [x, idx], axis=axis), idx]


@aten("index_put.default")
def index_put(cx: AtenCtx, a: Args) -> Value:
    """x[mask] = v with a boolean mask of x's shape (a masked assignment): where(mask, v, x)."""
    x, indices, v = a["self"], list(a["indices"]), a["values"]
    if a["accumulate"] or len(indices) != 1 or indices[0] is None or indices[0].dtype != "bool" \
            or indices[0].shape != x.shape or v.type.size != 1:
        raise cx.unsupported("index_put other than x[mask] = scalar with a mask of x's shape")
    return cx.add("Where", [indices[0], cx.reshape(cx.cast(v, x.dtype), ()), x])
