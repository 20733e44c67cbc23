"""Schedule of a transposing copy (a graph Transpose, attention's Kᵀ): the output's innermost axis j reads the input
S ≥ R elements apart, and another output axis a reads it contiguously. Vectorizing j alone, as the default schedule
does, gathers every vector (bert_base's K [128, 12, 64] → Kᵀ [12, 64, 128]: 0.107 ms a layer); instead R values of a
per lane are one contiguous run, and the R × L block is transposed in registers (codegen/transpose.py:
transposed_load_group), R = L lanes (at most 16):

    before:  for o…: for a: for j vector<L>:  out[o…, a, j] = in[… j·S + a …]           # a gather per vector
    after:
      for o… (fused) parallel:
        for ah in 0..A/R:
          for j in 0..J vector<L> masked:
            for al in 0..R unroll:            # L runs of R loads, R·log2(R) shuffles, R contiguous stores
              out[o…, ah·R + al, j] = in[… j·S + ah·R + al …]

Applies to an elementwise compute (no reduction; a fused scale or cast is evaluated on the transposed vectors) stored
at its own axes with one load of that form, A a multiple of R and J at least half a vector; anything else keeps the
default schedule."""
from __future__ import annotations

from kiln.codegen.transpose import BLOCK
from kiln.kernel.analysis import coef, flat_index
from kiln.kernel.ir import Compute, Const, Load, Loop, Reduce, Stmt, Store, Var, substitute, walk
from kiln.schedule.primitives import parallel_outer
from kiln.target import Target


def schedule_transpose(c: Compute, shape_of, target: Target, threads: int) -> list[Stmt] | None:  # noqa: ANN001
    if c.store is not None or {"reorder", "winograd"} & c.hints.keys() or len(c.axes) < 2 or target.scalable or \
            not all(isinstance(e, int) for e in c.extents) or any(isinstance(e, Reduce) for e in walk(c.body)):
        return None
    lanes = target.lanes(32)
    R = min(lanes, BLOCK)  # the lanes one transposed block holds
    j, J = c.axes[-1], int(c.extents[-1])
    if J < lanes // 2:
        return None
    for load in (e for e in walk(c.body) if isinstance(e, Load)):
        src = flat_index(load.index, shape_of(load.buf))
        stride = coef(src, j)
        a = next((i for i, v in enumerate(c.axes[:-1]) if coef(src, v) == 1 and int(c.extents[i]) % R == 0), None)
        if stride is not None and stride >= R and a is not None:
            break
    else:
        return None
    av, ah, al = c.axes[a], Var(f"{c.axes[a].name}h"), Var(f"{c.axes[a].name}l")
    body = substitute(c.body, {av: ah * R + al})
    st = Store(c.out, tuple(substitute(v, {av: ah * R + al}) for v in c.axes), body)
    nest: Loop = Loop(ah, Const(int(c.extents[a]) // R, "int64"), [
        Loop(j, Const(J, "int64"), [Loop(al, Const(R, "int64"), [st], "unroll")], "vector", lanes, masked=True)])
    outer = [(v, int(e)) for i, (v, e) in enumerate(zip(c.axes[:-1], c.extents[:-1])) if i != a]
    for v, e in reversed(outer):
        nest = Loop(v, Const(e, "int64"), [nest])
    return [parallel_outer(nest, len(outer), threads)]

