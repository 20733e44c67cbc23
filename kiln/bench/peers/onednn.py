"""oneDNN SGEMM peer: `dnnl_sgemm` from `libdnnl` (the `onednn` wheel), called through ctypes.

The wheel's libdnnl is built with the SYCL CPU runtime, whose host threading is oneTBB; it has no
RUNPATH, so its dependencies (libtbb, the Intel compiler runtime, libsycl, all in the interpreter's
lib dir) are dlopened first with RTLD_GLOBAL.

Threads: oneTBB's `global_control(max_allowed_parallelism, threads)`, created through the exported
`tbb::detail::r1::create` entry point (the C++ object is 3 words: value, reserved, parameter); one
lives at a time and each run replaces it when its thread count differs (TBB would obey the minimum).
TBB's arena is still sized to the machine, so oneDNN partitions for all cores and TBB runs the parts
on at most `threads` threads. Placement is TBB's. `dnnl_sgemm`
is row-major and packs B on every call (the matmul primitive with a blocked weight layout would not).
"""
from __future__ import annotations

import ctypes

import numpy as np

from kiln.bench.peers.base import Peer, Runner, dist_version, gemm_input, gemm_of, load_global, loadable, prefix_lib
from kiln.bench.workload import Workload

_DEPS = ("libtbb.so.12", "libintlc.so.5", "libimf.so", "libsvml.so", "libirng.so", "libsycl.so.9")
_GC_CREATE = "_ZN3tbb6detail2r16createERNS0_2d114global_controlE"
_GC_DESTROY = "_ZN3tbb6detail2r17destroyERNS0_2d114global_controlE"
_GC_ACTIVE = "_ZN3tbb6detail2r127global_control_active_valueEi"
_state: dict[str, ctypes.CDLL] = {}


class _Version(ctypes.Structure):
    _fields_ = [("major", ctypes.c_int), ("minor", ctypes.c_int), ("patch", ctypes.c_int),
                ("hash", ctypes.c_char_p), ("cpu_runtime", ctypes.c_uint), ("gpu_runtime", ctypes.c_uint)]


class _GlobalControl(ctypes.Structure):
    """oneTBB `d1::global_control`: size_t my_value; intptr_t my_reserved; parameter my_param."""
    _fields_ = [("value", ctypes.c_size_t), ("reserved", ctypes.c_ssize_t), ("param", ctypes.c_int)]


class TbbLimit:
    """A live `tbb::global_control` limiting TBB to `n` threads; destroyed with this object."""

    def __init__(self, tbb: ctypes.CDLL, n: int) -> None:
        self.n, self._tbb, self._gc = n, tbb, _GlobalControl(n, 0, 0)  # 0 = max_allowed_parallelism
        getattr(tbb, _GC_CREATE)(ctypes.byref(self._gc))

    def __del__(self) -> None:
        try:
            getattr(self._tbb, _GC_DESTROY)(ctypes.byref(self._gc))
        except Exception:
            pass


_limit: list[TbbLimit] = []  # the one live global_control (TBB would apply the minimum of several)


def set_tbb_threads(tbb: ctypes.CDLL, n: int) -> None:
    """Make TBB's thread limit `n`, replacing the previous limit (cheap when it is already `n`)."""
    if _limit and _limit[0].n == n:
        return
    new = TbbLimit(tbb, n)
    _limit[:] = [new]


def _load() -> tuple[ctypes.CDLL, ctypes.CDLL]:
    if not _state:
        for dep in _DEPS:
            p = prefix_lib(dep)
            if p is not None:
                load_global(p)
        tbb_path = prefix_lib("libtbb.so.12", "libtbb.so")
        dnnl_path = prefix_lib("libdnnl.so.3", "libdnnl.so")
        if dnnl_path is None or tbb_path is None:
            raise OSError("libdnnl.so / libtbb.so.12 not found in the interpreter's lib dir")
        tbb, dnnl = ctypes.CDLL(str(tbb_path)), ctypes.CDLL(str(dnnl_path))
        i64, p, f = ctypes.c_int64, ctypes.c_void_p, ctypes.c_float
        dnnl.dnnl_sgemm.argtypes = [ctypes.c_char, ctypes.c_char, i64, i64, i64, f, p, i64, p, i64, f, p, i64]
        dnnl.dnnl_sgemm.restype = ctypes.c_int
        dnnl.dnnl_version.restype = ctypes.POINTER(_Version)
        getattr(tbb, _GC_ACTIVE).restype = ctypes.c_size_t
        _state.update(tbb=tbb, dnnl=dnnl)
    return _state["tbb"], _state["dnnl"]


class OneDnnPeer(Peer):
    name = "onednn"
    kinds = frozenset({"gemm"})
    requirement = "onednn"

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
        set_tbb_threads(tbb, threads)

        def run() -> list[np.ndarray]:
            set_tbb_threads(tbb, threads)
            status = sgemm(b"N", b"N", m, n, k, 1.0, pa, k, pb, n, 0.0, pc, n)
            if status != 0:
                raise RuntimeError(f"dnnl_sgemm failed with status {status}")
            return [c]

        run.keepalive = (a, b, c)  # type: ignore[attr-defined]
        return run
