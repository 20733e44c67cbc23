"""Software prefetch of a packed weight panel, a page ahead of the register tile's reduction.

A packed MatMul's B panel Bp[no, k, 0:NR] is one contiguous stream per tile column. When the model's weights do
not stay in cache between runs (BERT-base: 340 MB of weights, a 128-row activation), the first row tile of each
panel reads it from memory, and the hardware stream prefetchers stop at every 4 KiB page boundary — the tile
then waits a memory latency per page (measured in isolation, cache evicted: 768×3072 at M=128 ran at 240 GFLOP/s
cold against 374 hot). The schedule primitive `prefetch_panel` asks for the line `distance` k-steps ahead on
each step:

    for rk in 0..K:                                  for rk in 0..K:
      for mi in 0..MR unroll:                 ⇒        prefetch Bp[no, rk + D, ni + j·L]   for each line j of a row
        $acc[mi] += A[m, rk] · Bp[no, rk, ni]          for mi in 0..MR unroll:
                                                         $acc[mi] += A[m, rk] · Bp[no, rk, ni]

(L = floats per cache line). Past the panel's end the prefetch touches the next panel (or nothing: a prefetch
never faults). The default distance is one page of the panel's stream — the window the hardware prefetcher
cannot cover — and is the knob `prefetch` (k-steps; 0 turns it off)."""
from __future__ import annotations

from kiln.kernel.ir import Const, Expr, Load, Prefetch, Var, walk
from kiln.schedule.config import Decisions, powers_of_two
from kiln.target import Target

PAGE_BYTES = 4096   # hardware stream prefetchers (Intel, AMD, Arm) do not cross 4 KiB pages
LINE_BYTES = 64


def default_distance(nr: int, k_extent: int, target: Target) -> int:
    """k-steps in one page of an NR-wide float32 panel (AVX-512 NR=32: 32 steps), for a reduction long enough to
    cross a page; 0 (none) on scalable targets, whose strip-mined loops take no prefetch."""
    if target.scalable:
        return 0
    steps = max(1, PAGE_BYTES // (nr * 4))
    return steps if k_extent * nr * 4 > PAGE_BYTES else 0


def prefetch_knob(dec: Decisions, nr: int, k_extent: int, target: Target) -> int:
    if target.scalable:
        return 0
    d = default_distance(nr, k_extent, target)
    return int(dec.knob("prefetch", d, [0] + powers_of_two(4, 128)))


def prefetch_panel(term: Expr, k: Var, ni: Var, distance: int, nr: int) -> list[Prefetch]:
    """The prefetches of one reduction step of a tile reading the panel load of `term` (the load indexed by the
    tile column `ni` whose index has k as its middle term: Bp[no, k, ni]), `distance` steps ahead; [] if none."""
    if distance <= 0:
        return []
    panel = next((e for e in walk(term) if isinstance(e, Load) and len(e.index) == 3 and e.index[1] == k
                  and e.index[2] == ni), None)
    if panel is None:
        return []
    per_line = LINE_BYTES // 4
    return [Prefetch(panel.buf, (panel.index[0], k + Const(distance, "int64"), ni + Const(j, "int64") if j else ni))
            for j in range(0, nr, per_line)]
