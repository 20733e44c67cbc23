"""Indexing: embedding, index_select, gather, index (one tensor index), topk."""
from __future__ import annotations

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
    """x[..., idx, ...] with one integer index tensor (the other positions taken whole)."""
    x, indices = a["self"], list(a["indices"])
    given = [i for i, v in enumerate(indices) if v is not None]
    if len(given) != 1:
        raise cx.unsupported(f"advanced indexing with {len(given)} index tensors (Kiln takes one)")
    return cx.add("Gather", [x, _index(cx, indices[given[0]])], axis=given[0])


@aten("topk.default")
def topk(cx: AtenCtx, a: Args) -> list[Value]:
    x = a["self"]
    axis = a["dim"] % max(len(x.shape), 1)
    if not a["sorted"]:
        raise cx.unsupported("sorted=False")
    idx = cx.add("TopKIndex", [x], axis=axis, k=int(a["k"]), largest=int(bool(a["largest"])))
    return [cx.add("GatherElements", [x, idx], axis=axis), idx]
