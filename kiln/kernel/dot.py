"""Dot-product expressions of the kernel IR: the 8-bit and bf16 multiply-accumulates that one instruction does on some
ISA, each with its plain-arithmetic value (`expand`) where it has one.

    Dot4     acc + Σ_{q<4} a[q]·b[q] per int32 lane            vpdpbusd, SDOT, RVV widening MACs   codegen/int8.py
    Dot2     acc + Σ_{q<2} a[q]·b[q] per float32 lane (bf16)   vdpbf16ps, BFDOT                    codegen/dpbf16.py
             or per int32 lane (8-bit a, int16 b)              pmaddwd (x86 without VNNI)          codegen/int8.py
    LaneDot4 acc + Σ_{q<4} x_q·w[q] per int32 lane, x_q vectors  vpdpbusd (an int8 depthwise conv)   codegen/int8.py
    Mmla     a 2-row × 2-column block per 4 lanes              SMMLA (i8mm), BFMMLA                codegen/mmla.py
    MmlaRow  one row of two Mmla accumulators, in column order (the tile's epilogue reads it)"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kiln.kernel.ir import Cast, Const, Expr, Load, cache_hash


def _grouped_sum(acc: Expr, a: Load, b: Load, group: int, product: Any) -> Expr:
    """acc + Σ_{q<group} product(a[.., i + q], b[.., j + q]): a dot-product node's value in plain arithmetic."""
    out = acc
    for q in range(group):
        x, y = (Load(v.buf, v.index[:-1] + (v.index[-1] + q,), v.dtype) for v in (a, b))
        out = out + product(x, y)
    return out


@dataclass(frozen=True, repr=False)
class Dot4(Expr):
    """acc + Σ_{q<4} a[q]·b[q] in int32 lanes — the 8-bit dot product of x86 `vpdpbusd`, Arm SDOT/USDOT and RVV's
    widening multiply-adds. `a` and `b` are Loads of the first of 4 consecutive bytes (byte q is their last index
    + q); a is uint8 or int8, b int8. In a vector loop `a` is uniform (one 32-bit broadcast) and lane i of `b`
    reads the 4 bytes at its index + 4·i (weights packed [K/4][N][4]). kiln/codegen/int8.py emits it."""
    acc: Expr
    a: Load
    b: Load
    dtype: str = field(init=False, default="int32")

    def expand(self) -> Expr:
        """The same value in plain integer arithmetic (scalar code, and targets without a dot product)."""
        return _grouped_sum(self.acc, self.a, self.b, 4, lambda a, b: Cast("int32", a) * Cast("int32", b))

    def __repr__(self) -> str:
        return f"dot4({self.acc!r}, {self.a!r}, {self.b!r})"


@dataclass(frozen=True, repr=False)
class LaneDot4(Expr):
    """acc + Σ_{q<4} x_q · w[q] in int32 lanes, where both operands vary per lane: four 8-bit values x0 … x3 (any
    expressions, e.g. an int8 depthwise conv's four taps along a window row, each a vector over the channels;
    Const 0 where the window has fewer taps) are interleaved into each lane's 4 bytes, against the weights `w`,
    a Load of the first of each lane's 4 consecutive bytes (lane i at its index + 4·i: taps packed
    [.., C, 4], graph/quant_pack.py `pack_depthwise_quads`). One `vpdpbusd` per 16 lanes instead of four widening
    multiplies and adds. A Const 0 tap faces zero weights (the packing pads them), so an emitter may put any byte
    there; `stride` (> 0) says the taps read one buffer that many elements apart. kiln/codegen/int8.py emits it;
    `acc + LaneDot4(0, …)` folds into its accumulator (schedule/primitives.py `combine`)."""
    acc: Expr
    x0: Expr
    x1: Expr
    x2: Expr
    x3: Expr
    w: Load
    stride: int = 0   # elements between consecutive taps' reads when they are plain loads of one buffer (else 0)
    dtype: str = field(init=False, default="int32")

    @property
    def taps(self) -> tuple[Expr, Expr, Expr, Expr]:
        return self.x0, self.x1, self.x2, self.x3

    def expand(self) -> Expr:
        """The same value in plain integer arithmetic (scalar code, bounds-checked builds, targets without VNNI)."""
        out = self.acc
        for q, x in enumerate(self.taps):
            if not (isinstance(x, Const) and x.value == 0):
                wq = Load(self.w.buf, self.w.index[:-1] + (self.w.index[-1] + q,), self.w.dtype)
                out = out + Cast("int32", x) * Cast("int32", wq)
        return out

    def __repr__(self) -> str:
        return f"lane_dot4({self.acc!r}, [{', '.join(map(repr, self.taps))}], {self.w!r}, stride={self.stride})"


