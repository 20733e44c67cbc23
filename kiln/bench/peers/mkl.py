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

from kiln.bench.peers.base import (
    Peer,
    PeerError,
    Runner,
    cblas_sgemm_runner,
    dist_version,
    gemm_input,
    gemm_of,
    loadable,
)
from kiln.bench.workload import Workload
from kiln.library import mkl as mkl_lib


def _load() -> ctypes.CDLL:
    """libmkl_rt, loaded (threading layer chosen first) by kiln.library.mkl, typed for a ctypes cblas_sgemm."""
    lib = mkl_lib.load()
    p, i, f = ctypes.c_void_p, ctypes.c_int, ctypes.c_float
    lib.cblas_sgemm.argtypes = [i, i, i, i, i, i, f, p, i, p, i, f, p, i]
    lib.cblas_sgemm.restype = None
    return lib


class MklPeer(Peer):
    name = "mkl"
    kinds = frozenset({"gemm"})
    requirement = "mkl"
    approach = "vendor libraries"

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
