"""OpenBLAS SGEMM peer: `scipy_cblas_sgemm` from the scipy-openblas32 wheel, called through ctypes.

Why this library and not `numpy.matmul`: numpy bundles its own OpenBLAS (scipy-openblas64) whose
thread count is fixed from OPENBLAS_NUM_THREADS when numpy is imported and cannot be set afterwards
without threadpoolctl; the scipy-openblas32 wheel is the same OpenBLAS build, loaded privately here,
and exports `scipy_openblas_set_num_threads`, so the thread count is set exactly before each run.

Threads: `scipy_openblas_set_num_threads(threads)` before every call (OpenBLAS' own pthread pool, pinned by
nothing: the OS schedules it). B is used as given (row-major [K,N]); OpenBLAS packs it on every call
(it has no pre-packed API for SGEMM), which is what a BLAS user gets.
"""
from __future__ import annotations

import ctypes
from pathlib import Path

from kiln.bench.peers.base import (
    Peer,
    Runner,
    cblas_sgemm_runner,
    dist_version,
    gemm_input,
    gemm_of,
    try_import,
)
from kiln.bench.workload import Workload

_lib: ctypes.CDLL | None = None


def _load() -> ctypes.CDLL:
    global _lib
    if _lib is None:
        import scipy_openblas32

        lib = ctypes.CDLL(str(Path(scipy_openblas32.get_lib_dir()) / scipy_openblas32.get_library(True)))
        p, i, f = ctypes.c_void_p, ctypes.c_int, ctypes.c_float
        lib.scipy_cblas_sgemm.argtypes = [i, i, i, i, i, i, f, p, i, p, i, f, p, i]
        lib.scipy_cblas_sgemm.restype = None
        lib.scipy_openblas_set_num_threads.argtypes = [i]
        lib.scipy_openblas_get_config.restype = ctypes.c_char_p
        _lib = lib
    return _lib


class OpenBlasPeer(Peer):
    name = "openblas"
    kinds = frozenset({"gemm"})
    requirement = "scipy-openblas32"
    approach = "vendor libraries"

    def available(self) -> tuple[bool, str]:
        ok, why = try_import("scipy_openblas32", pip=self.requirement)
        if not ok:
            return ok, why
        try:
            _load()
        except OSError as e:
            return False, f"cannot load libscipy_openblas: {e}"
        return True, ""

    def version(self) -> str:
        v = dist_version("scipy-openblas32")
        try:
            return f"{v} ({_load().scipy_openblas_get_config().decode()})"
        except Exception:
            return v

    def prepare(self, workload: Workload, threads: int, strategy: str = "default") -> Runner:
        self.check(workload, threads, strategy)
        g = gemm_of(workload)
        lib = _load()
        lib.scipy_openblas_set_num_threads(threads)
        return cblas_sgemm_runner(lib.scipy_cblas_sgemm, gemm_input(workload, g), g.b, g.m, g.n, g.k,
                            lambda: lib.scipy_openblas_set_num_threads(threads))
