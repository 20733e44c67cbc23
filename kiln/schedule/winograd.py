"""Schedules of the Winograd transforms (kernel/lower_winograd.py): the transform index unrolled, so its selects
fold to two to four additions per value and the loads they share are read once; vectors over the channel block.

Tiles are the slower index of each parallel loop (the product splits its tiles into one part per thread,
tile.py `image_thread_parts`): with the pool's contiguous segments (runtime/threadpool.py) each thread transforms,
multiplies and transforms back the same tiles, and V and M stay in its own core's caches. When the host puts the
two vCPUs on different L3s, a split by channel blocks made every V store invalidate a line the other core had read:
the input transforms ran 5–9× slower there.

    input, V[b, r, c, cib, t, ci]:
      for (b, t, cib) parallel:
        if interior(t):  (the tile's 4×4 input patch inside the input: no guards, guards.py)
          for ci in 0..cb vector<L>:
            V[b, 0, 0, cib, t, ci] = d00 − d02 − d20 + d22          # 16 stores, one per (r, c), 16 loads shared
            …
        else: the same with each d a guarded (masked) load
    output, y[b, cob, oh, ow, co] with oh = 2·th + i, ow = 2·tw + j (and the fused epilogue):
      for (b, th, cob) parallel:
        for tw:
          for co in 0..nr vector<L>:
            y[b, cob, 2·th, 2·tw, co] = m00 + m01 + m02 + m10 + m11 + m12 + m20 + m21 + m22 (+ bias, …)
            …                                                       # 4 stores; rows / columns past OH / OW guarded
"""
from __future__ import annotations

from kiln.kernel.ir import Bin, Compute, Const, Expr, If, Loop, Reduce, Stmt, Store, Var, cmp, substitute, walk
from kiln.schedule.guards import interior_swap
from kiln.schedule.primitives import fuse_nest, rename
from kiln.target import Target


def _nest(loops: list[tuple[Var, int]], body: list[Stmt], threads: int) -> list[Stmt]:
    """Loops around `body`, outermost first, fused into one parallel loop."""
    for v, e in reversed(loops):
        body = [Loop(v, Const(e, "int64"), body)]
    top = fuse_nest(body[0], len(loops))
    if threads > 1:
        top.kind = "parallel"
    return [top]


def _halves(x: Var, half: Var, k: int) -> dict[Expr, Expr]:
    """x = 2·half + k: x // 2 → half, x % 2 → k, x → 2·half + k (the lowering's own forms of x)."""
    two = Const(2, "int64")
    return {Bin("//", x, two): half, Bin("%", x, two): Const(k, "int64"), x: half * 2 + k}


def schedule_winograd(c: Compute, target: Target, threads: int) -> list[Stmt] | None:
    kind = c.hints["winograd"]
    lanes = target.lanes(32)
    if any(isinstance(e, Reduce) for e in walk(c.body)):
        return None  # the output transform fused into another anchor's epilogue (a shortcut conv's residual add)
    if "reorder" in c.hints:
        # the output transform inlined into the reorder back to NCHW (axes n, c, h, w), whose own transposed
        # schedule declined (rows shorter than half a vector: AVX-512's 16 lanes on a 6-pixel row): the default
        # schedule, vectors along the NCHW row
        return None
    if kind == "input":
        b, r, cc, cib, t, ci = c.axes
        nb, _, _, ncib, nt, cb = c.extents
        stores: list[Stmt] = [Store(c.out, (b, Const(i, "int64"), Const(j, "int64"), cib, t, ci),
                                    substitute(c.body, {r: Const(i, "int64"), cc: Const(j, "int64")}))
                              for i in range(4) for j in range(4)]
        vec = Loop(ci, Const(cb, "int64"), stores, "vector", min(lanes, cb), masked=True)
        body: list[Stmt] = [vec]
        found = interior_swap(c.body, {ci: cb})
        if found is not None:
            body = [If(found[1], rename(body, found[0]), body)]
        return _nest([(b, nb), (t, nt), (cib, ncib)], body, threads)
    if kind == "output":
        b, cob, oh, ow, co = c.axes
        nb, ncob, h, w, nr = c.extents
        th, tw = Var("th"), Var("tw")
        stores = []
        for i in range(2):
            for j in range(2):
                m = {**_halves(oh, th, i), **_halves(ow, tw, j)}
                st: Stmt = Store(c.out, tuple(substitute(x, m) for x in c.store_index), substitute(c.body, m))
                if h % 2 and i:  # an odd height: the last tile row has one output row
                    st = If(cmp("<", th * 2 + i, h), [st])
                if w % 2 and j:
                    st = If(cmp("<", tw * 2 + j, w), [st])
                stores.append(st)
        vec = Loop(co, Const(nr, "int64"), stores, "vector", min(lanes, nr), masked=True)
        return _nest([(b, nb), (th, -(-h // 2)), (cob, ncob)], [Loop(tw, Const(-(-w // 2), "int64"), [vec])], threads)
    return None
