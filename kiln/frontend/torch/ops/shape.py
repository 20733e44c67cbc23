"""Views and data movement: view/reshape/squeeze (shapes from torch's record of the node), permute, expand,
slicing and select, cat/stack/split/unbind, flip, repeat, padding, tril/triu. Views are values here: Kiln's
kernel builder makes the reshape-like ones views again (no copy)."""
from __future__ import annotations

import numpy as np

from kiln.frontend.torch.importer import Args, AtenCtx, aten
from kiln.graph.ir import Value


def _dim(d: int, rank: int) -> int:
    return d % max(rank, 1)


@aten("view.default", "_unsafe_view.default", "reshape.default", "unsqueeze.default", "squeeze.default",
      "squeeze.dim", "squeeze.dims", "flatten.using_ints", "view_copy.default", "unflatten.int")
def view(cx: AtenCtx, a: Args) -> Value:
    return cx.reshape(a["self"], cx.out_shape())


@aten("permute.default", "t.default", "transpose.int", "numpy_T.default")
def permute(cx: AtenCtx, a: Args) -> Value:
    x = a["self"]
    rank = len(x.shape)
    if cx.op == "permute.default":
        perm = tuple(_dim(d, rank) for d in a["dims"])
    else:
        d0, d1 = (_dim(a["dim0"], rank), _dim(a["dim1"], rank)) if cx.op == "transpose.int" else (0, rank - 1)
        perm = list(range(rank))
        perm[d0], perm[d1] = perm[d1], perm[d0]
        perm = tuple(perm) if cx.op != "numpy_T.default" else tuple(reversed(range(rank)))
    if perm == tuple(range(rank)):
        return x
    return cx.add("Transpose", [x], perm=perm)


@aten("expand.default", "expand_copy.default", "broadcast_to.default")
def expand(cx: AtenCtx, a: Args) -> Value:
    x, shape = a["self"], cx.out_shape()
    return x if x.shape == shape else cx.add("Expand", [x], shape=shape)


def _slice(cx: AtenCtx, x: Value, dim: int, start: int | None, end: int | None, step: int) -> Value:
    """x[..., start:end:step, ...] on `dim`, with Python's clamping of out-of-range bounds."""
    rank = len(x.shape)
    dim = _dim(dim, rank)
    start, end, _ = slice(start, end, step).indices(x.shape[dim])
    if step > 0 and (start, end, step) == (0, x.shape[dim], 1):
        return x
    starts, ends, steps = [0] * rank, list(x.shape), [1] * rank
    starts[dim], ends[dim], steps[dim] = start, end, step
    return cx.add("Slice", [x], starts=tuple(starts), ends=tuple(ends), steps=tuple(steps))


@aten("slice.Tensor", "slice_copy.Tensor")
def slice_(cx: AtenCtx, a: Args) -> Value:
    if a["step"] < 1:
        raise cx.unsupported(f"slice step {a['step']}")
    return _slice(cx, a["self"], a["dim"], a["start"], a["end"], a["step"])


@aten("select.int", "select_copy.int")
def select(cx: AtenCtx, a: Args) -> Value:
    x, dim, i = a["self"], _dim(a["dim"], len(a["self"].shape)), a["index"]
    i = i + x.shape[dim] if i < 0 else i
    return cx.reshape(_slice(cx, x, dim, i, i + 1, 1), cx.out_shape())


@aten("narrow.default")
def narrow(cx: AtenCtx, a: Args) -> Value:
    x, dim, start = a["self"], a["dim"], a["start"]
    start = start + x.shape[_dim(dim, len(x.shape))] if start < 0 else start
    return _slice(cx, x, dim, start, start + a["length"], 1)


@aten("flip.default")
def flip(cx: AtenCtx, a: Args) -> Value:
    x = a["self"]
    for d in a["dims"]:
        d = _dim(d, len(x.shape))
        x = _slice(cx, x, d, x.shape[d] - 1, None, -1)
    return x


@aten("cat.default", "concat.default", "concatenate.default")
def cat(cx: AtenCtx, a: Args) -> Value:
    dt = cx.out_dtype()
    parts = [cx.cast(v, dt) for v in a["tensors"] if v.type.size > 0 or len(v.shape) > 1]
    if len(parts) == 1:
        return parts[0]
    return cx.add("Concat", parts, axis=_dim(a["dim"], len(parts[0].shape)))


