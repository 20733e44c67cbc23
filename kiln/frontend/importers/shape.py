"""Shapes and data movement: Shape, Constant, Reshape, Transpose, Concat, Slice, Pad, Gather, …"""
from __future__ import annotations

import numpy as np

from kiln.errors import ModelError
from kiln.frontend.importers import _axis, importer
from kiln.frontend.onnx import Ctx
from kiln.graph.ir import Value
from kiln.graph.ops import check_size


# -- shapes and data movement --------------------------------------------------------------------------------
@importer("Shape")
def imp_shape(cx: Ctx, ins: list[Value | None]) -> list[Value]:
    shape = np.array(ins[0].shape, dtype=np.int64)
    rank = len(shape)
    start, end = cx.attr("start", 0), cx.attr("end", rank)
    return [cx.constant(shape[start:end])]


@importer("Size")
def imp_size(cx: Ctx, ins: list[Value | None]) -> list[Value]:
    return [cx.constant(np.array(ins[0].type.size, dtype=np.int64))]


@importer("Constant")
def imp_constant(cx: Ctx, ins: list[Value | None]) -> list[Value]:
    for key in ("value", "value_float", "value_floats", "value_int", "value_ints"):
        v = cx.attr(key)
        if v is not None:
            dtype = np.float32 if "float" in key else (np.int64 if "int" in key else None)
            arr = np.asarray(v, dtype=dtype) if dtype else np.asarray(v)
            return [cx.constant(arr.astype(np.float32) if arr.dtype == np.float16 else arr)]  # float16: widened
    raise cx.unsupported("Constant without a numeric value")


@importer("ConstantOfShape")
def imp_constant_of_shape(cx: Ctx, ins: list[Value | None]) -> list[Value]:
    shape = cx.const(ins[0], "shape").astype(np.int64)
    if np.any(shape < 0):
        raise ModelError(f"node '{cx.name}': negative dimension in shape {shape.tolist()}")
    check_size(int(np.prod(shape, dtype=np.float64)) * 4, cx.name)
    value = cx.attr("value")
    fill = np.zeros(1, np.float32) if value is None else np.asarray(value).reshape(-1)
    fill = fill.astype(np.float32) if fill.dtype == np.float16 else fill
    return [cx.constant(np.full(tuple(shape.tolist()), fill[0], dtype=fill.dtype))]


def _reshape_target(cx: Ctx, in_shape: tuple[int, ...], shape: list[int]) -> tuple[int, ...]:
    allowzero = cx.attr("allowzero", 0)
    out = [in_shape[i] if d == 0 and not allowzero else d for i, d in enumerate(shape)]
    if out.count(-1) > 1:
        raise cx.unsupported(f"Reshape target {shape} has more than one -1")
    if -1 in out:
        known = int(np.prod([d for d in out if d != -1], dtype=np.int64))
        out[out.index(-1)] = int(np.prod(in_shape, dtype=np.int64)) // max(known, 1)
    return tuple(int(d) for d in out)


@importer("Reshape")
def imp_reshape(cx: Ctx, ins: list[Value | None]) -> list[Value]:
    shape = cx.attr("shape") if cx.opset < 5 else cx.const(ins[1], "shape").tolist()
    return [cx.add("Reshape", ins[:1], shape=_reshape_target(cx, ins[0].shape, list(shape)))]


