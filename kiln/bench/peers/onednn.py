"""oneDNN SGEMM peer: `dnnl_sgemm` from `libdnnl` (the `onednn` wheel), called through ctypes.

The wheel's libdnnl is built with the SYCL CPU runtime, whose host threading is oneTBB; it has no
RUNPATH, so its dependencies (libtbb, the Intel compiler runtime, libsycl, all in the interpreter's
lib dir) are dlopened first with RTLD_GLOBAL.

Loading and threads are kiln.library.onednn's (the library strategy uses the same library): oneTBB's
`global_control(max_allowed_parallelism, threads)`; one lives at a time and each run replaces it when its thread
count differs (TBB would obey the minimum).
TBB's arena is still sized to the machine, so oneDNN partitions for all cores and TBB runs the parts
on at most `threads` threads. Placement is TBB's. `dnnl_sgemm`
is row-major and packs B on every call (the matmul primitive with a blocked weight layout would not).
"""
from __future__ import annotations

import ctypes

import numpy as np

from kiln.bench.peers.base import Peer, Runner, dist_version, gemm_input, gemm_of, loadable
from kiln.bench.workload import Workload
from kiln.library import onednn as onednn_lib


class _Version(ctypes.Structure):
    _fields_ = [("major", ctypes.c_int), ("minor", ctypes.c_int), ("patch", ctypes.c_int),
                ("hash", ctypes.c_char_p), ("cpu_runtime", ctypes.c_uint), ("gpu_runtime", ctypes.c_uint)]


def _load() -> tuple[ctypes.CDLL, ctypes.CDLL]:
    """libtbb and libdnnl, loaded (with their dependencies) by kiln.library.onednn, typed for ctypes calls."""
    dnnl = onednn_lib.load()
    i64, p, f = ctypes.c_int64, ctypes.c_void_p, ctypes.c_float
    dnnl.dnnl_sgemm.argtypes = [ctypes.c_char, ctypes.c_char, i64, i64, i64, f, p, i64, p, i64, f, p, i64]
    dnnl.dnnl_sgemm.restype = ctypes.c_int
    dnnl.dnnl_version.restype = ctypes.POINTER(_Version)
    return onednn_lib.tbb(), dnnl


class OneDnnPeer(Peer):
    name = "onednn"
    kinds = frozenset({"gemm"})
    requirement = "onednn"
    approach = "vendor libraries"

    def available(self) -> tuple[bool, str]:
        return loadable(_load, self.requirement)

    def version(self) -> str:
        try:
            v = _load()[1].dnnl_version().contents
            return f"{v.major}.{v.minor}.{v.patch}"
        except OSError:
            return dist_version("onednn")

    def prepare(self, workload: Workload, threads: int, strategy: str = "default") -> Runner:
        self.check(workload, threads, strategy)
        g = gemm_of(workload)
        tbb, dnnl = _load()
        a, b = gemm_input(workload, g), g.b
        c = np.empty((g.m, g.n), np.float32)
        m, n, k = g.m, g.n, g.k
        pa, pb, pc = a.ctypes.data, b.ctypes.data, c.ctypes.data
        sgemm = dnnl.dnnl_sgemm
        onednn_lib.set_threads(threads)

        def run() -> list[np.ndarray]:
            onednn_lib.set_threads(threads)
            status = sgemm(b"N", b"N", m, n, k, 1.0, pa, k, pb, n, 0.0, pc, n)
            if status != 0:
                raise RuntimeError(f"dnnl_sgemm failed with status {status}")
            return [c]

        run.keepalive = (a, b, c)  # type: ignore[attr-defined]
        return run
