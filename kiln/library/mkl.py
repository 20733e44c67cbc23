"""Intel oneMKL from the `mkl` wheel: `cblas_sgemm` of `libmkl_rt` (LP64 interface: 32-bit ints), and for the integer
anchors `cblas_gemm_s8u8s32`, which row-major takes u8 A (the activations) and s8 B (checked against NumPy in the
tests); s8 activations have no MKL GEMM (its other integer GEMM is s16).

Threads: the GNU OpenMP threading layer (MKL_THREADING_LAYER=GNU, read by libmkl_rt at its first call: the
Intel layer's libiomp5 misbehaves once another libgomp is in the global scope, see kiln/bench/peers/mkl.py),
`MKL_Set_Dynamic(0)` so MKL does not pick fewer threads on its own, `MKL_Set_Num_Threads(n)` (process-wide);
binding checks MKL really runs `n` threads, since a threading layer that fails to load falls back to
sequential silently. libgomp's idle team spins GOMP_SPINCOUNT iterations (one `pause` each) before sleeping;
unless the environment says otherwise `load()` sets 20000, what Kiln's own pool spins (kiln/runtime/
threadpool.py SPINS), so MKL's team does not hold the cores Kiln's next loop needs. Measured on the loaded host,
against libgomp's default 300000: conv_r50_3x3 median 52–56 → 18 ms, resnet18 249–323 → 55–154 ms. Both
settings only take effect if libgomp is not loaded yet."""
from __future__ import annotations

import ctypes
import os

from kiln.kernel.ir import Addr, Call, Const
from kiln.library._load import prefix_lib
from kiln.library.openblas import cblas_sgemm

NAME = "mkl"
WHEEL = "mkl"
SGEMM = "cblas_sgemm"
IGEMM = {"uint8": "cblas_gemm_s8u8s32"}
SYMBOLS = (SGEMM, *IGEMM.values())
ROW_MAJOR, NO_TRANS, TRANS, FIX_OFFSET = 101, 111, 112, 173   # CBLAS_LAYOUT, CBLAS_TRANSPOSE, CBLAS_OFFSET
GOMP_SPINCOUNT = 20000

_lib: ctypes.CDLL | None = None


def load() -> ctypes.CDLL:
    """dlopen libmkl_rt once, choosing the threading layer first; OSError when the wheel is missing."""
    global _lib
    if _lib is None:
        path = prefix_lib("libmkl_rt.so", "libmkl_rt.so.3", "libmkl_rt.so.2")
        if path is None:
            raise OSError("libmkl_rt.so not found in the interpreter's lib dir")
        os.environ.setdefault("MKL_THREADING_LAYER", "GNU")
        os.environ.setdefault("GOMP_SPINCOUNT", str(GOMP_SPINCOUNT))  # read by libgomp when it loads
        lib = ctypes.CDLL(str(path))
        lib.MKL_Set_Num_Threads.argtypes = [ctypes.c_int]
        lib.MKL_Set_Dynamic.argtypes = [ctypes.c_int]
        lib.MKL_Get_Max_Threads.restype = ctypes.c_int
        _lib = lib
    return _lib


def set_threads(n: int) -> None:
    lib = load()
    lib.MKL_Set_Dynamic(0)
    lib.MKL_Set_Num_Threads(n)
    got = lib.MKL_Get_Max_Threads()
    if got != n:
        raise OSError(f"MKL runs {got} threads, not {n} (its threading layer did not load: sequential fallback; "
                      f"MKL_THREADING_LAYER={os.environ.get('MKL_THREADING_LAYER')})")


def sgemm_call(trans_a: bool, trans_b: bool, m: int, n: int, k: int, a: Addr, lda: int, b: Addr, ldb: int,
               c: Addr, ldc: int) -> Call:
    return cblas_sgemm(SGEMM, trans_a, trans_b, m, n, k, a, lda, b, ldb, c, ldc)


def igemm_call(a_dtype: str, trans_a: bool, trans_b: bool, m: int, n: int, k: int, a: Addr, lda: int, b: Addr,
               ldb: int, c: Addr, ldc: int, co: Addr) -> Call | None:
    """C[M×N] int32 = op(A)[M×K] u8 · op(B)[K×N] s8, row-major, no offsets: cblas_gemm_s8u8s32(RowMajor, transa,
    transb, FixOffset, M, N, K, 1, A, lda, 0, B, ldb, 0, 0, C, ldc, co → one int32 zero); None for s8 activations."""
    if a_dtype not in IGEMM:
        return None
    def i32(v: int) -> Const:
        return Const(int(v), "int32")
    trans = {False: i32(NO_TRANS), True: i32(TRANS)}
    return Call(IGEMM[a_dtype], (i32(ROW_MAJOR), trans[trans_a], trans[trans_b], i32(FIX_OFFSET), i32(m), i32(n),
                                 i32(k), Const(1.0, "float32"), a, i32(lda), i32(0), b, i32(ldb), i32(0),
                                 Const(0.0, "float32"), c, i32(ldc), co))
