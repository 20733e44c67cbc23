"""Shapes and data movement: Shape, Constant, Reshape, Transpose, Concat, Slice, Pad, Gather, …"""
from __future__ import annotations

import numpy as np
import sympy

from kiln.errors import ModelError
from kiln.frontend.context import Ctx
from kiln.frontend.importers.registry import _axis, importer
from kiln.graph import symbolic
from kiln.graph.ir import Value
from kiln.graph.ops import broadcast, check_size, range_count
from kiln.graph.symbolic import Dim


def _dims(a: np.ndarray) -> list[Dim]:
    """A shape-like constant (ints, or dims where it depends on symbols) as a list of normalized dims."""
    return [symbolic.normalize(d) for d in np.asarray(a).reshape(-1).tolist()]


def _ge(a: Dim, b: Dim) -> bool:
    """a ≥ b for dims: decided by the symbols' bounds where symbolic (undecidable → TypeError, which the
    importer's guard reports as an op that cannot take the symbolic dim)."""
    if isinstance(a, int) and isinstance(b, int):
        return a >= b
    return symbolic.decide(sympy.Ge(sympy.sympify(a), b))


# -- shapes and data movement --------------------------------------------------------------------------------
@importer("Shape")
def imp_shape(cx: Ctx, ins: list[Value | None]) -> list[Value]:
    dims = ins[0].shape
    shape = np.array(dims, dtype=np.int64) if symbolic.is_static(dims) else symbolic.dims_array(dims)
    rank = len(shape)
    start, end = cx.attr("start", 0), cx.attr("end", rank)
    return [cx.constant(shape[start:end])]


@importer("Size")
def imp_size(cx: Ctx, ins: list[Value | None]) -> list[Value]:
    size = ins[0].type.size
    if not symbolic.is_static(size):
        return [cx.constant(symbolic.dims_array([size], shape=()))]
    return [cx.constant(np.array(size, dtype=np.int64))]


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
    value = cx.attr("value")
    fill = np.zeros(1, np.float32) if value is None else np.asarray(value).reshape(-1)
    fill = fill.astype(np.float32) if fill.dtype == np.float16 else fill
    dims = cx.const(ins[0], "shape", dims=True)
    if symbolic.is_symbolic_array(dims):  # a tensor of symbolic shape: the fill broadcast at run time
        return [cx.add("Expand", [cx.constant(np.array(fill[0], dtype=fill.dtype))], shape=tuple(_dims(dims)))]
    shape = dims.astype(np.int64)
    if np.any(shape < 0):
        raise ModelError(f"node '{cx.name}': negative dimension in shape {shape.tolist()}")
    check_size(int(np.prod(shape, dtype=np.float64)) * 4, cx.name)
    return [cx.constant(np.full(tuple(shape.tolist()), fill[0], dtype=fill.dtype))]


