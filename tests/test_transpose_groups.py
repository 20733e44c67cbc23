"""Transposed access groups (codegen/transpose.py), against onnxruntime:
  * the row-tile pack of the direct GEMM schedule (Ap[tile, k, r] = A[tile·MR + r, k]), vectorized along k, its
    MR rows' stores one in-register transpose: every MR, both vector widths, a K with a masked tail, and a last
    row tile that repeats row M−1;
  * NCHW convolutions tiled over output channels (vectors) × pixels (unrolled): each channel's pixels stored as
    one short run, and a fused residual read the same way — no scatters, no gathers, also in the edge tile,
    whose rows past the last pixel are masked off.

Tolerance: 1e-4 relative to the largest |output| (sums in another order than onnxruntime's)."""
from __future__ import annotations

import pytest
from onnx import helper

from conftest import C, check, make_model, op_model, rand
from kiln.compiler import lower
from kiln.schedule import pack
from kiln.target import resolve

TOL = 1e-4


@pytest.mark.parametrize("m,k,n", [(64, 1024, 96), (130, 1024, 40), (29, 1026, 33), (200, 2048, 64), (96, 4096, 48)])
def test_packed_rows_match(width: str, m: int, k: int, n: int, monkeypatch: pytest.MonkeyPatch) -> None:
    # the pack taken whatever the L1 heuristic says of this MR (SSE's 4-row tiles do not crowd a set): it is the
    # pack's code that is under test, for every width
    monkeypatch.setattr(pack, "rows_alias", lambda *_: True)
    model, feeds = op_model("MatMul", [rand(m, k, seed=1), C(rand(k, n, seed=2))])
    low = lower(model, resolve(width), 2, {}, stop_after="llvm")
    # the pack is there and it is a transpose, not lane-by-lane scatters
    assert any(b.name.endswith("p0") for kk in low.program.kernels for b in kk.scratch), "no row pack at this K"
    assert "masked.scatter" not in low.llvm_ir and "masked.gather" not in low.llvm_ir
    check(model, feeds, TOL, target=width)


# 9×23: the pixels do not divide into tiles — the edge tile's guarded rows are runs masked to the rows left
@pytest.mark.parametrize("h,w,residual", [(14, 14, True), (9, 23, True), (28, 28, False)])
def test_conv_tile_stores_and_residual_reads_are_transposed(h: int, w: int, residual: bool, width: str) -> None:
    x, r = rand(1, 32, h, w, seed=1), rand(1, 64, h, w, seed=4)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["y"], pads=[1, 1, 1, 1])]
    out = "y"
    if residual:
        nodes += [helper.make_node("Add", ["y", "r"], ["s"]), helper.make_node("Relu", ["s"], ["z"])]
        out = "z"
    feeds = {"x": x, "r": r} if residual else {"x": x}
    model = make_model(nodes, feeds, [out], {"w": rand(64, 32, 3, 3, seed=2), "b": rand(64, seed=3)})
    # NCHW in and out (the blocked layout, graph/passes/block_layout.py, would take this conv into blocks)
    low = lower(model, resolve(width), 2, {"block_layout": False}, stop_after="llvm")
    assert any(n.op == "PackedConv" for n in low.graph.nodes)
    assert "masked.scatter" not in low.llvm_ir and "masked.gather" not in low.llvm_ir
    check(model, feeds, TOL, block_layout=False, target=width)
    check(model, feeds, TOL, target=width)