@aten("stack.default")
def stack(cx: AtenCtx, a: Args) -> Value:
    xs = a["tensors"]
    rank = len(xs[0].shape) + 1
    dim = _dim(a["dim"], rank)
    shape = list(xs[0].shape)
    shape.insert(dim, 1)
    parts = [cx.reshape(cx.cast(v, cx.out_dtype()), shape) for v in xs]
    return parts[0] if len(parts) == 1 else cx.add("Concat", parts, axis=dim)


@aten("split.Tensor", "split_with_sizes.default", "split_copy.Tensor", "split_with_sizes_copy.default",
      "unbind.int", "chunk.default")
def split(cx: AtenCtx, a: Args) -> list[Value]:
    x = a["self"]
    dim = _dim(a["dim"], len(x.shape))
    n = x.shape[dim]
    if cx.op.startswith("unbind"):
        return [cx.reshape(_slice(cx, x, dim, i, i + 1, 1), x.shape[:dim] + x.shape[dim + 1:]) for i in range(n)]
    if cx.op.startswith("chunk"):
        step = -(-n // a["chunks"])
        sizes = [min(step, n - s) for s in range(0, n, step)]
    elif "with_sizes" in cx.op:
        sizes = list(a["split_sizes"])
    else:
        step = a["split_size"]
        sizes = [min(step, n - s) for s in range(0, n, step)] or [0]
    outs, start = [], 0
    for size in sizes:
        outs.append(_slice(cx, x, dim, start, start + size, 1))
        start += size
    return outs


@aten("repeat.default")
def repeat(cx: AtenCtx, a: Args) -> Value:
    x, reps = a["self"], tuple(a["repeats"])
    x = cx.reshape(x, (1,) * (len(reps) - len(x.shape)) + x.shape)
    return x if all(r == 1 for r in reps) else cx.add("Tile", [x], repeats=reps)


@aten("constant_pad_nd.default", "reflection_pad1d.default", "reflection_pad2d.default", "replication_pad1d.default",
      "replication_pad2d.default", "pad.default", "reflection_pad3d.default", "replication_pad3d.default")
def pad(cx: AtenCtx, a: Args) -> Value:
    x, p = a["self"], list(a["pad"] if "pad" in a else a["padding"])
    rank = len(x.shape)
    mode = a.get("mode") or ("reflect" if cx.op.startswith("reflection") else
                             "edge" if cx.op.startswith("replication") else "constant")
    mode = {"replicate": "edge", "circular": "wrap"}.get(mode, mode)
    lo, hi = [0] * rank, [0] * rank
    for i in range(len(p) // 2):  # torch lists (low, high) pairs from the last dimension backwards
        lo[rank - 1 - i], hi[rank - 1 - i] = int(p[2 * i]), int(p[2 * i + 1])
    value = a.get("value")
    return cx.add("Pad", [x], pads=tuple(lo + hi), mode=mode, value=float(value or 0.0))


@aten("tril.default", "triu.default")
def tri(cx: AtenCtx, a: Args) -> Value:
    x, k = a["self"], int(a["diagonal"])
    n, m = x.shape[-2:]
    diff = np.arange(m)[None, :] - np.arange(n)[:, None]
    keep = diff <= k if cx.op == "tril.default" else diff >= k
    return cx.add("Where", [cx.constant(keep), x, cx.scalar(0, x.dtype)])


@aten("slice_scatter.default", "select_scatter.default")
def slice_scatter(cx: AtenCtx, a: Args) -> Value:
    """x with x[..., start:end, ...] = src (what functionalization makes of an in-place slice assignment):
    the parts of x before and after the window, and src between them."""
    x, src = a["self"], cx.cast(a["src"], a["self"].dtype)
    rank = len(x.shape)
    dim = _dim(a["dim"], rank)
    if cx.op == "select_scatter.default":
        i = a["index"] + x.shape[dim] if a["index"] < 0 else a["index"]
        start, end, step = i, i + 1, 1
        shape = list(x.shape)
        shape[dim] = 1
        src = cx.reshape(src, shape)
    else:
        start, end, step = slice(a["start"], a["end"], a["step"]).indices(x.shape[dim])
    if step != 1:
        raise cx.unsupported(f"a strided slice assignment (step {step})")
    parts = ([_slice(cx, x, dim, 0, start, 1)] if start > 0 else []) + [src] + \
        ([_slice(cx, x, dim, end, None, 1)] if end < x.shape[dim] else [])
    return parts[0] if len(parts) == 1 else cx.add("Concat", parts, axis=dim)
