"""Exo SGEMM peer: register-tile kernels synthesized by Exo scheduling rewrites, compiled by the system C compiler.

Exo (`exo-lang`) is the middle ground between a compiler's direct emission and a hand-written microkernel: the
programmer writes the tile as three loops and a schedule of rewrites, each checked by Exo, that turns it into
vector intrinsics (kiln/bench/peers/_exo_gemm.py has the spec and the schedule). At bench time the schedule
runs, Exo emits C, and gcc compiles it with a small driver (below) — nothing generated is committed.

Strategies: `avx512` (12×32 tiles) and `avx2` (6×16); "default" is the widest the host runs.
The driver, what a BLAS framework does around its microkernel and no more:
  * B (the constant weight) packed once at prepare into NR-column panels [N/NR][K][NR], zero-padded;
  * A packed on every call into MR-row panels [M/MR][K][MR] (the last panel holds the M % MR leftover rows and
    gets the kernel made for that many rows: only the MR-row and that kernel are generated);
  * `#pragma omp for collapse(2)` over the (column panel, row panel) tiles, each tile one kernel call over the
    whole K (a thread's consecutive tiles share their B panel); C is written into a buffer padded to whole
    panels and returned as the [M, N] view of it.
Threads: libgomp's pool, `num_threads(threads)` on every call; placement is the OS's.
"""
from __future__ import annotations

import ctypes
from typing import Any

import numpy as np

from kiln.bench.peers import _cc
from kiln.bench.peers.base import Peer, PeerError, Runner, dist_version, gemm_input, gemm_of, try_import
from kiln.bench.workload import Workload

DRIVER = r"""
#include <stddef.h>
#include <stdint.h>
#include "exo_gemm.h"
typedef void (*tile_fn)(void *, int_fast32_t, const float *, const float *, struct exo_win_2f32);
static const tile_fn TILES[MR + 1] = { %(tiles)s };  /* by row count: MR and the M % MR edge */

/* B [K, N] -> Bp [ceil(N/NR)][K][NR], columns past N zero */
void exo_pack_b(int K, int N, const float *B, float *Bp) {
    const int nt = (N + NR - 1) / NR;
    for (int jt = 0; jt < nt; jt++)
        for (int k = 0; k < K; k++)
            for (int j = 0; j < NR; j++) {
                const int col = jt * NR + j;
                Bp[((size_t)jt * K + k) * NR + j] = col < N ? B[(size_t)k * N + col] : 0.0f;
            }
}

/* Cp [M][ldc] = A [M, K] Bp, ldc = ceil(N/NR) * NR; Ap: scratch of ceil(M/MR) * K * MR floats */
void exo_sgemm(int M, int N, int K, const float *A, const float *Bp, float *Ap, float *Cp, int threads) {
    const int mt = (M + MR - 1) / MR, nt = (N + NR - 1) / NR, ldc = nt * NR;
    #pragma omp parallel num_threads(threads)
    {
        #pragma omp for schedule(static)
        for (int it = 0; it < mt; it++) {
            const int rows = M - it * MR < MR ? M - it * MR : MR;
            float *ap = Ap + (size_t)it * K * MR;
            for (int i = 0; i < rows; i++) {
                const float *a = A + (size_t)(it * MR + i) * K;
                for (int k = 0; k < K; k++) ap[(size_t)k * rows + i] = a[k];
            }
        }
        #pragma omp for collapse(2) schedule(static)
        for (int jt = 0; jt < nt; jt++)
            for (int it = 0; it < mt; it++) {
                const int rows = M - it * MR < MR ? M - it * MR : MR;
                struct exo_win_2f32 c = { Cp + (size_t)it * MR * ldc + (size_t)jt * NR, { ldc, 1 } };
                TILES[rows](NULL, K, Ap + (size_t)it * K * MR, Bp + (size_t)jt * K * NR, c);
            }
    }
}
"""
FLAGS = ("-O3", "-fopenmp")


def host_isas() -> list[str]:
    """The Exo tile ISAs this CPU runs, widest first."""
    from kiln.target import host
    feats = set(host().features.split(","))
    out = []
    if {"+avx512f", "+fma"} <= feats:
        out.append("avx512")
    if {"+avx2", "+fma"} <= feats:
        out.append("avx2")
    return out


def build(isa: str, m: int) -> tuple[ctypes.CDLL, Any]:
    """Run the Exo schedule for `isa` (the tiles an M-row GEMM calls), compile its C with the driver;
    (library, the Isa)."""
    from kiln.bench.peers._exo_gemm import ISAS, generate

    spec = ISAS[isa]
    rows = tuple(sorted({r for r in (spec.mr if m >= spec.mr else 0, m % spec.mr) if r}))
    c, h, names = generate(isa, rows)
    driver = DRIVER.replace("%(tiles)s", ", ".join(f"[{mr}] = {name}" for mr, name in names.items()))
    defs = (f"-DMR={spec.mr}", f"-DNR={spec.nr}")
    lib = _cc.build(f"exo-{isa}", {"exo_gemm.c": c, "exo_gemm.h": h, "driver.c": driver},
                    (*FLAGS, *spec.cflags, *defs))
    i, p = ctypes.c_int, ctypes.c_void_p
    lib.exo_pack_b.argtypes = [i, i, p, p]
    lib.exo_pack_b.restype = None
    lib.exo_sgemm.argtypes = [i, i, i, p, p, p, p, i]
    lib.exo_sgemm.restype = None
    return lib, spec


class ExoPeer(Peer):
    name = "exo"
    kinds = frozenset({"gemm"})
    strategies = ("default", "avx512", "avx2")
    requirement = "exo-lang"
    approach = "synthesized kernels"

    def available(self) -> tuple[bool, str]:
        ok, why = try_import("exo", pip=self.requirement)
        if not ok:
            return ok, why
        if _cc.compiler() is None:
            return False, "no C compiler on PATH to compile Exo's output (apt-get install gcc)"
        if not host_isas():
            return False, "this CPU has neither AVX-512 nor AVX2 with FMA, the ISAs of the Exo schedules"
        return True, ""

    def version(self) -> str:
        return f"{dist_version('exo-lang')}, {_cc.compiler_version()} {' '.join(FLAGS)}"

    def prepare(self, workload: Workload, threads: int, strategy: str = "default") -> Runner:
        strategy = self.check(workload, threads, strategy)
        isa = host_isas()[0] if strategy == "default" else strategy
        if isa not in host_isas():
            raise PeerError(f"exo:{isa}: this CPU cannot run {isa} code")
        g = gemm_of(workload)
        lib, spec = build(isa, g.m)
        mt, nt = -(-g.m // spec.mr), -(-g.n // spec.nr)
        bp = np.empty(nt * g.k * spec.nr, np.float32)
        lib.exo_pack_b(g.k, g.n, g.b.ctypes.data, bp.ctypes.data)
        ap = np.empty(mt * g.k * spec.mr, np.float32)
        cp = np.empty((g.m, nt * spec.nr), np.float32)
        out = cp[:, :g.n]
        a = gemm_input(workload, g)
        m, n, k = g.m, g.n, g.k
        pa, pb, pap, pc = a.ctypes.data, bp.ctypes.data, ap.ctypes.data, cp.ctypes.data
        fn = lib.exo_sgemm

        def run() -> list[np.ndarray]:
            fn(m, n, k, pa, pb, pap, pc, threads)
            return [out]

        run.keepalive = (a, bp, ap, cp)  # type: ignore[attr-defined]
        return run
