"""Tail tiles as calls of shared microkernels (schedule primitive, run-time rows): the few-row tiles that end a GEMM's
row blocks when M is a symbolic dim call the target's microkernel family reading A in place (kiln/ukernels/x86.py,
`rows_a`), instead of being emitted inside every kernel.

A dynamic build's packed GEMM keeps its full MR-row tile emitted directly (the epilogue on the accumulators in
registers) and picks a tail tile at run time for the last, partial row block (schedule/default.py: TAIL_ROWS):

    before (tile.py: one tile body per tail, each with its own unrolled reduction and epilogue):
      if left > 6:  MR-row tile
      elif left > 4:  6-row tile
      elif left > 3:  4-row tile
      elif left > 1:  for ni vector<NR>:  local acc[6];  for r < K/2, u < 2: acc[u·3 + mi] += A·B (3 rows, K dealt
                      to 2 sets);  for mi < 3: acc[mi] += acc[3 + mi];  for mi < 3: if row0 + mi < M: out = epi(acc[mi])
      else:  1-row tile
    after (schedule/default.py: TAIL_CALL_ROWS = (6, 4, 3), one call group):
      elif left > 1:
        alloc Ct[6, NR]
        if left > 4:    call kiln_ukr_<isa>_f32_6x<NR>_ra_p<d>(&A[row0, 0], &Bp[panel, 0, 0], Ct, NR, K, lda, left)
        elif left > 3:  call kiln_ukr_<isa>_f32_4x<NR>_ra_p<d>(…)
        else:           call kiln_ukr_<isa>_f32_3x<NR>_ra_p<d>(…)
        for ni vector<NR>:  for mi < 6:  if row0 + mi < M:  out[row0 + mi, n] = epi(Ct[mi, ni])
    (rows past `left` repeat row M − 1 and are not stored; rows past the called kernel's are never stored either).

The microkernels take K, lda and the rows as arguments: a split build compiles each once for the whole model, in
its entry module (Kernel.shared_ir, codegen/module.py), where an emitted tail was compiled in every GEMM kernel, and
each kernel keeps one epilogue for all its called tails — what made a 6-row tail affordable (schedule/default.py:
TAIL_ROWS). They prefetch the panel as far ahead as the emitted tile. The 1-row tail — a decode step's whole GEMM —
stays emitted: cheap to compile, and there the epilogue on registers counts. Applies where A is a plain row-major
f32 load (unit stride along the one reduction axis, a constant row stride), B a packed f32 weight panel of the
family's width; elsewhere (a fused prologue on A, a target without the family) the tails stay emitted."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from kiln.kernel.analysis import coef, flat_index, simplify_panels
from kiln.kernel.ir import (
    Addr,
    Alloc,
    Bin,
    Call,
    Compute,
    Expr,
    If,
    Kernel,
    Load,
    Reduce,
    Stmt,
    Var,
    as_extent,
    cmp,
    substitute,
    uses_var,
)
from kiln.target import Target
from kiln.ukernels import UKernel, rows_ukernel_for


@dataclass(frozen=True)
class TailCalls:
    """A GEMM's operands in its own axes (m, n, r) and the microkernels of its called tails, by rows."""
    kernels: dict[int, UKernel]
    a: Load      # A[.., m, r]: unit stride along r, `lda` along m
    b: Load      # Bp[.., n // NR, r, n % NR]
    m: Var
    n: Var
    r: Var
    K: int
    lda: int
    nr: int

    def stmts(self, rows_desc: list[int], left: Expr, row0: Expr, n0: Expr, tag: str,
              epilogue: Callable[[str, int], Stmt]) -> list[Stmt]:
        """The tails of `rows_desc` rows (taller first) for the row block at `row0` with `left` rows, on the panel
        whose first column is n0 (a multiple of NR): the calls into one C tile, then `epilogue(ct, rows)`, the
        kernel's own epilogue over it."""
        ct = f"Ct{tag}"
        lane = Var("__lane")  # n = n0 + lane: (n0 + lane) // NR → n0 / NR, (n0 + lane) % NR → lane (simplify_panels)
        a_at = Addr(self.a.buf, tuple(substitute(i, {self.m: row0, self.r: as_extent(0)}) for i in self.a.index))
        b_at = Addr(self.b.buf, tuple(
            substitute(simplify_panels(substitute(i, {self.n: n0 + lane, self.r: as_extent(0)}), lane, self.nr),
                       {lane: as_extent(0)}) for i in self.b.index))

        def call(rows: int) -> list[Stmt]:
            return [Call(self.kernels[rows].name, (a_at, b_at, Addr(ct, (as_extent(0),)), as_extent(self.nr),
                                                   as_extent(self.K), as_extent(self.lda), left))]
        body = call(rows_desc[-1])
        for rows, fewer in zip(rows_desc[-2::-1], rows_desc[::-1]):
            body = [If(cmp(">", left, as_extent(fewer)), call(rows), body)]
        return [Alloc(ct, "float32", (rows_desc[0], self.nr)), *body, epilogue(ct, rows_desc[0])]


def tail_calls(k: Kernel, c: Compute, red: Reduce, m_v: Var, n_v: Var, nr: int, target: Target,
               rows: tuple[int, ...], prefetch: int) -> TailCalls | None:
    """The called tails of a packed GEMM over run-time rows, or None where they do not apply (module docstring).
    `rows`: the tail heights to call (a height without a family kernel stays emitted); `prefetch`: the tile's
    panel prefetch distance in reduction steps (the emitted tiles': the microkernels stream the same panels)."""
    kernels = {r: uk for r in rows if (uk := rows_ukernel_for(target, r, nr, prefetch)) is not None}
    if not kernels or len(red.axes) != 1 or red.op != "sum" or red.dtype != "float32" \
            or k.buffer(c.out).dtype != "float32" or not (isinstance(red.body, Bin) and red.body.op == "*"):
        return None
    r, K = red.axes[0]
    if not isinstance(K, int):
        return None
    for b, a in ((red.body.b, red.body.a), (red.body.a, red.body.b)):
        if isinstance(b, Load) and isinstance(a, Load) and uses_var(b, n_v) and not uses_var(b, m_v) \
                and not uses_var(a, n_v):
            break
    else:
        return None
    if a.dtype != "float32" or b.dtype != "float32":
        return None
    fa = flat_index(a.index, k.buffer(a.buf).shape)
    lda = coef(fa, m_v)
    if coef(fa, r) != 1 or lda is None or lda < K:
        return None
    # B: panel n // NR of K·NR floats, row r of NR, lane n % NR — checked on its flat index at n = j·NR + lane
    j, lane = Var("__panel"), Var("__lane")
    fb = simplify_panels(flat_index(tuple(substitute(i, {n_v: j * nr + lane}) for i in b.index),
                                    k.buffer(b.buf).shape), lane, nr)
    if coef(fb, lane) != 1 or coef(fb, r) != nr or coef(fb, j) != K * nr:
        return None
    for uk in kernels.values():
        k.shared_ir[uk.name] = uk.ir_text
    return TailCalls(kernels, a, b, m_v, n_v, r, K, lda, nr)
