"""The dot edge: a GEMM's last panel, when it holds only a column or two, as dot products along the reduction.

A tile vectorized over columns spends a whole vector per row and reduction step however few of its lanes are
columns: N = 257 in 32-column panels leaves one column for the last panel, and its 13×1 tile runs 13 FMAs per
step for 13 useful multiply-adds (3% of gemm_odd's FMA issue on Zen 4 at AVX-512 or AVX2, for 0.4% of its work).
Vectorized over the reduction instead, every lane is useful. The last panel's nest (the knob `narrow` = "dot"):

    for ni < rem (vector, masked):  for r < K:  for mi < MR:  acc[mi] += A[m, r] · Bp[last, r, ni]
                                    for mi < MR:  C[m, n] = epilogue(acc[mi])
  ⇒ before the parallel loop:  for j < rem:  for r < K:  Bt[j, r] = Bp[last, r, j]    (its columns, r-contiguous)
    for r < K (vector_reduce, L lanes):  for mi < MR, j < rem:  acc[mi·rem + j] += A[m, r…r+L) · Bt[j, r…r+L)
    for mi < MR, j < rem:  C[m, last·NR + j] = epilogue(acc[mi·rem + j])       (each partial summed across lanes)

The MR·rem partials are independent chains over the same Bt vector (one load per step). The copy into Bt is rem·K
strided loads per call (gemm_odd: 771), serial before the parallel loop; the packed weights themselves keep their
panel layout, which every strategy reads. Only where A is read along r with unit stride (a MatMul's rows, not an
NCHW conv's pixels), over a single reduction axis, and the partials fit the main tile's accumulator count."""
from __future__ import annotations

from collections.abc import Callable

from kiln.kernel.ir import (
    Assign,
    Buffer,
    Compute,
    Const,
    Expr,
    Kernel,
    Load,
    Local,
    LocalRef,
    Loop,
    Reduce,
    Stmt,
    Store,
    Var,
    init_value,
    substitute,
    uses_var,
    walk,
)
from kiln.schedule.primitives import combine


def dot_edge_operands(red: Reduce, m_v: Var, n_v: Var) -> tuple[Load, Load] | None:
    """(A, B): the reduction body's two loads, A[…, m…, r] with r alone and last (unit stride along r) and
    B[n…, r…] of n and r only — or None where the dot edge does not apply (two reduction axes, other loads, a strided
    A, a B per batch entry)."""
    if len(red.axes) != 1 or red.op != "sum":
        return None
    r = red.axes[0][0]
    loads = [e for e in walk(red.body) if isinstance(e, Load)]
    a = [x for x in loads if uses_var(x, m_v) and not uses_var(x, n_v)]
    b = [x for x in loads if uses_var(x, n_v) and not uses_var(x, m_v)]
    if len(loads) != 2 or len(a) != 1 or len(b) != 1:
        return None
    if a[0].index[-1] != r or any(uses_var(i, r) for i in a[0].index[:-1]):
        return None
    # B copied once before the parallel loop: it may depend on the column and r only (not a batch axis)
    if any(isinstance(x, Var) and x not in (n_v, r) for x in walk(b[0])):
        return None
    return a[0], b[0]


def dot_edge(k: Kernel, c: Compute, red: Reduce, operands: tuple[Load, Load], m_v: Var, n_v: Var, mo: Var,
             mr: int, nr: int, last_panel: int, rem: int, lanes: int, tag: str,
             panels: Callable[[Expr, Var], Expr]) -> tuple[list[Stmt], Callable[[int], list[Stmt]]]:
    """The copy of the last panel's `rem` columns into Bt, and `tile(rows)`: the dot edge of one row tile (rows MR,
    or a static M's last M % MR). `panels(expr, j)` folds a packed panel index (p·NR + j) // NR → p and
    (p·NR + j) % NR → j (tile.simplify_panels), so the copy reads Bp[last, r, j] directly."""
    a, b = operands
    r, K = red.axes[0]
    last_col = last_panel * nr
    bt = Buffer(f"edge{tag}", b.dtype, (rem, int(K)))
    k.scratch.append(bt)
    j, rc, p = Var(f"{n_v.name}e"), Var(f"{r.name}e"), Var(f"{n_v.name}p")
    src = substitute(panels(substitute(b, {n_v: p * nr + j, r: rc}), j), {p: Const(last_panel, "int64")})
    copy: list[Stmt] = [Loop(j, Const(rem, "int64"), [Loop(rc, Const(int(K), "int64"),
                                                            [Store(bt.name, (j, rc), src)])])]
    acc = f"dot{tag}"

    def tile(rows: int) -> list[Stmt]:
        ups: list[Stmt] = []
        stores: list[Stmt] = []
        for i in range(rows):
            m = mo * mr + i
            for jj in range(rem):
                slot = Const(i * rem + jj, "int64")
                term = substitute(substitute(red.body, {b: Load(bt.name, (Const(jj, "int64"), r), b.dtype)}), {m_v: m})
                ups.append(Assign(acc, combine("sum", LocalRef(acc, red.dtype, slot), term), slot))
                at = {m_v: m, n_v: Const(last_col + jj, "int64")}
                stores.append(Store(c.out, tuple(substitute(x, at) for x in c.store_index),
                                    substitute(c.body, {red: LocalRef(acc, red.dtype, slot), **at})))
        return [Local(acc, red.dtype, init_value("sum", red.dtype), rows * rem),
                Loop(r, Const(int(K), "int64"), ups, "vector_reduce", lanes), *stores]
    return copy, tile
