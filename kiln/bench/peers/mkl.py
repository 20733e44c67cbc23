"""Intel oneMKL SGEMM peer: `cblas_sgemm` from `libmkl_rt` (the `mkl` wheel), called through ctypes.

Threads: the GNU OpenMP threading layer (MKL_THREADING_LAYER=GNU in the environment when libmkl_rt is
loaded: libmkl_gnu_thread on libgomp) with `MKL_Set_Dynamic(0)` so MKL does not pick fewer threads on
its own, and `MKL_Set_Num_Threads(threads)` before every call. Not the Intel layer (libiomp5): once
torch is imported, its libgomp is in the global symbol scope, libiomp5's parallel regions then see
`omp_get_thread_num() == 0` in every thread and each thread computes the whole product (C came out
exactly 2x with 2 threads). `MKL_Set_Threading_Layer(GNU)` returns success yet leaves MKL sequential in
this build (MKL_VERBOSE says "sequential"), hence the environment variable; prepare() checks that
`MKL_Get_Max_Threads()` is the requested count, since MKL falls back silently.
Thread placement is left to libgomp and the OS.
The ISA path is MKL's own CPU dispatch. B is used as given; MKL packs it on every call.
"""
from __future__ import annotations

import ctypes
import os

from kiln.bench.peers.base import (
    Peer,
    PeerError,
    Runner,
    cblas_sgemm_runner,
    dist_version,
    gemm_input,
    gemm_of,
    loadable,
    prefix_lib,
)
from kiln.bench.workload import Workload

_lib: ctypes.CDLL | None = None


def _load() -> ctypes.CDLL:
    """dlopen libmkl_rt once and choose the threading layer (must precede any other MKL call)."""
    global _lib
    if _lib is None:
        path = prefix_lib("libmkl_rt.so", "libmkl_rt.so.3", "libmkl_rt.so.2")
        if path is None:
            raise OSError("libmkl_rt.so not found in the interpreter's lib dir")
        os.environ["MKL_THREADING_LAYER"] = "GNU"  # read by libmkl_rt at its first call
        lib = ctypes.CDLL(str(path))
        p, i, f = ctypes.c_void_p, ctypes.c_int, ctypes.c_float
        lib.cblas_sgemm.argtypes = [i, i, i, i, i, i, f, p, i, p, i, f, p, i]
        lib.cblas_sgemm.restype = None
        lib.MKL_Set_Num_Threads.argtypes = [i]
        lib.MKL_Set_Dynamic.argtypes = [i]
        lib.MKL_Get_Max_Threads.restype = i
        _lib = lib
    return _lib


class MklPeer(Peer):
    name = "mkl"
    kinds = frozenset({"gemm"})
    requirement = "mkl"

    def available(self) -> tuple[bool, str]:
        return loadable(_load, self.requirement)

    def version(self) -> str:
        try:
            buf = ctypes.create_string_buffer(256)
            _load().MKL_Get_Version_String(buf, 256)
            return f"{dist_version('mkl')} ({buf.value.decode().split(' for ')[0]})"
        except OSError:
            return dist_version("mkl")

    def prepare(self, workload: Workload, threads: int, strategy: str = "default") -> Runner:
        self.check(workload, threads, strategy)
        g = gemm_of(workload)
        lib = _load()
        lib.MKL_Set_Dynamic(0)

        def set_threads() -> None:
            lib.MKL_Set_Num_Threads(threads)

        set_threads()
        if lib.MKL_Get_Max_Threads() != threads:
            raise PeerError(f"MKL runs {lib.MKL_Get_Max_Threads()} threads, not {threads} "
                            "(its threading layer did not load: sequential fallback)")
        return cblas_sgemm_runner(lib.cblas_sgemm, gemm_input(workload, g), g.b, g.m, g.n, g.k, set_threads)
