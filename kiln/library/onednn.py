"""oneDNN from the `onednn` wheel: `dnnl_sgemm` of `libdnnl` (row-major, 64-bit dimensions), and its integer GEMMs
`dnnl_gemm_u8s8s32` / `dnnl_gemm_s8s8s32` (u8 or s8 activations × s8 weights → int32) for the integer anchors.

The wheel's libdnnl is built with the SYCL CPU runtime, whose host threading is oneTBB; it has no RUNPATH, so
its dependencies (libtbb, the Intel compiler runtime, libsycl, in the interpreter's lib dir) are dlopened first
with RTLD_GLOBAL. Threads: oneTBB's `global_control(max_allowed_parallelism, n)` (process-wide), created through
TBB's exported `tbb::detail::r1::create` entry point.

Why Conv is im2col + dnnl_sgemm and not a oneDNN convolution primitive: primitives need an engine, and this
wheel's only CPU engine is a SYCL device; the installed SYCL runtime ships no CPU adapter (only Level Zero), so
`dnnl_engine_create(dnnl_cpu)` fails ("SYCL cpu devices queried but not found"). `dnnl_sgemm` runs without an
engine. `engine_error()` reports the failure, and the tests check that it still holds."""
from __future__ import annotations

import ctypes

from kiln.kernel.ir import Addr, Call, Const
from kiln.library._load import load_global, prefix_lib

NAME = "onednn"
WHEEL = "onednn"
SGEMM = "dnnl_sgemm"
IGEMM = {"uint8": "dnnl_gemm_u8s8s32", "int8": "dnnl_gemm_s8s8s32"}  # by A's (the activation's) type; B is s8
SYMBOLS = (SGEMM, *IGEMM.values())
_DEPS = ("libtbb.so.12", "libintlc.so.5", "libimf.so", "libsvml.so", "libirng.so", "libsycl.so.9")
_GC_CREATE = "_ZN3tbb6detail2r16createERNS0_2d114global_controlE"
_GC_DESTROY = "_ZN3tbb6detail2r17destroyERNS0_2d114global_controlE"
DNNL_CPU, DNNL_SUCCESS = 1, 0

_state: dict[str, ctypes.CDLL] = {}


class _GlobalControl(ctypes.Structure):
    """oneTBB `d1::global_control`: size_t my_value; intptr_t my_reserved; parameter my_param."""
    _fields_ = [("value", ctypes.c_size_t), ("reserved", ctypes.c_ssize_t), ("param", ctypes.c_int)]


class TbbLimit:
    """A live `tbb::global_control` limiting TBB to `n` threads; destroyed with this object."""

    def __init__(self, tbb: ctypes.CDLL, n: int) -> None:
        self.n, self._tbb, self._gc = n, tbb, _GlobalControl(n, 0, 0)  # param 0 = max_allowed_parallelism
        getattr(tbb, _GC_CREATE)(ctypes.byref(self._gc))

    def __del__(self) -> None:
        try:
            getattr(self._tbb, _GC_DESTROY)(ctypes.byref(self._gc))
        except Exception:  # interpreter shutdown: TBB may be gone already
            pass


_limit: list[TbbLimit] = []  # one live limit: TBB would obey the minimum of several


def load() -> ctypes.CDLL:
    """dlopen libdnnl (after its dependencies) once; OSError when the wheel is missing."""
    if not _state:
        for dep in _DEPS:
            p = prefix_lib(dep)
            if p is not None:
                load_global(p)
        tbb_path = prefix_lib("libtbb.so.12", "libtbb.so")
        dnnl_path = prefix_lib("libdnnl.so.3", "libdnnl.so")
        if dnnl_path is None or tbb_path is None:
            raise OSError("libdnnl.so / libtbb.so.12 not found in the interpreter's lib dir")
        _state.update(tbb=ctypes.CDLL(str(tbb_path)), dnnl=ctypes.CDLL(str(dnnl_path)))
    return _state["dnnl"]


def tbb() -> ctypes.CDLL:
    load()
    return _state["tbb"]


def set_threads(n: int) -> None:
    load()
    if not (_limit and _limit[0].n == n):
        _limit[:] = [TbbLimit(_state["tbb"], n)]


def engine_error() -> str:
    """'' when a oneDNN CPU engine (needed by every primitive, e.g. convolution) can be created, else why not."""
    dnnl = load()
    eng = ctypes.c_void_p()
    status = dnnl.dnnl_engine_create(ctypes.byref(eng), DNNL_CPU, ctypes.c_size_t(0))
    if status == DNNL_SUCCESS:
        dnnl.dnnl_engine_destroy(eng)
        return ""
    return f"dnnl_engine_create(dnnl_cpu) failed with status {status}"


def sgemm_call(trans_a: bool, trans_b: bool, m: int, n: int, k: int, a: Addr, lda: int, b: Addr, ldb: int,
               c: Addr, ldc: int) -> Call:
    """dnnl_sgemm(transa, transb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc): the trans flags are C chars,
    passed as 32-bit ints ('N' = 78, 'T' = 84) so the register holds a defined, extended value whatever the
    callee assumes; its dnnl_status_t result is ignored (the arguments are validated before the call exists)."""
    def i64(v: int) -> Const:
        return Const(int(v), "int64")
    flag = {False: Const(ord("N"), "int32"), True: Const(ord("T"), "int32")}
    return Call(SGEMM, (flag[trans_a], flag[trans_b], i64(m), i64(n), i64(k), Const(1.0, "float32"), a, i64(lda),
                        b, i64(ldb), Const(0.0, "float32"), c, i64(ldc)))


def igemm_call(a_dtype: str, trans_a: bool, trans_b: bool, m: int, n: int, k: int, a: Addr, lda: int, b: Addr,
               ldb: int, c: Addr, ldc: int, co: Addr) -> Call | None:
    """C[M×N] int32 = op(A)[M×K] (u8 or s8) · op(B)[K×N] (s8), row-major, no offsets (Kiln folds the zero points into
    the epilogue's addend): dnnl_gemm_{u8,s8}s8s32(transa, transb, 'F', M, N, K, 1, A, lda, 0, B, ldb, 0, 0, C, ldc,
    co) with co → one int32 zero. None for an activation type it has no GEMM for."""
    if a_dtype not in IGEMM:
        return None
    def i64(v: int) -> Const:
        return Const(int(v), "int64")
    flag = {False: Const(ord("N"), "int32"), True: Const(ord("T"), "int32")}
    return Call(IGEMM[a_dtype], (flag[trans_a], flag[trans_b], Const(ord("F"), "int32"),
                                 i64(m), i64(n), i64(k), Const(1.0, "float32"), a, i64(lda), Const(0, "int32"), b,
                                 i64(ldb), Const(0, "int32"), Const(0.0, "float32"), c, i64(ldc), co))
