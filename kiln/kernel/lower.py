"""Graph node → compute definitions (the TE-style description of what each op computes).

One lowering function per core op in `LOWERINGS`; elementwise ops are one expression each in
`UNARY`/`BINARY` (rewrite rules as data, kernel/elementwise.py); the indexing ops, packed anchors, quantized ops
and Winograd stages register theirs from kernel/lower_indexing.py, lower_packed.py, lower_quant.py, lower_winograd.py.
Buffers are named after graph values; temporaries get `<out>.t<i>`. Reshape-like ops produce no compute:
they are views (see kernel/build.py)."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from kiln.errors import UnsupportedOperator
from kiln.graph.ir import Node, Value
from kiln.kernel.elementwise import BINARY, UNARY, cast, f, mod
from kiln.kernel.ir import (
    Bin,
    Buffer,
    Cast,
    Compute,
    Const,
    Expr,
    Load,
    Reduce,
    Select,
    Un,
    Var,
    cmp,
    maximum,
    minimum,
)


@dataclass
class Lowered:
    computes: list[Compute]
    temps: list[Buffer] = field(default_factory=list)


def axes_for(shape: tuple[int, ...], prefix: str = "i") -> tuple[Var, ...]:
    return tuple(Var(f"{prefix}{d}") for d in range(len(shape)))


def ld(v: Value, index: tuple[Expr, ...]) -> Expr:
    """Read value `v` at `index`; one-element constants become literals."""
    if v.const is not None and v.const.size == 1:
        return Const(v.const.reshape(-1)[0].item(), v.dtype)
    return Load(v.name, tuple(index), v.dtype)


def bcast_index(shape: tuple[int, ...], axes: tuple[Expr, ...]) -> tuple[Expr, ...]:
    """Index into a tensor broadcast (numpy rules) to the output indexed by `axes`."""
    off = len(axes) - len(shape)
    return tuple(Const(0, "int64") if d == 1 else axes[off + j] for j, d in enumerate(shape))


def clamp(e: Expr, lo: int, hi: int) -> Expr:
    return minimum(maximum(e, lo), hi)


Lowering = Callable[[Node], Lowered]
LOWERINGS: dict[str, Lowering] = {}


def lowering(*ops: str) -> Callable[[Lowering], Lowering]:
    def reg(fn: Lowering) -> Lowering:
        for op in ops:
            LOWERINGS[op] = fn
        return fn
    return reg


def _out(n: Node) -> tuple[Value, tuple[Var, ...]]:
    y = n.outputs[0]
    return y, axes_for(y.shape)


# Rules that read their operand many times: kept out of their consumers (an explicit `store` stops
# kernel/build.py from inlining them), or chains of them would grow exponentially when fused.
_NOT_INLINED = {"RoundFloat16"}


@lowering(*UNARY)
def lower_unary(n: Node) -> Lowered:
    y, ax = _out(n)
    x = ld(n.inputs[0], bcast_index(n.inputs[0].shape, ax))
    return Lowered([Compute(y.name, ax, y.shape, UNARY[n.op](x, n.attrs), ax if n.op in _NOT_INLINED else None)])


@lowering(*BINARY)
def lower_binary(n: Node) -> Lowered:
    y, ax = _out(n)
    a, b = (ld(v, bcast_index(v.shape, ax)) for v in n.inputs)
    return Lowered([Compute(y.name, ax, y.shape, BINARY[n.op](a, b))])


@lowering("Mod")
def lower_mod(n: Node) -> Lowered:
    y, ax = _out(n)
    a, b = (ld(v, bcast_index(v.shape, ax)) for v in n.inputs)
    return Lowered([Compute(y.name, ax, y.shape, mod(a, b, n.attrs["fmod"]))])


@lowering("Where")
def lower_where(n: Node) -> Lowered:
    y, ax = _out(n)
    c, a, b = (ld(v, bcast_index(v.shape, ax)) for v in n.inputs)
    return Lowered([Compute(y.name, ax, y.shape, Select(c, a, b))])


# -- reductions ----------------------------------------------------------------------------------------------
def _reduce_index(x: Value, out_axes: tuple[Var, ...], axes: tuple[int, ...], keepdims: bool,
                  rvars: dict[int, Var]) -> tuple[Expr, ...]:
    idx, k = [], 0
    for d in range(len(x.shape)):
        if d in axes:
            idx.append(rvars[d])
            k += keepdims
        else:
            idx.append(out_axes[k])
            k += 1
    return tuple(idx)


def reduction(x: Value, out_axes: tuple[Var, ...], axes: tuple[int, ...], keepdims: bool, op: str,
              term: Callable[[Expr], Expr] = lambda e: e, prefix: str = "r") -> Expr:
    rvars = {d: Var(f"{prefix}{d}") for d in axes}
    body = term(ld(x, _reduce_index(x, out_axes, axes, keepdims, rvars)))
    return Reduce(op, tuple((rvars[d], x.shape[d]) for d in axes), body)


@lowering("Reduce")
def lower_reduce(n: Node) -> Lowered:
    (x,), (y, ax), a = n.inputs, _out(n), n.attrs
    axes, keep, kind = a["axes"], a["keepdims"], a["kind"]
    if x.dtype == "bool":  # max = any, min = all, ...: reduce 0/1 as int32 (i1 compares as signed in codegen)
        red = reduction(x, ax, axes, keep, {"max": "max", "min": "min", "prod": "min"}.get(kind, "max"),
                        lambda e: Cast("int32", e))
        body = cast(red if kind in ("min", "prod") else maximum(red, Const(0, "int32")), "bool")  # empty: False
        return Lowered([Compute(y.name, ax, y.shape, body)])
    count = float(np.prod([x.shape[d] for d in axes]))
    red = lambda op, term=lambda e: e: reduction(x, ax, axes, keep, op, term)  # noqa: E731
    if kind == "logsumexp":
        m = Buffer(f"{y.name}.t0", y.dtype, y.shape)
        mv = Load(m.name, ax, y.dtype)
        body = Un("log", reduction(x, ax, axes, keep, "sum", lambda e: Un("exp", e - mv))) + mv
        return Lowered([Compute(m.name, ax, y.shape, red("max")), Compute(y.name, ax, y.shape, body)], [m])
    body = {"sum": lambda: red("sum"), "max": lambda: red("max"), "min": lambda: red("min"),
            "prod": lambda: red("prod"),
            "mean": lambda: (red("sum") * (1.0 / count) if x.dtype.startswith("float")
                             else red("sum") / int(count)),  # integers: truncating division, as onnxruntime
            "l1": lambda: red("sum", lambda e: Un("abs", e)),
            "l2": lambda: Un("sqrt", red("sum", lambda e: e * e)), "logsum": lambda: Un("log", red("sum")),
            "sumsquare": lambda: red("sum", lambda e: e * e)}[kind]()
    return Lowered([Compute(y.name, ax, y.shape, body)])


@lowering("ArgReduce")
def lower_argreduce(n: Node) -> Lowered:
    """argmax = min index k with x[k] == max(x): two plain reductions, first index wins (ONNX default)."""
    (x,), (y, ax), a = n.inputs, _out(n), n.attrs
    m = Buffer(f"{y.name}.t0", x.dtype, y.shape)
    best = reduction(x, ax, (a["axis"],), a["keepdims"], a["kind"])
    k = Var(f"r{a['axis']}")
    if a.get("last"):
        hit = reduction(x, ax, (a["axis"],), a["keepdims"], "max",
                        lambda e: Select(cmp("==", e, Load(m.name, ax, x.dtype)), k, Const(-1, "int64")))
    else:
        hit = reduction(x, ax, (a["axis"],), a["keepdims"], "min",
                        lambda e: Select(cmp("==", e, Load(m.name, ax, x.dtype)), k,
                                         Const(x.shape[a["axis"]], "int64")))
    return Lowered([Compute(m.name, ax, y.shape, best), Compute(y.name, ax, y.shape, hit)], [m])


# -- matrix product and convolution --------------------------------------------------------------------------
@lowering("MatMul")
def lower_matmul(n: Node) -> Lowered:
    (a, b), (y, ax) = n.inputs, _out(n)
    k = Var("rk")
    batch = ax[:-2]
    ia = bcast_index(a.shape[:-2], batch) + (ax[-2], k)
    ib = bcast_index(b.shape[:-2], batch) + (k, ax[-1])
    body = Reduce("sum", ((k, a.shape[-1]),), ld(a, ia) * ld(b, ib))
    return Lowered([Compute(y.name, ax, y.shape, body)])


NARROW_BLOCK_BYTES = 16  # a padded copy of a blocked input with narrower channel blocks is written region by region


def _padded(x: Value, pads: tuple[int, ...], value: float | Expr,
            name: str) -> tuple[list[Compute], Buffer | None, str]:
    """A zero/-inf padded copy of NCHW `x` (spatial pads only; a blocked NCHW[cb]c `x` keeps its trailing
    channel block), so windows read in bounds with affine indices: the computes that write it, the buffer and its
    name (none and x's own name without pads). `value` may be an expression (a quantized tensor's zero point: its
    0.0)."""
    nd = len(pads) // 2
    if not any(pads):
        return [], None, x.name
    shape = x.shape[:2] + tuple(x.shape[2 + i] + pads[i] + pads[i + nd] for i in range(nd)) + x.shape[2 + nd:]
    buf = Buffer(name, x.dtype, shape)
    fill = value if isinstance(value, Expr) else Const(value, x.dtype)
    blocked = x.type.is_static and len(shape) > 2 + nd
    if blocked and int(np.prod(shape[2 + nd:])) * np.dtype(x.dtype).itemsize < NARROW_BLOCK_BYTES:
        return [rows_outermost(c) for c in _pad_regions(x, shape, pads, fill, name)], buf, name
    # else one compute, each point in bounds or not: its vectors run along the row (NCHW) or over a channel block
    # a vector wide already, in one parallel nest
    ax = axes_for(shape, "p")
    src = [ax[0], ax[1]] + [ax[2 + i] - pads[i] for i in range(nd)]
    inside: Expr | None = None
    for i in range(nd):
        c = Bin("and", cmp(">=", src[2 + i], 0), cmp("<", src[2 + i], x.shape[2 + i]))
        inside = c if inside is None else Bin("and", inside, c)
    safe = tuple(src[:2] + [clamp(src[2 + i], 0, x.shape[2 + i] - 1) for i in range(nd)]) + ax[2 + nd:]
    copy = Compute(name, ax, shape, Select(inside, Load(x.name, safe, x.dtype), fill))
    return [rows_outermost(copy) if nd else copy], buf, name


def _pad_regions(x: Value, shape: tuple[int, ...], pads: tuple[int, ...], fill: Expr, name: str) -> list[Compute]:
    """x copied into the interior of the padded buffer, and the border filled slab by slab — along spatial dim i the
    pads before and after x, over x's extent in the dims before i and the whole buffer in the dims after it:

        for p2 < 226, p3 < 226, c < 4:                   for p2 < 1, p3 < 226, c < 4:   P[p2, p3, c] = fill (top)
          P[p2, p3, c] = select(1 ≤ p2 < 225 and …,  ⇒   … bottom; left and right within rows 1..224
                                x[clamp(p2−1), …],       for p2 < 224, p3 < 224, c < 4:
                                fill)                      P[p2 + 1, p3 + 1, c] = x[p2, p3, c]

    The copy is affine, so its row's innermost axes fuse into one contiguous run (kernel/analysis.py:
    fuse_contiguous_axes): the int8 stem's blocked input, 4 bytes a pixel, was one masked 4-lane vector per pixel."""
    nd = len(pads) // 2
    out = []
    for i in range(nd):
        for start, n in ((0, pads[i]), (pads[i] + x.shape[2 + i], pads[i + nd])):
            if n <= 0:
                continue
            ext = shape[:2] + tuple(x.shape[2:2 + i]) + (n,) + shape[3 + i:]
            a = axes_for(ext, "p")
            at = a[:2] + tuple(a[2 + j] + pads[j] for j in range(i)) + (a[2 + i] + start if start else a[2 + i],)
            out.append(Compute(name, a, ext, fill, at + a[3 + i:]))
    ax = axes_for(x.shape, "p")  # the copy last: the fills (too small to split) run before its parallel nest
    return out + [Compute(name, ax, x.shape, Load(x.name, ax, x.dtype),
                          (ax[0], ax[1]) + tuple(ax[2 + i] + pads[i] for i in range(nd)) + ax[2 + nd:])]


