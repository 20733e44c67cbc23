"""OpenBLAS from the `scipy-openblas32` wheel: its symbols carry a `scipy_` prefix (`scipy_cblas_sgemm`) so that
it never clashes with another BLAS in the process (numpy bundles scipy-openblas64, whose symbols end in `64_`).

Threads: OpenBLAS' own pthread pool, sized by `scipy_openblas_set_num_threads` (process-wide), with its default
spin-then-sleep (OPENBLAS_THREAD_TIMEOUT, 2^28 cycles): a shorter spin (2^20, about Kiln's pool's) helped a lone
conv (median 25–28 → 10–16 ms) but hurt resnet18 (282–400 → 385–465 ms) on the loaded host, so it is left alone."""
from __future__ import annotations

import ctypes
from pathlib import Path

from kiln.kernel.ir import Addr, Call, Const

NAME = "openblas"
WHEEL = "scipy-openblas32"
SGEMM = "scipy_cblas_sgemm"
SYMBOLS = (SGEMM,)
CBLAS_ROW_MAJOR, CBLAS_NO_TRANS, CBLAS_TRANS = 101, 111, 112

_lib: ctypes.CDLL | None = None


def load() -> ctypes.CDLL:
    """dlopen libscipy_openblas once; OSError when the wheel is missing or broken."""
    global _lib
    if _lib is None:
        try:
            import scipy_openblas32
        except ImportError as e:
            raise OSError(f"cannot import scipy_openblas32 ({e})") from e
        lib_dir = Path(scipy_openblas32.get_lib_dir())
        lib = ctypes.CDLL(str(lib_dir / scipy_openblas32.get_library(True)))
        lib.scipy_openblas_set_num_threads.argtypes = [ctypes.c_int]
        lib.scipy_openblas_get_num_threads.restype = ctypes.c_int
        _lib = lib
    return _lib


def set_threads(n: int) -> None:
    lib = load()
    lib.scipy_openblas_set_num_threads(n)


def sgemm_call(trans_a: bool, trans_b: bool, m: int, n: int, k: int, a: Addr, lda: int, b: Addr, ldb: int,
               c: Addr, ldc: int) -> Call:
    """C[m×n] = op(A) · op(B), row-major: cblas_sgemm(order, transA, transB, M, N, K, alpha, A, lda, B, ldb, beta,
    C, ldc) with 32-bit ints (the LP64 interface)."""
    return cblas_sgemm(SGEMM, trans_a, trans_b, m, n, k, a, lda, b, ldb, c, ldc)


def cblas_sgemm(fn: str, trans_a: bool, trans_b: bool, m: int, n: int, k: int, a: Addr, lda: int, b: Addr, ldb: int,
                c: Addr, ldc: int) -> Call:
    def i32(v: int) -> Const:
        return Const(int(v), "int32")
    flag = {False: CBLAS_NO_TRANS, True: CBLAS_TRANS}
    return Call(fn, (i32(CBLAS_ROW_MAJOR), i32(flag[trans_a]), i32(flag[trans_b]), i32(m), i32(n), i32(k),
                     Const(1.0, "float32"), a, i32(lda), b, i32(ldb), Const(0.0, "float32"), c, i32(ldc)))
