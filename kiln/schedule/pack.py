"""Packing a tile's broadcast operand A[m, r] into Ap[m / MR, r, m % MR]: each reduction step of an MR-row tile then
reads MR contiguous floats, not MR rows K floats apart — which, with K a multiple of 1024, all map to one L1 set and
evict each other. `pack_rows` for constant extents (the knob `pack`). A run-time M reads A in place: its 8-row tiles
with tails (schedule/default.py: regime_tiles) measured faster without the copy (gpt_decoder's K = 1024
down-projection at 4 × 128 tokens: 1.06× with it)."""
from __future__ import annotations

from kiln.kernel.ir import (
    Buffer,
    Compute,
    Const,
    Expr,
    Kernel,
    Load,
    Loop,
    Reduce,
    Stmt,
    Store,
    Var,
    is_symbolic,
    minimum,
    uses_var,
    walk,
)
from kiln.schedule.config import Decisions
from kiln.schedule.tile_shape import TileShape


def rows_alias(row_bytes: int, rows: int, sets: int = 64, line: int = 64, ways: int = 8) -> bool:
    """Would `rows` rows `row_bytes` apart crowd one L1 set (more than half its ways)? Packing costs a copy
    of A; it pays only when the rows evict each other (row strides near multiples of 4 KiB)."""
    counts: dict[int, int] = {}
    for i in range(rows):
        s = (i * row_bytes // line) % sets
        counts[s] = counts.get(s, 0) + 1
    return max(counts.values()) > ways // 2


def row_operand(red: Reduce, m_v: Var, n_v: Var) -> Load | None:
    """The tile's broadcast operand A[…, m, r]: the one load of a single-axis reduction that reads rows m and not
    columns n, with m and r its last two indices; else None."""
    if len(red.axes) != 1:
        return None
    rows = [ld for ld in walk(red.body) if isinstance(ld, Load) and uses_var(ld, m_v) and not uses_var(ld, n_v)]
    return rows[0] if len(rows) == 1 and rows[0].index[-2:] == (m_v, red.axes[0][0]) else None


def copy_loop(rows: Var, n_rows: Expr, r: Var, K: Expr, mi: Var, mr: int, store: Store, lanes: int,
              parallel: bool) -> Loop:
    """The copy's nest: per row tile, vectors along r (each row's contiguous run), the MR rows unrolled — codegen
    turns the MR stores of a step into one interleaving shuffle (an in-register transpose) and one contiguous
    store of MR·lanes."""
    step = Loop(r, K, [Loop(mi, Const(mr, "int64"), [store], "unroll")], "vector", lanes, masked=True)
    return Loop(rows, n_rows, [step], "parallel" if parallel else "serial")


def packable_rows(c: Compute, red: Reduce, t: TileShape) -> Load | None:
    """The broadcast operand A[m, r] a tile could pack (a plain row-major load, one reduction axis of ≥ 64, at
    least two row tiles, no other output axes), or None."""
    M = c.extents[t.m_axis]
    others = [e for i, e in enumerate(c.extents) if i not in (t.m_axis, t.n_axis)]
    if is_symbolic(M) or any(is_symbolic(e) for _, e in red.axes):  # a packed copy sized by run-time rows: not yet
        return None
    if len(red.axes) != 1 or M < 2 * t.mr or any(e != 1 for e in others) or red.axes[0][1] < 64:
        return None
    a = row_operand(red, c.axes[t.m_axis], c.axes[t.n_axis])
    return a if a is not None and all(i == Const(0, "int64") for i in a.index[:-2]) else None


def pack_rows(k: Kernel, c: Compute, red: Reduce, t: TileShape, mo: Var, mi: Var, tag: str, dec: Decisions,
              parallel: bool) -> tuple[list[Stmt], dict[Expr, Expr]] | None:
    """Pack the broadcast operand A[m, r] into Ap[m / MR, r, m % MR] (rows past M repeat row M−1): the copy's
    loop, and the mapping that swaps A's load for Ap's.

    Without it the MR rows a tile broadcasts from sit K floats apart — with K a multiple of 1024 they all
    map to the same L1 set and evict each other; packed, each reduction step reads MR contiguous floats.
    The knob `pack`; by default only where the rows alias in L1 (packing costs a copy of A)."""
    a = packable_rows(c, red, t)
    if a is None:
        return None
    M = c.extents[t.m_axis]
    r, K = red.axes[0]
    if not dec.knob("pack", rows_alias(K * 4, t.mr), (False, True)):
        return None
    buf = Buffer(f"{a.buf}p{tag}", a.dtype, (-(-M // t.mr), K, t.mr))
    k.scratch.append(buf)
    p0, p1, p2 = Var("q0"), Var("q1"), Var("q2")
    src = a.index[:-2] + (minimum(p0 * t.mr + p2, Const(M - 1, "int64")), p1)
    store = Store(buf.name, (p0, p1, p2), Load(a.buf, src, a.dtype))
    copy = copy_loop(p0, Const(buf.shape[0], "int64"), p1, Const(K, "int64"), p2, t.mr, store, t.lanes, parallel)
    return [copy], {a: Load(buf.name, (mo, r, mi), a.dtype)}
