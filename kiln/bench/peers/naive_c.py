"""Naive C peer: a plain triple-loop SGEMM compiled by the system C compiler, the autovectorizer baseline.

It shows what `cc -O3 -march=native -fopenmp` makes of textbook code with no tiling, packing or
intrinsics. The loop order is i-k-j (C row += A[i,k] * B row): the innermost loop is a unit-stride
AXPY that GCC vectorizes to AVX-512 FMAs without -ffast-math; the i-j-k (dot-product) order would stay
scalar because its reduction may not be reordered. The library is built once per process in a temp
dir (that build is the compile time).

Threads: `#pragma omp parallel for num_threads(nt)` over rows of C, `nt` passed on every call
(libgomp's pool; placement left to the OS, no OMP_PROC_BIND).
"""
from __future__ import annotations

import ctypes

import numpy as np

from kiln.bench.peers import _cc
from kiln.bench.peers.base import Peer, Runner, gemm_input, gemm_of
from kiln.bench.workload import Workload

SOURCE = r"""
#include <stddef.h>
void naive_sgemm(int M, int N, int K, const float *restrict A, const float *restrict B,
                 float *restrict C, int nt) {
    #pragma omp parallel for num_threads(nt) schedule(static)
    for (int i = 0; i < M; i++) {
        float *c = C + (size_t)i * N;
        for (int j = 0; j < N; j++) c[j] = 0.0f;
        for (int k = 0; k < K; k++) {
            const float a = A[(size_t)i * K + k];
            const float *b = B + (size_t)k * N;
            for (int j = 0; j < N; j++) c[j] += a * b[j];
        }
    }
}
"""
FLAGS = ("-O3", "-march=native", "-fopenmp")


def build() -> ctypes.CDLL:
    """Compile SOURCE once per process and load it."""
    lib = _cc.build("naive-c", {"gemm.c": SOURCE}, FLAGS)
    i, p = ctypes.c_int, ctypes.c_void_p
    lib.naive_sgemm.argtypes = [i, i, i, p, p, p, i]
    lib.naive_sgemm.restype = None
    return lib


class NaiveCPeer(Peer):
    name = "naive-c"
    kinds = frozenset({"gemm"})
    requirement = "a C compiler with OpenMP (apt-get install gcc)"
    approach = "compiler autovectorization"

    def available(self) -> tuple[bool, str]:
        if _cc.compiler() is None:
            return False, f"no C compiler on PATH; {self.requirement}"
        return True, ""

    def version(self) -> str:
        return f"{_cc.compiler_version()} {' '.join(FLAGS)}"

    def prepare(self, workload: Workload, threads: int, strategy: str = "default") -> Runner:
        self.check(workload, threads, strategy)
        g = gemm_of(workload)
        fn = build().naive_sgemm
        a, b = gemm_input(workload, g), g.b
        c = np.empty((g.m, g.n), np.float32)
        m, n, k = g.m, g.n, g.k
        pa, pb, pc = a.ctypes.data, b.ctypes.data, c.ctypes.data

        def run() -> list[np.ndarray]:
            fn(m, n, k, pa, pb, pc, threads)
            return [c]

        run.keepalive = (a, b, c)  # type: ignore[attr-defined]
        return run
