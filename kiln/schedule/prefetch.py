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

A tile with two or more reduction axes, the innermost unrolled — a conv's (channel block, taps, channels in the
block), a Winograd product's (channel block, channels in it) — uses `prefetch_next_block` (the knob
`prefetch_block`): the streamed operand's lines one step of the OUTERMOST reduction axis ahead, one per line of each
unrolled innermost step, issued in the loop around those steps, so over one channel block it touches every line of
the next block's rows once:

    for rcb in 0..CB:                                   for rcb in 0..CB:
      for rco in 0..4:                                    for rco in 0..4:
        for rcu in 0..8 unroll:                   ⇒         prefetch U[r, c, cob, rcb + 1, 8·rco + j, l·L]  (j < 8, l)
          for mi in 0..MR unroll:                           for rcu in 0..8 unroll:
            $acc[mi] += V[…] · U[…, rcb, 8·rco + rcu, ni]     for mi in 0..MR unroll: $acc[mi] += V[…] · U[…]

Each block's rows are a few 4 KiB pages of their own, which the hardware prefetcher enters only after missing;
where the operand outgrows L2 (resnet18's last two stages: U 4.2 and 16.8 MB per conv; the model's weights do not
stay in L3 between runs) they come from L3 or memory at every block. Above the unrolled steps, not between them:
interleaved, LLVM's skylake-avx512 and haswell scheduling models spilled a conv tile's accumulators (18 / 8 vector
registers per trip, tests/test_register_pressure.py), and on Zen 5 it ran 1.6% slower than this placement. Default on
where the operand is larger than L2 and the vectors wider than 128 bits (schedule/tile.py): resnet18's layer3
products 0.28 → 0.24 ms, layer4's 0.53 → 0.49, a stride-2 3×3 conv's (1.2 MB of weights) 0.26 → 0.24, the model
5.4% faster on one L3 and 3.6% on two, resnet50 2.1% (Zen 5, `benchmarks/option_by_host_state.py resnet18 --off
prefetch`); where the operand fits L2 it is off (layer1's and layer2's fused products measured 1–2% slower with it).
"""
from __future__ import annotations

from kiln.kernel.analysis import coef
from kiln.kernel.ir import Const, Expr, Kernel, Load, Prefetch, Var, substitute, walk
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


def prefetch_next_block(term: Expr, block: Var, lane: Var, row: Var, lanes: int) -> list[Prefetch]:
    """The prefetches of `term`'s streamed operand at the next step of the outermost reduction axis `block`, one per
    line of the NR-wide row; schedule/tile.py puts those of every unrolled innermost step above them (module doc)."""
    return prefetch_ahead(term, block, lane, row, lanes, 1)


def operand_bytes(k: Kernel, buf: str) -> int:
    """The size in bytes of a static kernel's buffer `buf` (0 for one it does not hold: a stack `Alloc`)."""
    try:
        b = k.buffer(buf)
    except KeyError:
        return 0
    return b.size * _ITEMSIZE.get(b.dtype, 4)


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
