"""AMX tile kernels (kiln/ukernels/amx.py) called directly, against NumPy with the same rounding: bf16 tdpbf16ps
(products of bf16 values are exact in float32's 24 bits; the sums are compared with a float32 accumulation bound)
and int8 tdpbssd / tdpbsud / tdpbusd / tdpbuud (int32: bit-exact), over several K-step walks (the brgemm strides
that read conv taps and channel blocks in place), MT×NT ∈ {1,2}², partial row counts, accumulate on/off.
Only AMX hosts run them (the process asks for the tile permission itself: kiln/runtime/amx.py); a subprocess
checks that a fresh process needs nothing set up by hand."""
from __future__ import annotations

import ctypes
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest

from kiln.codegen.jit import LoadedObject, emit_object, optimize
from kiln.runtime.amx import ensure, usable
from kiln.target import resolve
from kiln.ukernels.amx import (
    DTYPES,
    PREFETCH_BYTES,
    RELEASE,
    amx_kernel,
    config_bytes,
    config_ir,
    config_name,
    release_ir,
)

HOST = resolve("host")
pytestmark = pytest.mark.skipif(HOST.arch != "x86_64" or not usable(HOST.features), reason="needs AMX")
I64 = ctypes.c_int64
ENTRY_T = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, I64, ctypes.c_void_p, ctypes.c_void_p, I64,
                           I64, I64, I64, I64, I64, I64, ctypes.c_int32)


def load(dtype: str, mt: int, nt: int, mr: int, kb: int | None = None, prefetch: int = PREFETCH_BYTES):
    """The kernel behind an external entry that loads its tile configuration, calls it and releases the tiles."""
    kern = amx_kernel(dtype, mt, nt, mr, kb, prefetch)
    args = ("ptr %a0, ptr %a1, i64 %lda, ptr %b, ptr %c, i64 %ldc, i64 %n2, i64 %s2, i64 %n1, i64 %s1, i64 %n0, "
            "i64 %s0, i32 %acc")
    ir = (config_ir(dtype, mr, kern.kb) + release_ir() + kern.ir_text
          + f"define void @entry({args}) {{\n  call void @{config_name(dtype, mr, kern.kb)}()\n"
          f"  call void @{kern.name}({args})\n  call void @{RELEASE}()\n  ret void\n}}\n")
    code = LoadedObject(emit_object(optimize(ir, HOST), HOST), HOST)
    ensure()
    return kern, code, ENTRY_T(code.address("entry"))


