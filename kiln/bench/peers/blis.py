"""BLIS SGEMM peer: `bli_sgemm` (BLIS's typed API) from the `blis` wheel, called from a small OpenMP driver.

BLIS is the canonical "framework + hand-written microkernel" BLAS: five loops around the packed panels in
portable C, one assembly microkernel per CPU family (kiln/library/blis.py says what the wheel ships and how it
is bound). B is used as given (row-major [K, N]); BLIS packs it on every call, as a BLAS user gets.

Threads: the wheel's BLIS is built without threading, so the driver below (compiled by the system C compiler
at bench time) splits C into `threads` column slabs with `#pragma omp parallel for` and calls bli_sgemm once
per slab — the partition BLIS's own jc loop uses when it is threaded, and the one Kiln's `library:blis`
strategy makes (kiln/schedule/library.py). Slabs are multiples of 16 columns. libgomp's pool, placed by the OS.
Kernel: BLIS's CPU dispatch (`haswell`, AVX2 6×16, on the Intel AVX-512 host; see kiln/library/blis.py);
`version()` names the configuration it chose.
"""
from __future__ import annotations

import ctypes

import numpy as np

from kiln.bench.peers import _cc
from kiln.bench.peers.base import Peer, Runner, dist_version, gemm_input, gemm_of
from kiln.bench.workload import Workload
from kiln.library import blis as blis_lib

DRIVER = r"""
#include <stdint.h>
typedef void (*sgemm_fn)(int, int, int64_t, int64_t, int64_t, const float *, const float *, int64_t, int64_t,
                         const float *, int64_t, int64_t, const float *, float *, int64_t, int64_t);

/* C[M, N] = A[M, K] B[K, N], row-major, as `slabs` calls of bli_sgemm on column slabs of B and C. */
void blis_slabs(sgemm_fn sgemm, int64_t M, int64_t N, int64_t K, const float *A, const float *B, float *C,
                int slabs) {
    const float one = 1.0f, zero = 0.0f;
    int64_t w = (N + slabs - 1) / slabs;
    w = (w + 15) / 16 * 16;
    const int64_t n_slabs = (N + w - 1) / w;
    #pragma omp parallel for num_threads(slabs) schedule(static)
    for (int64_t s = 0; s < n_slabs; s++) {
        const int64_t j0 = s * w, n = N - j0 < w ? N - j0 : w;
        sgemm(0, 0, M, n, K, &one, A, K, 1, B + j0, N, 1, &zero, C + j0, N, 1);
    }
}
"""
FLAGS = ("-O2", "-fopenmp")


def _driver() -> ctypes.CDLL:
    lib = _cc.build("blis-slabs", {"blis_slabs.c": DRIVER}, FLAGS)
    i64, p = ctypes.c_int64, ctypes.c_void_p
    lib.blis_slabs.argtypes = [p, i64, i64, i64, p, p, p, ctypes.c_int]
    lib.blis_slabs.restype = None
    return lib


class BlisPeer(Peer):
    name = "blis"
    kinds = frozenset({"gemm"})
    requirement = "blis"
    approach = "hand-written microkernels"

    def available(self) -> tuple[bool, str]:
        try:
            blis_lib.load()
        except OSError as e:
            return False, f"{e}; pip install {self.requirement}"
        if _cc.compiler() is None:
            return False, "no C compiler on PATH for the OpenMP slab driver (apt-get install gcc)"
        return True, ""

    def version(self) -> str:
        return f"{dist_version('blis')} (BLIS {blis_lib.version()}, kernels: {blis_lib.arch()}, no threading)"

    def prepare(self, workload: Workload, threads: int, strategy: str = "default") -> Runner:
        self.check(workload, threads, strategy)
        g = gemm_of(workload)
        sgemm = ctypes.cast(blis_lib.load().bli_sgemm, ctypes.c_void_p).value
        slabs = _driver().blis_slabs
        a, b = gemm_input(workload, g), g.b
        c = np.empty((g.m, g.n), np.float32)
        m, n, k = g.m, g.n, g.k
        pa, pb, pc = a.ctypes.data, b.ctypes.data, c.ctypes.data

        def run() -> list[np.ndarray]:
            slabs(sgemm, m, n, k, pa, pb, pc, threads)
            return [c]

        run.keepalive = (a, b, c)  # type: ignore[attr-defined]
        return run