def rows_outermost(c: Compute, row: int = 2) -> Compute:
    """`c` (an [N, C(/cb), H, …] output) with its loop over rows H outermost, then batch and channels — storing where
    it did. The default schedule's parallel loop over the outer axes then splits it by rows, as the convs before and
    after split their output rows (schedule/tile.py: image_thread_parts), and each thread reads and writes what it wrote
    and will read itself. Split by channel blocks, each thread read half its rows from the other core's cache (and
    its output was read so by the next kernel): when the host puts the two vCPUs on different L3s, resnet18's
    strided convs ran 1.1–1.2× slower there even when run twice in a row. resnet18 on two L3s 6.84 → 6.71 ms
    (stem 0.64 → 0.59, max pool 0.100 → 0.089), on one L3 unchanged (Zen 5, one interleaved run: 40 / 317 rounds)."""
    if len(c.axes) <= row + 1:  # rows that are the innermost (vector) axis stay where they are
        return c
    order = [row] + [i for i in range(len(c.axes)) if i != row]
    return Compute(c.out, tuple(c.axes[i] for i in order), tuple(c.extents[i] for i in order), c.body,
                   c.store_index, c.hints)


def guarded_window(x: Value, head: tuple[Expr, ...], pos: tuple[Expr, ...], tail: tuple[Expr, ...] = (),
                   fill: float = 0.0) -> Expr:
    """x[head…, pos…, tail…] (tail: a blocked layout's channel lane) where every pos is in bounds, else 0 — as
    select(in bounds, x[clamped], 0), the form codegen emits as ONE masked vector load
    (ExprEmitter.guarded_load) and a tile proven inside emits as a plain load (schedule/guards.py)."""
    inside: Expr | None = None
    for i, p in enumerate(pos):
        c = Bin("and", cmp(">=", p, 0), cmp("<", p, x.shape[2 + i]))
        inside = c if inside is None else Bin("and", inside, c)
    safe = tuple(clamp(p, 0, x.shape[2 + i] - 1) for i, p in enumerate(pos))
    return Select(inside, Load(x.name, head + safe + tail, x.dtype), Const(fill, x.dtype))