def vnni(b: np.ndarray, pair: int, nt: int) -> np.ndarray:
    """B[K, NT·16] → per K step of KB rows: [KB/P][NT·16][P] (the packing contract), steps contiguous."""
    k, n = b.shape
    return np.ascontiguousarray(b.reshape(k // pair, pair, n).transpose(0, 2, 1))


def operands(dtype: str, rows: int, k: int, n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    if dtype == "bf16":
        return (rng.standard_normal((rows, k)).astype(ml_dtypes.bfloat16),
                rng.standard_normal((k, n)).astype(ml_dtypes.bfloat16))
    lo = {"s": (-128, 128), "u": (0, 256)}
    a = rng.integers(*lo[dtype[0]], size=(rows, k)).astype(np.int8 if dtype[0] == "s" else np.uint8)
    b = rng.integers(*lo[dtype[2]], size=(k, n)).astype(np.int8 if dtype[2] == "s" else np.uint8)
    return a, b


def check(dtype: str, got: np.ndarray, want: np.ndarray, k: int, absprod: np.ndarray) -> None:
    if dtype == "bf16":   # exact products, float32 sums in some order: ≤ K·2⁻²⁴ Σ|a·b|
        bad = np.abs(got - want) > k * 2.0 ** -24 * absprod
        assert not bad.any(), f"{bad.sum()} elements off; worst {np.abs(got - want).max():.3g}"
    else:
        np.testing.assert_array_equal(got, want.astype(np.int64))


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("mt,nt,mr", [(2, 2, 16), (1, 2, 7), (2, 1, 5), (1, 1, 16)])
@pytest.mark.parametrize("prefetch", [PREFETCH_BYTES, 0])
def test_gemm_block(dtype: str, mt: int, nt: int, mr: int, prefetch: int) -> None:
    """A row-major A (lda = K·size, one K axis of K/KB steps), accumulate = 0 then 1; B prefetched ahead (past its
    end: a prefetch never faults) or not."""
    kern, _code, fn = load(dtype, mt, nt, mr, prefetch=prefetch)
    assert ("llvm.prefetch" in kern.ir_text) == bool(prefetch)
    size, pair = DTYPES[dtype][:2]
    steps = 3
    k, rows, n = steps * kern.kb, mt * mr, nt * 16
    a, b = operands(dtype, rows, k, n, seed=mt * 7 + nt * 3 + mr)
    bv = vnni(b, pair, nt)
    c = np.zeros((rows, n), np.float32 if dtype == "bf16" else np.int32)
    a1 = a[mr:] if mt == 2 else a
    fn(a.ctypes.data, a1.ctypes.data, k * size, bv.ctypes.data, c.ctypes.data, n * 4, 1, 0, 1, 0, steps,
       kern.kb * size, 0)
    af, bf = a.astype(np.float64), b.astype(np.float64)
    want = af @ bf
    check(dtype, c, want, k, np.abs(af) @ np.abs(bf))
    fn(a.ctypes.data, a1.ctypes.data, k * size, bv.ctypes.data, c.ctypes.data, n * 4, 1, 0, 1, 0, steps,
       kern.kb * size, 1)
    check(dtype, c, 2 * want, 2 * k, 2 * np.abs(af) @ np.abs(bf))


@pytest.mark.parametrize("dtype", ["bf16", "u8s8"])
def test_conv_walk_in_place(dtype: str) -> None:
    """The three-level K walk a blocked conv uses: A = an NHWC-blocked input x[H, W, CB] read in place, rows =
    output pixels of one row (lda = CB·size), steps over (channel block, kernel row, tap) with their byte strides."""
    kern, _code, fn = load(dtype, 1, 2, 8)
    size, pair = DTYPES[dtype][:2]
    cb, kh, kw, H, W, blocks = kern.kb, 2, 3, 4, 10, 2
    x = operands(dtype, blocks * H * W, cb, 1, seed=5)[0].reshape(blocks, H, W, cb)  # [channel block, H, W, CB]
    w = operands(dtype, 1, blocks * kh * kw * cb, 32, seed=6)[1].reshape(blocks, kh, kw, cb, 32)
    bv = np.stack([vnni(w[i, r, t], pair, 2) for i in range(blocks) for r in range(kh) for t in range(kw)])
    c = np.zeros((8, 32), np.float32 if dtype == "bf16" else np.int32)
    fn(x.ctypes.data, x.ctypes.data, cb * size, bv.ctypes.data, c.ctypes.data, 32 * 4,
       blocks, H * W * cb * size, kh, W * cb * size, kw, cb * size, 0)
    xf, wf = x.astype(np.float64), w.astype(np.float64)
    want = sum(xf[i, r, t:t + 8] @ wf[i, r, t] for i in range(blocks) for r in range(kh) for t in range(kw))
    absprod = sum(np.abs(xf[i, r, t:t + 8]) @ np.abs(wf[i, r, t]) for i in range(blocks) for r in range(kh)
                  for t in range(kw))
    check(dtype, c, want, blocks * kh * kw * cb, absprod)


def test_config_layout() -> None:
    cfg = config_bytes("bf16", 16, 32)
    assert cfg[0] == 1 and len(cfg) == 64
    assert [int.from_bytes(cfg[16 + 2 * t:18 + 2 * t], "little") for t in range(8)] == [64] * 8
    assert list(cfg[48:56]) == [16] * 6 + [16] * 2


def test_fresh_process_gets_permission_automatically() -> None:
    """A bf16 model compiled and run in a new process (no manual arch_prctl): AMX runs, no SIGILL."""
    code = ("import numpy as np, kiln, sys; sys.path.insert(0, 'tests');"
            "from conftest import op_model, rand, C;"
            "m, f = op_model('MatMul', [rand(32, 64), C(rand(64, 32))]);"
            "e = kiln.compile(m, precision='bf16', cache=False, num_threads=2);"
            "y = e.run(f)[0]; r = f['x0'] @ rand(64, 32);"
            "assert e.meta['amx'], e.meta; assert np.abs(y - r).max() < 0.05 * np.abs(r).max(); print('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", (out.returncode, out.stderr[-2000:])


def test_isa_bf16_section() -> None:
    """The ISA report's bf16 rows: Kiln's AMX K loop does 4 tile products per K step (2×2 tiles) and spends
    < 2 instructions per 1000 MACs (tile loads, pointer and counter updates included)."""
    from kiln.isa.bf16 import amx_loop, format_table, table

    n, products, macs = amx_loop()
    assert products % 4 == 0 and products and macs == products * 8192
    assert n / macs < 2e-3, (n, macs)
    rows = {r.instruction: r for r in table()}
    assert rows["tdpbf16ps"].macs_per_cycle == 512 and rows["vdpbf16ps zmm"].macs_per_instruction == 32
    assert "| tdpbf16ps | AMX-BF16 | 8192 |" in format_table(list(rows.values()))