@dataclass(frozen=True, repr=False)
class Dot2(Expr):
    """acc + Σ_{q<2} a[q]·b[q] in float32 lanes from bfloat16 pairs — x86 AVX512_BF16 `vdpbf16ps` —, or in int32
    lanes from 8-bit activations and int16 weights — x86 `pmaddwd` (targets without VNNI: graph/quant_pack.py
    dot_group). Like `Dot4`: `a` and `b` are Loads of the first of 2 consecutive values (value q is their last index
    + q); in a vector loop `a` is uniform (one broadcast of the pair) and lane i of `b` reads the pair at its index
    + 2·i (weights in VNNI pair order [K/2][N][2], graph/passes/precision.py, graph/quant_pack.py).
    kiln/codegen/dpbf16.py and kiln/codegen/int8.py emit it."""
    acc: Expr
    a: Load
    b: Load
    dtype: str = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "dtype", "int32" if self.a.dtype in ("int8", "uint8") else "float32")

    def expand(self) -> Expr:
        """The same value in plain arithmetic: float32 (bf16 products are exact in float32: the emulation), int32."""
        if self.dtype == "int32":
            return _grouped_sum(self.acc, self.a, self.b, 2, lambda a, b: Cast("int32", a) * Cast("int32", b))
        return _grouped_sum(self.acc, self.a, self.b, 2, lambda a, b: a * b)

    def __repr__(self) -> str:
        return f"dot2({self.acc!r}, {self.a!r}, {self.b!r})"


@dataclass(frozen=True, repr=False)
class Mmla(Expr):
    """acc + A·Bᵀ on 2×2 blocks — AArch64 SMMLA (int8, i8mm) and BFMMLA (bf16): per instruction, rows r0, r1 of A
    (2G consecutive values each) times columns c, c + 1 of B (2G values each), into 4 lanes [r0·c, r0·c+1, r1·c,
    r1·c+1]. G is the dot-product group of the weights' VNNI layout (4 bytes, or a bf16 pair; B packed
    [K/G][N][G]), so one block reads two consecutive groups q, q + 1.

    In a vector loop of n lanes over the output columns, an Mmla covers the n/2 columns starting at lane `lane0`
    (0 or n/2) of the loop: its n lanes are n/4 blocks, block j the columns lane0 + 2j, lane0 + 2j + 1. `a0`, `a1`
    are the rows' reads at the first value of the pair of groups; `b0` is lane `lane0`'s column at group q (the next
    columns G values apart), `b1` the same at group q + 1, or None (zero). `count` values of each A row are read
    (2G with b1; G or fewer without: an odd last group, a K tail), the rest taken as zero — B's zero-padded groups
    (graph/quant_pack.py, graph/passes/precision.py) may be read whole. Two Mmlas (lane0 0 and n/2) hold two rows ×
    n columns; `MmlaRow` takes one row back out. Only codegen/mmla.py emits it (no scalar form)."""
    acc: Expr
    a0: Load
    a1: Load
    b0: Load
    b1: Load | None
    count: int
    lane0: int
    dtype: str = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "dtype", "int32" if self.a0.dtype in ("int8", "uint8") else "float32")

    def __repr__(self) -> str:
        b1 = repr(self.b1) if self.b1 is not None else "0"
        return f"mmla({self.acc!r}, [{self.a0!r}, {self.a1!r}], [{self.b0!r}, {b1}], count={self.count}, " \
               f"lane0={self.lane0})"


@dataclass(frozen=True, repr=False)
class MmlaRow(Expr):
    """Row `row` (0 or 1) of the two rows two `Mmla` accumulators hold — `lo` the columns from lane 0, `hi` those from
    lane n/2 — as n lanes in column order: lane j is block (j mod n/2) // 2 of lo (j < n/2) or hi, element
    2·row + j mod 2. One shuffle of two vectors (a zip of 64-bit halves per block pair on NEON)."""
    lo: Expr
    hi: Expr
    row: int
    dtype: str = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "dtype", self.lo.dtype)

    def __repr__(self) -> str:
        return f"mmla_row({self.lo!r}, {self.hi!r}, {self.row})"


for _cls in (Dot4, LaneDot4, Dot2, Mmla, MmlaRow):
    cache_hash(_cls)
