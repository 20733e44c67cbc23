"""Schedule primitive `prefetch_ahead`: a software prefetch of a register tile's streamed operand, `distance` steps
of its reduction ahead — the knob `prefetch` of the direct GEMM/convolution tile (schedule/tile.py).

Before (one MR×NR tile; the shared operand — B's packed panel in a MatMul, the input row in a conv — is read
once per tile and streams from L2 or memory, while the broadcast operand A is small and hot):

    for ni in 0..NR vector<NR>:
      local $acc[MR] = 0
      for k in 0..K:
        for mi in 0..MR unroll:
          $acc[mi] += A[m0 + mi, k] · Bp[no, k, ni]

After `prefetch_ahead(term, k, ni, mi, NR, distance=D)`, one prefetch per 64-byte line of the NR-wide row of the
streamed operand (16 floats; NR = 32 on AVX-512: two lines):

      for k in 0..K:
        prefetch Bp[no, k + D, 0]
        prefetch Bp[no, k + D, 16]
        for mi in 0..MR unroll:
          $acc[mi] += A[m0 + mi, k] · Bp[no, k, ni]

A prefetch is a hint (kernel IR `Prefetch` → llvm.prefetch → prefetcht0): it never faults, so the last D steps,
which point past the panel, need no guard, and it changes no value. The default distance is 0 (no prefetch: the
heuristics' nest unchanged); hardware prefetchers already follow a unit-stride stream, so whether a distance pays
on a machine is the tuner's measurement, not a rule here.

A packed weight panel's tile (schedule/tile.py: _packed_tile) uses `prefetch_panel`, whose DEFAULT distance is one page
of the panel's stream — its own knob value, on by default (switch `prefetch`), measured on BERT's weight-streaming
GEMMs (bert-perf, docs/bert-fp32.md):
    Software prefetch of a packed weight panel, a page ahead of the register tile's reduction.

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
    cannot cover — and is the knob `prefetch` (k-steps; 0 turns it off).
"""
from __future__ import annotations

from kiln.kernel.analysis import coef
from kiln.kernel.ir import Const, Expr, Load, Prefetch, Var, substitute, walk
from kiln.schedule.config import Decisions, powers_of_two
from kiln.target import Target

LINE_BYTES = 64
DISTANCES = (0, 1, 2, 4, 8, 16, 32)   # reduction steps ahead; 0 = no prefetch
_ITEMSIZE = {"float32": 4, "float64": 8, "bfloat16": 2, "float16": 2, "int8": 1, "uint8": 1, "int32": 4}


def streamed_loads(term: Expr, step: Var, lane: Var, row: Var) -> list[Load]:
    """The loads of a tile's reduction term that stream with the reduction: contiguous along the tile's lanes (the
    lane variable only in the last index, coefficient 1), moving with the reduction step, the same for every row."""
    out: list[Load] = []
    for ld in walk(term):
        if not isinstance(ld, Load) or ld in out or not ld.index:
            continue
        *lead, last = ld.index
        if coef(last, lane) != 1 or any(coef(i, lane) != 0 for i in lead):
            continue
        if all(coef(i, step) == 0 for i in ld.index) or any(coef(i, row) != 0 for i in ld.index):
            continue
        out.append(ld)
    return out


def prefetch_ahead(term: Expr, step: Var, lane: Var, row: Var, lanes: int, distance: int) -> list[Prefetch]:
    """The prefetches to put at the top of the reduction step `step` (see the module doc); [] for distance 0."""
    if distance <= 0:
        return []
    out: list[Prefetch] = []
    for ld in streamed_loads(term, step, lane, row):
        per_line = max(1, LINE_BYTES // _ITEMSIZE.get(ld.dtype, 4))
        ahead = {step: step + Const(distance, "int64")}
        for first in range(0, lanes, per_line):
            index = tuple(substitute(substitute(i, {lane: Const(first, "int64"), row: Const(0, "int64")}), ahead)
                          for i in ld.index)
            out.append(Prefetch(ld.buf, index))
    return out


PAGE_BYTES = 4096   # hardware stream prefetchers (Intel, AMD, Arm) do not cross 4 KiB pages


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
