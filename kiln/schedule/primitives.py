"""Schedule primitives: each rewrites a loop nest and keeps its meaning.

Loop nests are lists of `Loop`/`Store`/`Local`/`Assign` (kiln.kernel.ir). Each primitive's docstring
shows the nest before and after, TVM-style."""
from __future__ import annotations

from dataclasses import replace

from kiln.kernel.dot import LaneDot4
from kiln.kernel.ir import (
    Alloc,
    Assign,
    Call,
    Compute,
    Const,
    Expr,
    If,
    Local,
    LocalRef,
    Loop,
    Prefetch,
    Reduce,
    Stmt,
    Store,
    Var,
    as_extent,
    init_value,
    substitute,
    walk,
)


def compute_to_loops(c: Compute, tag: str) -> list[Stmt]:
    """The unscheduled nest of a compute definition.

        out[i, j] = f(sum[k](g(i, j, k)))
    becomes
        for i: for j:
            local $acc = 0
            for k: $acc = $acc + g(i, j, k)
            out[i, j] = f($acc)
    """
    reds = [e for e in walk(c.body) if isinstance(e, Reduce)]
    if len(reds) > 1:
        raise ValueError(f"compute {c.out} has {len(reds)} reductions; lowering must split them")
    inner: list[Stmt]
    if reds:
        r = reds[0]
        acc = f"acc_{tag}"
        ref = LocalRef(acc, r.dtype)
        update: Stmt = Assign(acc, combine(r.op, ref, r.body))
        for v, n in reversed(r.axes):
            update = Loop(v, as_extent(n), [update])
        inner = [Local(acc, r.dtype, init_value(r.op, r.dtype)), update,
                 Store(c.out, c.store_index, substitute(c.body, {r: ref}))]
    else:
        inner = [Store(c.out, c.store_index, c.body)]
    for v, n in reversed(list(zip(c.axes, c.extents))):
        inner = [Loop(v, as_extent(n), inner)]
    return inner


def combine(op: str, acc: Expr, x: Expr) -> Expr:
    from kiln.kernel.ir import Bin
    if op == "sum" and isinstance(x, LaneDot4) and isinstance(x.acc, Const) and x.acc.value == 0:
        return replace(x, acc=acc)  # acc + lane_dot4(0, …) ⇒ lane_dot4(acc, …): vpdpbusd accumulates in place
    return {"sum": lambda: acc + x, "prod": lambda: acc * x,
            "max": lambda: Bin("max", acc, x), "min": lambda: Bin("min", acc, x)}[op]()


def rename(stmts: list[Stmt], mapping: dict[Expr, Expr]) -> list[Stmt]:
    """Substitute expressions (usually loop variables) throughout a nest."""
    out: list[Stmt] = []
    for s in stmts:
        if isinstance(s, Loop):
            out.append(Loop(s.var, substitute(s.extent, mapping), rename(s.body, mapping), s.kind, s.lanes, s.masked))
        elif isinstance(s, Store):
            out.append(Store(s.buf, tuple(substitute(e, mapping) for e in s.index), substitute(s.value, mapping)))
        elif isinstance(s, Assign):
            out.append(Assign(s.name, substitute(s.value, mapping),
                              None if s.slot is None else substitute(s.slot, mapping)))
        elif isinstance(s, If):
            out.append(If(substitute(s.cond, mapping), rename(s.body, mapping), rename(s.orelse, mapping), s.share))
        elif isinstance(s, Call):
            out.append(Call(s.fn, tuple(substitute(a, mapping) for a in s.args)))
        elif isinstance(s, Prefetch):
            out.append(Prefetch(s.buf, tuple(substitute(e, mapping) for e in s.index), s.write, s.locality))
        elif isinstance(s, Alloc):
            out.append(s)
        else:
            out.append(Local(s.name, s.dtype, substitute(s.init, mapping), s.count))
    return out