@lowering("Conv")
def lower_conv(n: Node) -> Lowered:
    x, w = n.inputs[0], n.inputs[1]
    y, ax = _out(n)
    a = n.attrs
    nd = len(x.shape) - 2
    cig, cog = w.shape[1], w.shape[0] // a["group"]
    # a depthwise stride-1 conv reads its window through masked loads instead of a padded copy of x (its
    # vectors run along the output row, where the window's column offset is affine); MobileNetV2's 56×56
    # ones spent as long copying as convolving. Dense convs keep the copy: their tiles broadcast pixels.
    guarded = cig == 1 and a["group"] > 1 and all(s == 1 for s in a["strides"]) and any(a["pads"])
    pre, tmp, src = ([], None, x.name) if guarded else _padded(x, a["pads"], 0.0, f"{y.name}.pad")
    ci = Var("rc")
    ks = tuple(Var(f"rk{i}") for i in range(nd))
    chan = ci if a["group"] == 1 else (ax[1] // cog) * cig + ci
    sp = tuple(ax[2 + i] * a["strides"][i] + ks[i] * a["dilations"][i] for i in range(nd))
    if guarded:
        xs = guarded_window(x, (ax[0], chan), tuple(p - a["pads"][i] for i, p in enumerate(sp)))
    else:
        xs = Load(src, (ax[0], chan) + sp, x.dtype)
    body: Expr = Reduce("sum", ((ci, cig),) + tuple((k, e) for k, e in zip(ks, w.shape[2:])),
                        xs * ld(w, (ax[1], ci) + ks))
    if len(n.inputs) > 2:
        body = body + ld(n.inputs[2], (ax[1],))
    # a depthwise 2-D conv: a register tile of output rows × vectors along the row (schedule/tile.py)
    hints = {"depthwise": True, "m_axis": -2, "n_axis": -1} if guarded and nd == 2 else {}
    return Lowered(pre + [Compute(y.name, ax, y.shape, body, hints=hints)], [tmp] if tmp else [])


@lowering("ConvTranspose")
def lower_conv_transpose(n: Node) -> Lowered:
    """Gather form: out[o] = Σ x[(o + p − k·d)/s] · w[k] over taps where the division is exact and in
    range."""
    x, w = n.inputs[0], n.inputs[1]
    y, ax = _out(n)
    a = n.attrs
    nd = len(x.shape) - 2
    cig, cog = x.shape[1] // a["group"], w.shape[1]
    ci, ks = Var("rc"), tuple(Var(f"rk{i}") for i in range(nd))
    ok: Expr = Const(True, "bool")
    src = []
    for i in range(nd):
        t = ax[2 + i] + a["pads"][i] - ks[i] * a["dilations"][i]
        q = t // a["strides"][i]
        ok = Bin("and", ok, Bin("and", cmp("==", t - q * a["strides"][i], 0),
                                Bin("and", cmp(">=", t, 0), cmp("<", q, x.shape[2 + i]))))
        src.append(clamp(q, 0, x.shape[2 + i] - 1))
    g = ax[1] // cog
    xv = Load(x.name, (ax[0], g * cig + ci) + tuple(src), x.dtype)
    wv = ld(w, (g * cig + ci, ax[1] - g * cog) + ks)
    body: Expr = Reduce("sum", ((ci, cig),) + tuple(zip(ks, w.shape[2:])),
                        Select(ok, xv * wv, Const(0.0, y.dtype)))
    if len(n.inputs) > 2:
        body = body + ld(n.inputs[2], (ax[1],))
    return Lowered([Compute(y.name, ax, y.shape, body)])


@lowering("Pool")
def lower_pool(n: Node) -> Lowered:
    (x,), (y, ax), a = n.inputs, _out(n), n.attrs
    nd = len(a["kernel"])  # a blocked x[N, C/cb, H, W, cb] has one trailing axis more
    kind = a["kind"]
    fill = -np.inf if kind == "max" else 0.0
    ks = tuple(Var(f"rk{i}") for i in range(nd))
    sp = tuple(ax[2 + i] * a["strides"][i] + ks[i] * a["dilations"][i] for i in range(nd))
    if len(x.shape) > 2 + nd and kind in ("max", "avg"):
        # blocked: the vectors run over the channel block, so a padded tap is a uniform masked load — cheaper
        # than a padded copy of the whole input (resnet's 112×112 max pool: the copy wrote 3.3 MB)
        pre, tmp, src = [], None, x.name
        xs = guarded_window(x, (ax[0], ax[1]), tuple(p - a["pads"][i] for i, p in enumerate(sp)), ax[2 + nd:], fill)
    else:
        pre, tmp, src = _padded(x, a["pads"], fill, f"{y.name}.pad")
        xs = Load(src, (ax[0], ax[1]) + sp + ax[2 + nd:], x.dtype)
    window = tuple(zip(ks, a["kernel"]))
    if kind == "max":
        body: Expr = Reduce("max", window, xs)
    elif kind == "lp":
        p = float(a["p"])
        body = Bin("pow", Reduce("sum", window, Bin("pow", Un("abs", xs), f(p, xs))), f(1.0 / p, xs))
    else:
        count: Expr | None = None
        for i in range(nd):  # window taps that count: inside the input (or input+pads if include_pad)
            lo_lim = -a["count_pads"][i] if a["include_pad"] else 0
            hi_lim = x.shape[2 + i] + (a["count_pads"][i + nd] if a["include_pad"] else 0)
            start = ax[2 + i] * a["strides"][i] - a["pads"][i]
            d, k = a["dilations"][i], a["kernel"][i]
            if d == 1:
                c = minimum(start + k, hi_lim) - maximum(start, lo_lim)
            else:  # taps t in [0, k) with lo ≤ start + t·d < hi: t from ⌈(lo−start)/d⌉ to ⌈(hi−start)/d⌉
                big = (k + x.shape[2 + i] + sum(a["pads"])) * d  # keeps the dividends ≥ 0 (truncating division)
                first = maximum((lo_lim - start + big + d - 1) // d - big // d, 0)
                end = minimum((hi_lim - start + big + d - 1) // d - big // d, k)
                c = maximum(end - first, 0)
            count = c if count is None else count * c
        body = Reduce("sum", window, xs) / Cast(x.dtype, count)
    return Lowered(pre + [rows_outermost(Compute(y.name, ax, y.shape, body))], [tmp] if tmp else [])


@lowering("FromBlocked")
def lower_from_blocked(n: Node) -> Lowered:
    """x[n, c, …] = xb[n, c // cb, …, c % cb] (graph/passes/block_layout.py; scheduled by schedule/reorder.py)."""
    (xb,), (y, ax) = n.inputs, _out(n)
    cb = xb.shape[-1]
    body = Load(xb.name, (ax[0], ax[1] // cb) + ax[2:] + (ax[1] % cb,), xb.dtype)
    # an explicit store: not inlined into its consumers (they would gather), scheduled as a transpose
    return Lowered([Compute(y.name, ax, y.shape, body, ax, hints={"reorder": "from_blocked", "cb": cb})])


@lowering("ToBlocked")
def lower_to_blocked(n: Node) -> Lowered:
    """xb[n, cbi, …, c] = x[n, cbi·cb + c, …]."""
    (x,), (y, ax) = n.inputs, _out(n)
    cb = y.shape[-1]
    body = Load(x.name, (ax[0], ax[1] * cb + ax[-1]) + ax[2:-1], x.dtype)
    return Lowered([Compute(y.name, ax, y.shape, body, ax, hints={"reorder": "to_blocked", "cb": cb})])


@lowering("MaxPoolIndex")
def lower_maxpool_index(n: Node) -> Lowered:
    """Flat index (row-major, or column-major over H·W with storage_order=1) of each window's first maximum:
    the max, then the smallest index whose in-bounds value equals it."""
    (x,), (y, ax), a = n.inputs, _out(n), n.attrs
    nd = len(x.shape) - 2
    m = Buffer(f"{y.name}.t0", x.dtype, y.shape)
    ks = tuple(Var(f"rk{i}") for i in range(nd))
    pos = [ax[2 + i] * a["strides"][i] - a["pads"][i] + ks[i] * a["dilations"][i] for i in range(nd)]
    inside: Expr = Const(True, "bool")
    for i in range(nd):
        inside = Bin("and", inside, Bin("and", cmp(">=", pos[i], 0), cmp("<", pos[i], x.shape[2 + i])))
    safe = tuple(clamp(p, 0, x.shape[2 + i] - 1) for i, p in enumerate(pos))
    xv = Load(x.name, (ax[0], ax[1]) + safe, x.dtype)
    window = tuple(zip(ks, a["kernel"]))
    best = Reduce("max", window, Select(inside, xv, Const(-np.inf, x.dtype)))
    sp = x.shape[2:]
    flat: Expr = ax[0] * x.shape[1] + ax[1]
    if a["storage_order"]:  # column-major over the spatial dims
        inner, stride = Const(0, "int64"), 1
        for i in range(nd):
            inner = inner + safe[i] * stride
            stride *= sp[i]
        flat = flat * stride + inner
    else:
        for i in range(nd):
            flat = flat * sp[i] + safe[i]
    big = Const(int(np.prod(x.shape)), "int64")
    hit = Reduce("min", window, Select(Bin("and", inside, cmp("==", xv, Load(m.name, ax, x.dtype))), flat, big))
    return Lowered([Compute(m.name, ax, y.shape, best), Compute(y.name, ax, y.shape, hit)], [m])


# -- normalizations ------------------------------------------------------------------------------------------
def _stats(x: Value, y: Value, ax: tuple[Var, ...], axes: tuple[int, ...],
           eps: float) -> tuple[list[Compute], list[Buffer], Expr, Expr]:
    """mean and 1/sqrt(var+eps) over `axes` as two temporaries (keepdims), and their loads at `ax`."""
    shape, dt = tuple(1 if d in axes else s for d, s in enumerate(x.shape)), x.dtype
    mean, rstd = Buffer(f"{y.name}.mean", dt, shape), Buffer(f"{y.name}.rstd", dt, shape)
    sax = axes_for(shape, "s")
    inv = 1.0 / float(np.prod([x.shape[d] for d in axes]))
    mload = Load(mean.name, sax, dt)
    c1 = Compute(mean.name, sax, shape, reduction(x, sax, axes, True, "sum") * inv)
    var = reduction(x, sax, axes, True, "sum", lambda e: (e - mload) * (e - mload)) * inv
    c2 = Compute(rstd.name, sax, shape, f(1.0, var) / Un("sqrt", var + eps))
    at = bcast_index(shape, ax)
    return [c1, c2], [mean, rstd], Load(mean.name, at, dt), Load(rstd.name, at, dt)


@lowering("LayerNormalization")
def lower_layernorm(n: Node) -> Lowered:
    x, scale = n.inputs[0], n.inputs[1]
    y, ax = _out(n)
    axes = tuple(range(n.attrs["axis"], len(x.shape)))
    cs, bufs, m, r = _stats(x, y, ax, axes, n.attrs["epsilon"])
    body = (ld(x, ax) - m) * r * ld(scale, bcast_index(scale.shape, ax))
    if len(n.inputs) > 2:
        body = body + ld(n.inputs[2], bcast_index(n.inputs[2].shape, ax))
    return Lowered(cs + [Compute(y.name, ax, y.shape, body)], bufs)


@lowering("InstanceNormalization")
def lower_instancenorm(n: Node) -> Lowered:
    x, scale, bias = n.inputs
    y, ax = _out(n)
    cs, bufs, m, r = _stats(x, y, ax, tuple(range(2, len(x.shape))), n.attrs["epsilon"])
    body = (ld(x, ax) - m) * r * ld(scale, (ax[1],)) + ld(bias, (ax[1],))
    return Lowered(cs + [Compute(y.name, ax, y.shape, body)], bufs)


@lowering("BatchNormalization")
def lower_batchnorm(n: Node) -> Lowered:
    x, scale, b, mean, var = n.inputs
    y, ax = _out(n)
    c = (ax[1],)
    body = (ld(x, ax) - ld(mean, c)) * (ld(scale, c) / Un("sqrt", ld(var, c) + n.attrs["epsilon"])) + ld(b, c)
    return Lowered([Compute(y.name, ax, y.shape, body)])


@lowering("Softmax", "LogSoftmax")
def lower_softmax(n: Node) -> Lowered:
    """Softmax: max, e = exp(x − max) once (a scratch the size of x — schedule/fuse_rows.py shrinks it to one row
    per thread), 1 / Σ e (one division a row), e · (1 / Σ e). LogSoftmax: x − max − log Σ exp(x − max)."""
    (x,), (y, ax) = n.inputs, _out(n)
    axis = n.attrs["axis"]
    shape = tuple(1 if d == axis else s for d, s in enumerate(x.shape))
    mx, sm = Buffer(f"{y.name}.max", x.dtype, shape), Buffer(f"{y.name}.sum", x.dtype, shape)
    sax = axes_for(shape, "s")
    c1 = Compute(mx.name, sax, shape, reduction(x, sax, (axis,), True, "max"))
    at = bcast_index(shape, ax)
    m, s = Load(mx.name, at, x.dtype), Load(sm.name, at, x.dtype)
    if n.op == "LogSoftmax":
        m_s = Load(mx.name, sax, x.dtype)
        c2 = Compute(sm.name, sax, shape, reduction(x, sax, (axis,), True, "sum", lambda e: Un("exp", e - m_s)))
        return Lowered([c1, c2, Compute(y.name, ax, y.shape, ld(x, ax) - m - Un("log", s))], [mx, sm])
    ex = Buffer(f"{y.name}.exp", x.dtype, x.shape)
    ce = Compute(ex.name, ax, x.shape, Un("exp", ld(x, ax) - m))
    r = Var(f"r{axis}")
    total = Reduce("sum", ((r, x.shape[axis]),), Load(ex.name, _reduce_index(x, sax, (axis,), True, {axis: r}),
                                                      x.dtype))
    c2 = Compute(sm.name, sax, shape, f(1.0, total) / total)
    return Lowered([c1, ce, c2, Compute(y.name, ax, y.shape, Load(ex.name, ax, x.dtype) * s)], [mx, ex, sm])


@lowering("LRN")
def lower_lrn(n: Node) -> Lowered:
    (x,), (y, ax), a = n.inputs, _out(n), n.attrs
    size, C = a["size"], x.shape[1]
    j = Var("rj")
    c = ax[1] - (size - 1) // 2 + j
    inside = Bin("and", cmp(">=", c, 0), cmp("<", c, C))
    xv = Load(x.name, (ax[0], clamp(c, 0, C - 1)) + ax[2:], x.dtype)
    sq = Reduce("sum", ((j, size),), Select(inside, xv * xv, f(0.0, xv)))
    body = ld(x, ax) / Bin("pow", sq * (a["alpha"] / size) + a["bias"], f(a["beta"], xv))
    return Lowered([Compute(y.name, ax, y.shape, body)])


# -- data movement -------------------------------------------------------------------------------------------
@lowering("Transpose")
def lower_transpose(n: Node) -> Lowered:
    (x,), (y, ax) = n.inputs, _out(n)
    idx = [None] * len(ax)
    for i, p in enumerate(n.attrs["perm"]):
        idx[p] = ax[i]
    return Lowered([Compute(y.name, ax, y.shape, ld(x, tuple(idx)))])


@lowering("Concat")
def lower_concat(n: Node) -> Lowered:
    y, axis, off, out = n.outputs[0], n.attrs["axis"], 0, []
    for x in n.inputs:
        ax = axes_for(x.shape)
        store = tuple(v + off if d == axis else v for d, v in enumerate(ax))
        out.append(Compute(y.name, ax, x.shape, ld(x, ax), store))
        off += x.shape[axis]
    return Lowered(out)


@lowering("Slice")
def lower_slice(n: Node) -> Lowered:
    (x,), (y, ax), a = n.inputs, _out(n), n.attrs
    idx = tuple(v * st + s for v, s, st in zip(ax, a["starts"], a["steps"]))
    return Lowered([Compute(y.name, ax, y.shape, ld(x, idx))])


@lowering("Gather")
def lower_gather(n: Node) -> Lowered:
    (x, ind), (y, ax), axis = n.inputs, _out(n), n.attrs["axis"]
    r = len(ind.shape)
    k = ld(ind, ax[axis:axis + r])
    k = cast(k, "int64")
    dim = x.shape[axis]
    k = clamp(Select(cmp("<", k, 0), k + dim, k), 0, dim - 1)  # out-of-range runtime indices clamp, no OOB
    idx = ax[:axis] + (k,) + ax[axis + r:]
    return Lowered([Compute(y.name, ax, y.shape, ld(x, idx))])


@lowering("Range")
def lower_range(n: Node) -> Lowered:
    """out[i] = start + i·delta; the count (a symbolic limit: position ids) is the output's extent."""
    y, ax = _out(n)
    i = ax[0] if y.dtype == "int64" else Cast(y.dtype, ax[0])
    start, delta = (Const(int(v) if y.dtype.startswith("int") else float(v), y.dtype)
                    for v in (n.attrs["start"], n.attrs["delta"]))
    return Lowered([Compute(y.name, ax, y.shape, start + i * delta)])


@lowering("Pad")
def lower_pad(n: Node) -> Lowered:
    (x,), (y, ax), a = n.inputs, _out(n), n.attrs
    rank, mode = len(x.shape), a["mode"]
    idx, inside = [], None
    for d in range(rank):
        s, size = ax[d] - a["pads"][d], x.shape[d]
        if mode == "constant":
            c = Bin("and", cmp(">=", s, 0), cmp("<", s, size))
            inside = c if inside is None else Bin("and", inside, c)
            idx.append(clamp(s, 0, size - 1))
        elif mode == "edge":
            idx.append(clamp(s, 0, size - 1))
        elif mode == "wrap":
            idx.append(((s % size) + size) % size)
        else:  # reflect: fold the index back into [0, size) with period 2(size−1)
            period = max(2 * (size - 1), 1)
            m = ((s % period) + period) % period
            idx.append(Select(cmp("<", m, size), m, Const(period, "int64") - m) if size > 1
                       else Const(0, "int64"))
    v = ld(x, tuple(idx))
    body = Select(inside, v, Const(a["value"], x.dtype)) if inside is not None else v
    return Lowered([Compute(y.name, ax, y.shape, body)])


@lowering("Expand")
def lower_expand(n: Node) -> Lowered:
    (x,), (y, ax) = n.inputs, _out(n)
    return Lowered([Compute(y.name, ax, y.shape, ld(x, bcast_index(x.shape, ax)))])


@lowering("Tile")
def lower_tile(n: Node) -> Lowered:
    (x,), (y, ax) = n.inputs, _out(n)
    return Lowered([Compute(y.name, ax, y.shape, ld(x, tuple(v % d for v, d in zip(ax, x.shape))))])


def lower_node(n: Node) -> Lowered:
    if n.op not in LOWERINGS:
        raise UnsupportedOperator(n.op, n.name, detail="no lowering to the kernel IR")
    return LOWERINGS[n.op](n)