@importer("Flatten")
def imp_flatten(cx: Ctx, ins: list[Value | None]) -> list[Value]:
    x = ins[0]
    axis, rank = cx.attr("axis", 1), len(x.shape)
    if not -rank <= axis <= rank:
        raise cx.unsupported(f"axis {axis} is out of range for rank {rank}")
    axis = axis + rank if axis < 0 else axis  # in [-r, r]: -1 is r - 1, not r
    rows = int(np.prod(x.shape[:axis], dtype=np.int64))
    return [cx.add("Reshape", [x], shape=(rows, x.type.size // max(rows, 1)))]


@importer("Squeeze", "Unsqueeze")
def imp_squeeze(cx: Ctx, ins: list[Value | None]) -> list[Value]:
    x = ins[0]
    if cx.opset >= 13:
        axes = cx.const(ins[1], "axes").tolist() if len(ins) > 1 and ins[1] is not None else None
    else:
        axes = cx.attr("axes")
    shape = list(x.shape)
    if cx.node.op_type == "Squeeze":
        axes = ([i for i, d in enumerate(shape) if d == 1] if axes is None
                else [_axis(a, len(shape), cx) for a in axes])
        for a in axes:
            if shape[a] != 1:
                raise cx.unsupported(f"Squeeze of axis {a} with size {shape[a]}")
        out = [d for i, d in enumerate(shape) if i not in axes]
    else:
        rank = len(shape) + len(axes)
        out = shape
        for a in sorted(_axis(a, rank, cx) for a in axes):
            out.insert(a, 1)
    return [cx.add("Reshape", [x], shape=tuple(out))]


@importer("Transpose")
def imp_transpose(cx: Ctx, ins: list[Value | None]) -> list[Value]:
    rank = len(ins[0].shape)
    perm = tuple(cx.attr("perm", list(range(rank))[::-1]))
    if sorted(perm) != list(range(rank)):
        raise cx.unsupported(f"perm {perm} is not a permutation of {rank} axes")
    return [cx.add("Transpose", ins[:1], perm=perm)]


@importer("Concat")
def imp_concat(cx: Ctx, ins: list[Value | None]) -> list[Value]:
    vals = [v for v in ins if v is not None and v.type.size > 0]
    return [cx.add("Concat", vals, axis=_axis(cx.attr("axis"), len(ins[0].shape), cx))]


def _slice_attrs(shape: tuple[int, ...], starts: list[int], ends: list[int], axes: list[int],
                 steps: list[int]) -> dict:
    rank = len(shape)
    s, e, st = [0] * rank, list(shape), [1] * rank
    for a, b, c, d in zip(axes, starts, ends, steps):
        a %= rank
        n = shape[a]
        if d == 0:
            raise ValueError("Slice step 0")
        lo_clamp, hi_clamp = (0, n) if d > 0 else (-1, n - 1)
        b = b + n if b < 0 else b
        c = c + n if c < 0 else c
        s[a], e[a], st[a] = min(max(b, lo_clamp), hi_clamp), min(max(c, lo_clamp), hi_clamp), d
    return {"starts": tuple(s), "ends": tuple(e), "steps": tuple(st)}


@importer("Slice")
def imp_slice(cx: Ctx, ins: list[Value | None]) -> list[Value]:
    x = ins[0]
    if cx.opset < 10:
        starts, ends = cx.attr("starts"), cx.attr("ends")
        axes = cx.attr("axes", list(range(len(starts))))
        steps = [1] * len(starts)
    else:
        starts, ends = cx.const(ins[1], "starts").tolist(), cx.const(ins[2], "ends").tolist()
        given = lambda i, what, default: (cx.const(ins[i], what).tolist()  # noqa: E731
                                          if len(ins) > i and ins[i] is not None else default)
        axes, steps = given(3, "axes", list(range(len(starts)))), given(4, "steps", [1] * len(starts))
    big = np.iinfo(np.int64).max // 2
    starts = [max(min(v, big), -big) for v in starts]
    ends = [max(min(v, big), -big) for v in ends]
    try:
        attrs = _slice_attrs(x.shape, starts, ends, [_axis(a, len(x.shape), cx) for a in axes], steps)
    except ValueError as e:
        raise cx.unsupported(str(e)) from None
    return [cx.add("Slice", [x], **attrs)]


@importer("Split")
def imp_split(cx: Ctx, ins: list[Value | None]) -> list[Value]:
    x = ins[0]
    axis = _axis(cx.attr("axis", 0), len(x.shape), cx)
    n_out = len(cx.node.output)
    if cx.opset >= 13 and len(ins) > 1 and ins[1] is not None:
        sizes = cx.const(ins[1], "split").tolist()
    elif cx.opset < 13 and cx.attr("split") is not None:
        sizes = list(cx.attr("split"))
    else:
        dim = x.shape[axis]
        n = cx.attr("num_outputs", n_out)
        chunk = -(-dim // n)
        sizes = [min(chunk, dim - i * chunk) for i in range(n)]
    if sum(sizes) != x.shape[axis]:
        raise cx.unsupported(f"split sizes {sizes} do not add up to axis size {x.shape[axis]}")
    outs, start = [], 0
    for size in sizes:
        starts = [0] * len(x.shape)
        ends = list(x.shape)
        starts[axis], ends[axis] = start, start + size
        outs.append(cx.add("Slice", [x], starts=tuple(starts), ends=tuple(ends), steps=(1,) * len(x.shape)))
        start += size
    return outs


@importer("Gather")
def imp_gather(cx: Ctx, ins: list[Value | None]) -> list[Value]:
    x, idx = ins[0], ins[1]
    axis = _axis(cx.attr("axis", 0), len(x.shape), cx)
    if idx.const is not None:
        n = x.shape[axis]
        if np.any(idx.const < -n) or np.any(idx.const >= n):
            raise cx.unsupported(f"indices out of range for axis of size {n}")
    return [cx.add("Gather", [x, idx], axis=axis)]


@importer("Pad")
def imp_pad(cx: Ctx, ins: list[Value | None]) -> list[Value]:
    x = ins[0]
    rank = len(x.shape)
    mode = cx.attr("mode", "constant")
    if cx.opset < 11:
        pads, value = list(cx.attr("pads")), float(cx.attr("value", 0.0))
    else:
        pads = cx.const(ins[1], "pads").tolist()
        has_value = len(ins) > 2 and ins[2] is not None
        value = float(cx.const(ins[2], "constant_value").reshape(-1)[0]) if has_value else 0.0
        if len(ins) > 3 and ins[3] is not None:
            axes = [_axis(a, rank, cx) for a in cx.const(ins[3], "axes").tolist()]
            full = [0] * (2 * rank)
            for i, a in enumerate(axes):
                full[a], full[a + rank] = pads[i], pads[i + len(axes)]
            pads = full
    if mode not in ("constant", "reflect", "edge", "wrap"):
        raise cx.unsupported(f"mode {mode!r}")
    return [cx.add("Pad", [x], pads=tuple(int(p) for p in pads), mode=mode, value=value)]


@importer("Expand")
def imp_expand(cx: Ctx, ins: list[Value | None]) -> list[Value]:
    x = ins[0]
    shape = tuple(np.broadcast_shapes(x.shape, tuple(cx.const(ins[1], "shape").tolist())))
    return [cx.add("Expand", [x], shape=shape)]


@importer("Tile")
def imp_tile(cx: Ctx, ins: list[Value | None]) -> list[Value]:
    return [cx.add("Tile", ins[:1], repeats=tuple(cx.const(ins[1], "repeats").tolist()))]


@importer("Range")
def imp_range(cx: Ctx, ins: list[Value | None]) -> list[Value]:
    start, limit, delta = (cx.const(v, n).reshape(-1)[0] for v, n in zip(ins, ("start", "limit", "delta")))
    if delta == 0:
        raise ModelError(f"node '{cx.name}': Range with delta 0")
    n = max(int(np.ceil((float(limit) - float(start)) / float(delta))), 0)
    check_size(n * np.dtype(start.dtype).itemsize, cx.name)
    return [cx.constant(np.arange(start, limit, delta, dtype=start.dtype))]
