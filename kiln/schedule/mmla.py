"""The dot-product register tile on 2×2 blocks (direct emission of AArch64 SMMLA / BFMMLA): the rows taken in pairs.

Where the target has a block instruction for the anchor's operands (codegen/mmla.py: mmla_method — SMMLA for int8
activations with i8mm, BFMMLA for bf16 with BF16), schedule/int8.py's dot tile keeps its rows, lanes, parallel
order and epilogue, and replaces its reduction step; the knob `mmla` (default on where available) keeps the
SDOT / BFDOT tile instead. With G the group (4 bytes, or a bf16 pair) and NR = n lanes:

    before:  for k4 < K/G:  for mi < MR unroll:  $acc[mi] = dot(acc[mi], A(m = mo·MR + mi, k = G·k4), B[k4, ni, 0])
    after:   for k8 < K/2G:                                   # two groups per step
               for p < MR/2, h < 2 (unrolled):              # row pair p, columns h·NR/2 …: NR/4 instructions
                 $acc[2p + h] = mmla($acc[2p + h], [A(2p, 2G·k8), A(2p+1, 2G·k8)],
                                     [B[2·k8, ni + h·NR/2, 0], B[2·k8 + 1, ni + h·NR/2, 0]], count = 2G)
             [K/G odd and/or a K tail: one more mmla reading the last count < 2G values of each row (B's padded
              group read whole, A's missing values zero)]
             for r < MR (unrolled):  [if m < M:] out[.., m = mo·MR + r, n] = epilogue(mmla_row($acc[2⌊r/2⌋],
                                                                                         $acc[2⌊r/2⌋ + 1], r mod 2))

Each instruction does 2·2·2G multiply-adds against the dot product's 4·G (SMMLA 32 MACs per 128-bit instruction,
SDOT 16); the weights' VNNI layout is the same, each column pair zipped from two groups in registers (the
microkernels' i8mm/bfmmla kernels, kiln/ukernels/dot.py, do the same in hand-written IR). MR is even; a tile of one
row (M = 1) keeps the dot-product tile."""
from __future__ import annotations

from collections.abc import Callable

from kiln.kernel.analysis import simplify_panels
from kiln.kernel.dot import Mmla, MmlaRow
from kiln.kernel.ir import (
    Assign,
    Bin,
    Compute,
    Const,
    Expr,
    If,
    Load,
    Local,
    LocalRef,
    Loop,
    Stmt,
    Store,
    Var,
    cmp,
    minimum,
    substitute,
)
from kiln.schedule.dot_form import DotForm
from kiln.schedule.tile import substitute_all


def mmla_rows(extent_rows: int, most: int, pick: Callable[[int, int], int]) -> int:
    """An even row count for the block tile (pick: tile_shape.pick_mr; two for a single row, its pair clamped)."""
    most = max(2, most - most % 2)
    mr = pick(max(2, extent_rows), most)
    return mr if mr % 2 == 0 else min(mr + 1, most)


def most_mmla_rows(nr: int, lanes: int, regs: int) -> int:
    """Rows the registers hold: MR·NR/lanes accumulators, MR/2 A pairs and NR/2 zipped column pairs, two spare."""
    return int((regs - nr // 2 - 2) / (nr / lanes + 0.5))


def mmla_tile(c: Compute, form: DotForm, m_v: Var, n_v: Var, m_row: Callable[[int], Expr], n_expr: Expr, ni: Var,
              M: int, mr: int, nr: int, acc: str, unroll: bool, edge: bool) -> list[Stmt]:
    """The body of one vector iteration (ni) of the block tile: accumulators, reduction, epilogue stores."""
    k, K, G = form.k, form.k_ext, form.group
    groups, tail = divmod(K, G)
    steps, rest = groups // 2, (groups % 2) * G + tail
    dtype = form.red.dtype

    def a_at(r: int, first: Expr) -> Load:
        m = m_row(r)
        if edge:
            m = minimum(m, Const(M - 1, "int64"))
        return substitute(form.a, {k: first, m_v: m})

    def b_at(group: Expr, lane0: int) -> Load:
        g = Const(G, "int64")
        grouped = {Bin("//", k, g): group, Bin("%", k, g): Const(0, "int64")}
        b = simplify_panels(substitute(substitute(form.b, grouped), {k: group * G, n_v: n_expr}), ni, nr)
        return substitute(b, {ni: ni + lane0}) if lane0 else b

    def step(group: Expr, count: int) -> list[Stmt]:
        out: list[Stmt] = []
        for p in range(mr // 2):
            rows = (a_at(2 * p, group * G), a_at(2 * p + 1, group * G))
            for h in range(2):
                slot = Const(2 * p + h, "int64")
                lane0 = h * nr // 2
                b1 = b_at(group + 1, lane0) if count > G else None
                out.append(Assign(acc, Mmla(LocalRef(acc, dtype, slot), *rows, b_at(group, lane0), b1, count, lane0),
                                  slot))
        return out

    k8 = Var(f"{k.name}{2 * G}")
    update: list[Stmt] = [Loop(k8, Const(steps, "int64"), step(k8 * 2, 2 * G), "unroll" if unroll else "serial")] \
        if steps else []
    if rest:
        update += step(Const(2 * steps, "int64"), rest)
    for v, e in reversed(form.red.axes[:-1]):
        update = [Loop(v, Const(e, "int64"), update)]
    stores: list[Stmt] = []
    for r in range(mr):
        pair = 2 * (r // 2)
        value = MmlaRow(LocalRef(acc, dtype, Const(pair, "int64")), LocalRef(acc, dtype, Const(pair + 1, "int64")),
                        r % 2)
        m = m_row(r)
        store: Stmt = Store(c.out, substitute_all(c.store_index, {m_v: m, n_v: n_expr}),
                            substitute(c.body, {form.red: value, m_v: m, n_v: n_expr}))
        stores.append(If(cmp("<", m, Const(M, "int64")), [store]) if edge else store)
    return [Local(acc, dtype, Const(0, dtype), mr), *update, *stores]
