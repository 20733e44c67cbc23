"""The Exo schedule behind the `exo` peer: an MR×NR SGEMM register tile synthesized from a three-loop spec.

The spec is the plain product of one tile, C = A·B over a K-long panel (A packed k-major: A[k, i]):

    for i, j:      C[i, j] = 0
    for k, i, j:   C[i, j] += A[k, i] · B[k, j]

and `schedule()` rewrites it, each step a proved-equivalent Exo rewrite, into the register tile every BLAS
hand-writes (the loop nest before → after each group of steps):

 1. split j into NR/V vectors of V lanes (`divide_loop`), and stage the C tile (`stage_mem`) around both nests:
        c_reg[i, j] = C[i, j]; c_reg = 0; for k: c_reg += …; C = c_reg
    the staged load is dead (the zeroing overwrites it): fuse the two nests and `merge_writes` them away;
 2. give c_reg the shape [MR, NR/V, V] (`divide_dim`) so that each [V] row is one vector register;
 3. stage B[k, 0:NR] into b_reg[NR/V, V] once per k, and bind A[k, i] to a_vec[V] (`bind_expr`, `expand_dim`,
    `lift_alloc`, `autofission`): a broadcast per row;
 4. put c_reg, b_reg, a_vec in vector registers (`set_memory`) and map each V-lane loop onto an instruction
    (`replace_all`: setzero, loadu, storeu, broadcast, fmadd) — Exo checks that each instruction's semantics
    equals the loop it replaces;
 5. unroll every loop but k: MR·NR/V accumulators, NR/V loads of B and MR broadcasts per k.

ISAs: AVX-512 12×32 (24 zmm accumulators + 2 B vectors + 1 broadcast of 32 registers), AVX2 6×16 (12 + 2 + 1 of
16 ymm). Exo's x86 library has no masked broadcast for partial tiles, so the M edge gets a kernel for its row count
(the same schedule with MR smaller; the peer generates only the MR-row kernel and the one for M % MR) and the
N edge is zero-padded (a packed B panel and a padded C).
Imports Exo, so only the `exo` peer imports this module, inside prepare()."""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from exo import DRAM, SchedulingError, proc
from exo.API import compile_procs_to_strings
from exo.platforms import x86
from exo.stdlib.scheduling import (
    autofission,
    bind_expr,
    divide_dim,
    divide_loop,
    expand_dim,
    fuse,
    lift_alloc,
    merge_writes,
    rename,
    replace_all,
    set_memory,
    simplify,
    stage_mem,
    unroll_loop,
)


@dataclass(frozen=True)
class Isa:
    """One vector ISA's tile and the Exo instructions that implement its steps."""
    name: str
    mr: int
    nr: int
    lanes: int
    memory: Any
    instructions: tuple[Any, ...]
    cflags: tuple[str, ...]


ISAS: dict[str, Isa] = {
    "avx512": Isa("avx512", 12, 32, 16, x86.AVX512,
                  (x86.mm512_setzero_ps, x86.mm512_loadu_ps, x86.mm512_storeu_ps, x86.mm512_set1_ps,
                   x86.mm512_fmadd_ps), ("-mavx512f", "-mfma")),
    "avx2": Isa("avx2", 6, 16, 8, x86.AVX2,
                (x86.mm256_setzero_ps, x86.mm256_loadu_ps, x86.mm256_storeu_ps, x86.mm256_broadcast_ss,
                 x86.mm256_fmadd_ps), ("-mavx2", "-mfma")),
}


def spec(MR: int, NR: int) -> Any:  # noqa: N803 - Exo reads the tile sizes by these names
    """C[MR, NR] = A[K, MR]ᵀ · B[K, NR] for one tile; C is a window into the padded output (unit column stride)."""
    @proc
    def tile(K: size, A: f32[K, MR] @ DRAM, B: f32[K, NR] @ DRAM, C: [f32][MR, NR] @ DRAM):  # noqa: F821
        assert stride(C, 1) == 1  # noqa: F821
        for i in seq(0, MR):  # noqa: F821
            for j in seq(0, NR):  # noqa: F821
                C[i, j] = 0.0
        for k in seq(0, K):  # noqa: F821
            for i in seq(0, MR):  # noqa: F821
                for j in seq(0, NR):  # noqa: F821
                    C[i, j] += A[k, i] * B[k, j]
    return tile


def _unroll_all(p: Any, names: tuple[str, ...]) -> Any:
    for n in names:
        while True:
            try:
                p = unroll_loop(p, n)
            except SchedulingError:
                break
    return p


def schedule(isa: Isa, mr: int) -> Any:
    """The spec for an mr×NR tile, scheduled into the register tile (steps 1–5 of the module docstring)."""
    nr, v = isa.nr, isa.lanes
    p = rename(spec(mr, nr), f"exo_{isa.name}_{mr}x{nr}")
    # 1. vectors along j; the C tile staged around both nests, its dead load merged away
    p = divide_loop(p, "j", v, ["jo", "ji"], perfect=True)
    p = divide_loop(p, "j", v, ["jo", "ji"], perfect=True)
    p = stage_mem(p, p.find_loop("i").expand(0, 1), f"C[0:{mr}, 0:{nr}]", "c_reg")
    p = simplify(p)
    p = divide_loop(p, "i1", v, ["i1o", "i1i"], perfect=True)
    p = simplify(p)
    p = fuse(p, p.find_loop("i0"), p.find_loop("i"))
    p = fuse(p, p.find_loop("i1o"), p.find_loop("jo"))
    p = fuse(p, p.find_loop("i1i"), p.find_loop("ji"))
    p = simplify(merge_writes(p, p.find("c_reg[_] = C[_]").expand(0, 1)))
    # 2. one vector per [V] row of c_reg
    p = divide_dim(p, "c_reg", 1, v)
    p = divide_loop(p, "i1", v, ["i1o", "i1i"], perfect=True)
    # 3. B's row of the panel loaded once per k; A[k, i] broadcast per row
    p = simplify(p)
    p = stage_mem(p, p.find_loop("i"), f"B[k, 0:{nr}]", "b_reg")
    p = divide_dim(simplify(p), "b_reg", 0, v)
    p = divide_loop(p, "i0 #1", v, ["i0o", "i0i"], perfect=True)
    p = simplify(p)
    p = bind_expr(p, p.find("A[k, i]"), "a_vec")
    p = expand_dim(p, "a_vec", v, "ji")
    p = lift_alloc(p, "a_vec", n_lifts=2)
    p = simplify(autofission(p, p.find("a_vec[_] = _").after(), n_lifts=2))
    # 4. registers, and each V-lane loop replaced by the instruction it equals
    for buf in ("c_reg", "b_reg", "a_vec"):
        p = set_memory(p, buf, isa.memory)
    p = replace_all(p, list(isa.instructions))
    # 5. everything but k unrolled
    return simplify(_unroll_all(p, ("i0", "i1o", "i0o", "i", "jo")))


@functools.cache
def generate(isa_name: str, rows: tuple[int, ...] | None = None) -> tuple[str, str, dict[int, str]]:
    """(C source, header, {mr: kernel name}) for one ISA, a kernel per row count in `rows` (default 1…MR: every
    edge); the header is named exo_gemm.h. Scheduling is the slow part (seconds per kernel), hence the cache."""
    isa = ISAS[isa_name]
    procs = {mr: schedule(isa, mr) for mr in sorted(set(rows or range(1, isa.mr + 1)))}
    c, h = compile_procs_to_strings(list(procs.values()), "exo_gemm.h")
    return c, h, {mr: p.name() for mr, p in procs.items()}