def _reshape_target(cx: Ctx, in_shape: tuple[Dim, ...], shape: list[Dim]) -> tuple[Dim, ...]:
    allowzero = cx.attr("allowzero", 0)
    out = [in_shape[i] if d == 0 and not allowzero else d for i, d in enumerate(shape)]
    if out.count(-1) > 1:
        raise cx.unsupported(f"Reshape target {shape} has more than one -1")
    if -1 in out:  # on symbolic dims: prod(in) // prod(known), which sympy simplifies (768*seq // 768 = seq)
        known = symbolic.prod(d for d in out if d != -1)
        out[out.index(-1)] = symbolic.normalize(symbolic.prod(in_shape) // (known if known != 0 else 1))
    return tuple(symbolic.normalize(d) for d in out)


@importer("Reshape")
def imp_reshape(cx: Ctx, ins: list[Value | None]) -> list[Value]:
    shape = cx.attr("shape") if cx.opset < 5 else _dims(cx.const(ins[1], "shape", dims=True))
    return [cx.add("Reshape", ins[:1], shape=_reshape_target(cx, ins[0].shape, list(shape)))]


@importer("Flatten")
def imp_flatten(cx: Ctx, ins: list[Value | None]) -> list[Value]:
    x = ins[0]
    axis, rank = cx.attr("axis", 1), len(x.shape)
    if not -rank <= axis <= rank:
        raise cx.unsupported(f"axis {axis} is out of range for rank {rank}")
    axis = axis + rank if axis < 0 else axis  # in [-r, r]: -1 is r - 1, not r
    rows = symbolic.prod(x.shape[:axis])
    return [cx.add("Reshape", [x], shape=(rows, symbolic.prod(x.shape[axis:])))]


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
    vals = [v for v in ins if v is not None and not (v.type.is_static and v.type.size == 0)]
    return [cx.add("Concat", vals, axis=_axis(cx.attr("axis"), len(ins[0].shape), cx))]


def _clamp(v: Dim, lo: Dim, hi: Dim) -> Dim:
    v = lo if not _ge(v, lo) else v
    return symbolic.normalize(hi if not _ge(hi, v) else v)


def _slice_attrs(shape: tuple[Dim, ...], starts: list[Dim], ends: list[Dim], axes: list[int],
                 steps: list[int]) -> dict:
    """Starts and ends resolved against the axis and clamped into it, as dims where the axis or the bound is
    symbolic (x[:, :seq], pos_table[0:seq]); a clamp the symbols' bounds do not decide is a TypeError."""
    rank = len(shape)
    s, e, st = [0] * rank, list(shape), [1] * rank
    for a, b, c, d in zip(axes, starts, ends, steps):
        a %= rank
        n = shape[a]
        if d == 0:
            raise ValueError("Slice step 0")
        if not symbolic.is_static(d):
            raise TypeError(f"symbolic Slice step {symbolic.dim_str(d)}")
        lo_clamp, hi_clamp = (0, n) if d > 0 else (-1, n - 1)
        b = b + n if not _ge(b, 0) else b
        c = c + n if not _ge(c, 0) else c
        s[a], e[a], st[a] = _clamp(b, lo_clamp, hi_clamp), _clamp(c, lo_clamp, hi_clamp), d
    return {"starts": tuple(s), "ends": tuple(e), "steps": tuple(st)}


@importer("Slice")
def imp_slice(cx: Ctx, ins: list[Value | None]) -> list[Value]:
    x = ins[0]
    if cx.opset < 10:
        starts, ends = cx.attr("starts"), cx.attr("ends")
        axes = cx.attr("axes", list(range(len(starts))))
        steps = [1] * len(starts)
    else:
        starts, ends = _dims(cx.const(ins[1], "starts", dims=True)), _dims(cx.const(ins[2], "ends", dims=True))
        given = lambda i, what, default: (cx.const(ins[i], what).tolist()  # noqa: E731
                                          if len(ins) > i and ins[i] is not None else default)
        axes, steps = given(3, "axes", list(range(len(starts)))), given(4, "steps", [1] * len(starts))
    big = np.iinfo(np.int64).max // 2
    starts = [max(min(v, big), -big) if isinstance(v, int) else v for v in starts]
    ends = [max(min(v, big), -big) if isinstance(v, int) else v for v in ends]
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
    if idx.const is not None and idx.const.dtype != object:
        n = x.shape[axis]
        if not symbolic.is_static(n):
            return [_gather_symbolic_axis(cx, x, idx, axis)]
        if np.any(idx.const < -n) or np.any(idx.const >= n):
            raise cx.unsupported(f"indices out of range for axis of size {n}")
    return [cx.add("Gather", [x, idx], axis=axis)]


def _gather_symbolic_axis(cx: Ctx, x: Value, idx: Value, axis: int) -> Value:
    """Constant indices into a symbolic axis: each must lie in the axis at its smallest size. One negative
    index (x[:, -1]: the last token) becomes a Slice from n - k with a symbolic start, so no kernel wraps an index
    by a run-time extent."""
    n = x.shape[axis]
    lo = symbolic.lower(n, cx.graph.bounds)
    if np.any(idx.const < -lo) or np.any(idx.const >= lo):
        raise cx.unsupported(f"indices {idx.const.reshape(-1).tolist()} are out of range for axis {axis} of size "
                             f"{symbolic.dim_str(n)} at its lower bound {lo}")
    if np.all(idx.const >= 0):
        return cx.add("Gather", [x, idx], axis=axis)
    if idx.const.size != 1:
        raise cx.unsupported(f"several negative indices {idx.const.reshape(-1).tolist()} into symbolic axis {axis} "
                             f"of size {symbolic.dim_str(n)}")
    k = int(idx.const.reshape(-1)[0])
    rank = len(x.shape)
    starts, ends = [0] * rank, list(x.shape)
    starts[axis], ends[axis] = symbolic.normalize(n + k), symbolic.normalize(n + k + 1)
    y = cx.add("Slice", [x], starts=tuple(starts), ends=tuple(ends), steps=(1,) * rank)
    shape = x.shape[:axis] + idx.shape + x.shape[axis + 1:]
    return cx.add("Reshape", [y], shape=shape)


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
    shape = broadcast(x.shape, tuple(_dims(cx.const(ins[1], "shape", dims=True))))
    return [cx.add("Expand", [x], shape=shape)]


@importer("Tile")
def imp_tile(cx: Ctx, ins: list[Value | None]) -> list[Value]:
    return [cx.add("Tile", ins[:1], repeats=tuple(_dims(cx.const(ins[1], "repeats", dims=True))))]


@importer("Range")
def imp_range(cx: Ctx, ins: list[Value | None]) -> list[Value]:
    start, limit, delta = (cx.const(v, n, dims=True).reshape(-1)[0]
                           for v, n in zip(ins, ("start", "limit", "delta")))
    dtype = ins[0].dtype
    if not all(symbolic.is_static(v) for v in (start, limit, delta)):  # position ids: Range(0, seq, 1)
        if np.dtype(dtype).kind not in "iu":
            raise cx.unsupported(f"a {dtype} Range with symbolic operands: only integer ranges take dims")
        start, limit, delta = (symbolic.normalize(v) for v in (start, limit, delta))
        if delta == 0:
            raise ModelError(f"node '{cx.name}': Range with delta 0")
        range_count(start, limit, delta)  # a symbolic delta: the ModelError naming it
        return [cx.add("Range", [], start=start, limit=limit, delta=delta, dtype=dtype)]
    if delta == 0:
        raise ModelError(f"node '{cx.name}': Range with delta 0")
    n = max(int(np.ceil((float(limit) - float(start)) / float(delta))), 0)
    check_size(n * np.dtype(start.dtype).itemsize, cx.name)
    return [cx.constant(np.arange(start, limit, delta, dtype=start.dtype))]