def fuse(outer: Loop) -> Loop:
    """Merge a loop with its only child loop (constant or run-time extents).

        for i in 0..N: for j in 0..M: S(i, j)
    becomes
        for ij in 0..N*M: S(ij // M, ij % M)
    """
    inner = outer.body[0]
    assert len(outer.body) == 1 and isinstance(inner, Loop)
    n, m = outer.extent, inner.extent
    v = Var(f"{outer.var.name}_{inner.var.name}")
    if isinstance(n, Const) and isinstance(m, Const):
        body = rename(inner.body, {outer.var: v // m.value, inner.var: v % m.value})
        return Loop(v, Const(n.value * m.value, "int64"), body, outer.kind, outer.lanes, outer.masked)
    body = rename(inner.body, {outer.var: v // m, inner.var: v % m})
    return Loop(v, n * m, body, outer.kind, outer.lanes, outer.masked)


def fuse_nest(outer: Loop, depth: int) -> Loop:
    """`fuse` applied depth − 1 times (a perfect nest of `depth` constant-extent loops into one), with the body renamed
    once instead of once per step: the same loop, at a fraction of the cost on a large body (Winograd's transforms:
    16 stores of 16-term sums, renamed twice per schedule).

        for i in 0..N: for j in 0..M: for k in 0..L: S(i, j, k)
    becomes
        for ijk in 0..N*M*L: S((ijk // L) // M, (ijk // L) % M, ijk % L)
    """
    loops = [outer]
    for _ in range(depth - 1):
        assert len(loops[-1].body) == 1 and isinstance(loops[-1].body[0], Loop)
        loops.append(loops[-1].body[0])
    assert all(isinstance(lp.extent, Const) for lp in loops)
    mapping: dict[Expr, Expr] = {loops[0].var: loops[0].var}
    var, extent = loops[0].var, loops[0].extent.value
    for inner in loops[1:]:  # what fuse(var, inner) substitutes, composed with the renames so far
        fused = Var(f"{var.name}_{inner.var.name}")
        m = inner.extent.value
        step = {var: fused // m, inner.var: fused % m}
        mapping = {k: substitute(v, step) for k, v in mapping.items()} | {inner.var: step[inner.var]}
        var, extent = fused, extent * m
    return Loop(var, Const(extent, "int64"), rename(loops[-1].body, mapping), outer.kind, outer.lanes, outer.masked)


def split(loop: Loop, factor: int) -> Loop:
    """Split a loop into an outer loop of chunks and an inner loop of at most `factor` iterations.

        for i in 0..N: S(i)
    becomes
        for io in 0..ceil(N/f): for ii in 0..min(f, N - io*f): S(io*f + ii)
    (the inner extent shrinks on the last chunk instead of guarding every iteration). A run-time extent N (a
    symbolic dim) gives the same nest with ceil(N/f) and the shrinking inner extent computed at run time."""
    vo, vi = Var(loop.var.name + "o"), Var(loop.var.name + "i")
    from kiln.kernel.ir import minimum
    f = Const(factor, "int64")
    if not isinstance(loop.extent, Const):
        n_rt = loop.extent
        inner = Loop(vi, minimum(f, n_rt - vo * factor), rename(loop.body, {loop.var: vo * factor + vi}), loop.kind,
                     loop.lanes, loop.masked)
        return Loop(vo, (n_rt + (factor - 1)) // factor, [inner])
    n = loop.extent.value
    ext: Expr = f if n % factor == 0 else minimum(f, Const(n, "int64") - vo * factor)
    inner = Loop(vi, ext, rename(loop.body, {loop.var: vo * factor + vi}), loop.kind, loop.lanes, loop.masked)
    return Loop(vo, Const(-(-n // factor), "int64"), [inner])


def vectorize(loop: Loop, lanes: int, masked: bool = True) -> Loop:
    """Mark a loop to be emitted `lanes` at a time (vector registers), with a scalar remainder.

        for j in 0..N: S(j)
    becomes
        for j in 0..N step L: S(j..j+L-1) as one vector op each;  then S(N-N%L..N-1) as one masked vector op
    (or, unmasked, a scalar loop for the remainder). Loads whose address moves by 1 with j become vector
    loads, by 2–4 a wide load and a shuffle, not at all a broadcast, anything else a gather."""
    return Loop(loop.var, loop.extent, loop.body, "vector", lanes, masked)


def parallel(loop: Loop) -> Loop:
    """Run the iterations of an outermost loop on the thread pool (static chunks, one per thread).

        for i in 0..N: S(i)   becomes   parallel for i in 0..N: S(i)"""
    return Loop(loop.var, loop.extent, loop.body, "parallel", loop.lanes, loop.masked)


def parallel_outer(nest: Loop, depth: int, threads: int) -> Loop:
    """Fuse the outermost loops of a perfect nest of `depth` constant-extent loops (at most depth − 1 times) while the
    outermost has fewer than 8 iterations per thread, then run it on the pool (with more than one thread).

        for i in 0..2: for j in 0..12: for k …: S(i, j, k)        (depth 2, 2 threads)
    becomes
        parallel for ij in 0..24: for k …: S(ij // 12, ij % 12, k)"""
    fused = 1
    while fused < depth and isinstance(nest.extent, Const) and nest.extent.value < threads * 8:
        nest = fuse(nest)
        fused += 1
    return parallel(nest) if threads > 1 else nest


def unroll(loop: Loop) -> Loop:
    """Emit every iteration of a constant-extent loop (codegen repeats the body).

        for k in 0..3: S(k)   becomes   S(0); S(1); S(2)"""
    return Loop(loop.var, loop.extent, loop.body, "unroll", loop.lanes, loop.masked)
