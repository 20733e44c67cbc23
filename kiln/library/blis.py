"""BLIS from the `blis` wheel: `bli_sgemm`, BLIS's typed API, exported by the wheel's Cython extension.

The wheel (explosion/cython-blis) is "a self-contained C-extension": no libblis.so, but its extension module
`blis/cy.*.so` links BLIS 0.7.0 in and exports every `bli_*` symbol dynamically, so it is dlopened like any
library. It has no BLAS or CBLAS layer (`bli_info_get_enable_cblas() == 0`); the typed API takes general strides
(row and column stride per operand), so a transposed operand is just swapped strides, and alpha/beta by pointer.

    void bli_sgemm(trans_t transa, trans_t transb, dim_t m, dim_t n, dim_t k, float* alpha,
                   float* a, inc_t rs_a, inc_t cs_a, float* b, inc_t rs_b, inc_t cs_b,
                   float* beta, float* c, inc_t rs_c, inc_t cs_c)     (dim_t, inc_t: int64; trans_t: int)

Threads: this build has none (`bli_info_get_enable_threading() == 0`: neither pthreads nor OpenMP), so
`THREADED = False` and the library strategy splits N into one column slab per thread inside Kiln's own parallel
loop — the partitioning BLIS's jc loop would do. Kernel: BLIS picks its micro-kernels from the CPU at first use;
on the Intel AVX-512 host this is `haswell` (the AVX2 6×16 kernel): BLIS 0.7.0 takes the `skx` kernels only for
CPU models it knows to have two AVX-512 FMA units (`arch()` reports the choice)."""
from __future__ import annotations

import ctypes
import importlib.util

from kiln.kernel.ir import Addr, Alloc, Call, Const, Expr, Stmt, Store

NAME = "blis"
WHEEL = "blis"
SGEMM = "bli_sgemm"
SYMBOLS = (SGEMM,)
THREADED = False          # BLIS runs on the calling thread: Kiln parallelizes over column slabs
BLIS_NO_TRANSPOSE = 0

_lib: ctypes.CDLL | None = None


def load() -> ctypes.CDLL:
    """dlopen the wheel's extension module once; OSError when the wheel is missing or exports no bli_sgemm."""
    global _lib
    if _lib is None:
        try:
            spec = importlib.util.find_spec("blis.cy")
        except ModuleNotFoundError:  # no blis package at all
            spec = None
        if spec is None or not spec.origin:
            raise OSError("cannot find the blis wheel's extension module blis.cy")
        lib = ctypes.CDLL(spec.origin)
        if not hasattr(lib, SGEMM):
            raise OSError(f"{spec.origin} exports no {SGEMM}")
        i64, p = ctypes.c_int64, ctypes.c_void_p
        lib.bli_sgemm.argtypes = [ctypes.c_int, ctypes.c_int, i64, i64, i64, p, p, i64, i64, p, i64, i64, p, p,
                                  i64, i64]
        lib.bli_sgemm.restype = None
        lib.bli_info_get_version_str.restype = ctypes.c_char_p
        lib.bli_arch_string.restype = ctypes.c_char_p
        _lib = lib
    return _lib


def version() -> str:
    return load().bli_info_get_version_str().decode()


def arch() -> str:
    """The configuration (micro-kernel set) BLIS chose for this CPU, e.g. 'haswell', 'skx', 'zen3'."""
    lib = load()
    return lib.bli_arch_string(lib.bli_arch_query_id()).decode()


def set_threads(n: int) -> None:
    """Nothing to set: the build is single-threaded (see THREADED)."""
    load()


def _strides(trans: bool, ld: int) -> tuple[Const, Const]:
    """(row stride, column stride) of a row-major matrix, or of one stored transposed."""
    rs, cs = (1, ld) if trans else (ld, 1)
    return Const(rs, "int64"), Const(cs, "int64")


def sgemm_call(trans_a: bool, trans_b: bool, m: int | Expr, n: int | Expr, k: int | Expr, a: Addr, lda: int,
               b: Addr, ldb: int, c: Addr, ldc: int, scalars: str = "blis_alpha_beta") -> list[Stmt]:
    """C[m×n] = op(A) · op(B) as bli_sgemm with general strides: alpha = 1 and beta = 0 live in a two-float stack
    buffer `scalars` (BLIS takes them by pointer)."""
    def i64(v: int | Expr) -> Expr:
        return v if isinstance(v, Expr) else Const(int(v), "int64")
    zero, one = Const(0, "int64"), Const(1, "int64")
    no = Const(BLIS_NO_TRANSPOSE, "int32")
    call = Call(SGEMM, (no, no, i64(m), i64(n), i64(k), Addr(scalars, (zero,)), a, *_strides(trans_a, lda),
                        b, *_strides(trans_b, ldb), Addr(scalars, (one,)), c, *_strides(False, ldc)))
    return [Alloc(scalars, "float32", (2,)), Store(scalars, (zero,), Const(1.0, "float32")),
            Store(scalars, (one,), Const(0.0, "float32")), call]
