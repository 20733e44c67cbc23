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
on a machine is the tuner's measurement, not a rule here."""
from __future__ import annotations

from kiln.kernel.analysis import coef
from kiln.kernel.ir import Const, Expr, Load, Prefetch, Var, substitute, walk

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
