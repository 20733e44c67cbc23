"""The row-tile pack of the direct GEMM schedule (Ap[tile, k, r] = A[tile·MR + r, k]), vectorized along k with
the MR rows' stores emitted as one in-register transpose (codegen/kernel.py `interleave`): every MR, both
vector widths, a K with a masked tail, and a last row tile that repeats row M−1.

Tolerance: 1e-4 relative to the largest |output| (sums in another order than onnxruntime's)."""
from __future__ import annotations

import pytest

from conftest import C, check, op_model, rand
from kiln.compiler import lower
from kiln.target import resolve

TOL = 1e-4


@pytest.mark.parametrize("target", ["host", "avx2"])
@pytest.mark.parametrize("m,k,n", [(64, 1024, 96), (130, 1024, 40), (29, 1026, 33), (200, 2048, 64), (96, 4096, 48)])
def test_packed_rows_match(target: str, m: int, k: int, n: int) -> None:
    if target == "host" and "avx512f" not in resolve("host").features:
        pytest.skip("host has no AVX-512")
    model, feeds = op_model("MatMul", [rand(m, k, seed=1), C(rand(k, n, seed=2))])
    low = lower(model, resolve(target), 2, {}, stop_after="llvm")
    # the pack is there and it is a transpose, not lane-by-lane scatters
    assert any(b.name.endswith("p0") for kk in low.program.kernels for b in kk.scratch), "no row pack at this K"
    assert "masked.scatter" not in low.llvm_ir and "masked.gather" not in low.llvm_ir
    if target == "host":
        check(model, feeds, TOL)
    else:
        check(model, feeds, TOL, target="avx2")
