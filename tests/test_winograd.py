"""Winograd F(2×2, 3×3) convolutions (graph/passes/winograd.py) against onnxruntime.

Every case is a chain (a 1×1 conv, then the 3×3 conv, ReLU or a residual add, so the values between are in the
blocked layout) compared with onnxruntime at 1e-4 relative to the largest |output| (the transforms reorder and
rescale the sums; F(2, 3) adds a few ulps). Shapes: even and odd output sizes (the last tile row / column half
outside), non-square, 'valid' and asymmetric padding, batch 2, a residual epilogue, the microkernel strategy,
and the bounds-checked debug build (the guards of the overhanging tiles). The weight transform is also checked
on its own: G g Gᵀ unpacked back through the transforms equals the direct 3×3 correlation of one tile."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from conftest import check, make_model, rand
from kiln.compiler import lower
from kiln.graph.passes.block_layout import pack_blocked_conv
from kiln.graph.passes.winograd import WEIGHT_CHUNK, G, transform_weights
from kiln.target import resolve

TOL = 1e-4
BT = np.array([[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]], dtype=np.float64)
AT = np.array([[1, 1, 1, 0], [0, 1, -1, -1]], dtype=np.float64)


def _w(co: int, ci: int, k: int, seed: int) -> np.ndarray:
    return rand(co, ci, k, k, seed=seed) * np.float32(np.sqrt(1.0 / (ci * k * k)))


def _chain(n: int, ci: int, co: int, h: int, w: int, pads: list[int], residual: bool):  # noqa: ANN202
    x = rand(n, ci, h, w, seed=1)
    nodes = [helper.make_node("Conv", ["x", "w0"], ["a"]), helper.make_node("Relu", ["a"], ["b"]),
             helper.make_node("Conv", ["b", "w1", "b1"], ["c"], kernel_shape=[3, 3], pads=pads)]
    out = "c"
    if residual:
        nodes += [helper.make_node("Add", ["c", "b"], ["s"]), helper.make_node("Relu", ["s"], ["y"])]
        out = "y"
    consts = {"w0": _w(ci, ci, 1, 2), "w1": _w(co, ci, 3, 3), "b1": rand(co, seed=4)}
    return make_model(nodes, {"x": x}, [out], consts), {"x": x}


def _ops(model, width: str = "host", **options) -> list[str]:  # noqa: ANN001, ANN003
    return [n.op for n in lower(model, resolve(width), 2, options, stop_after="kernels").graph.nodes]


@pytest.mark.parametrize("n,ci,co,h,w,pads,residual", [
    (1, 32, 32, 14, 14, [1, 1, 1, 1], True),
    (1, 32, 48, 7, 9, [1, 1, 1, 1], False),     # odd sizes: the last tile row and column half outside
    (2, 48, 32, 10, 6, [1, 1, 1, 1], False),    # batch 2
    (1, 32, 32, 11, 12, [0, 0, 0, 0], False),   # 'valid': 9×10 outputs
    (1, 32, 32, 9, 8, [0, 1, 1, 0], False),     # asymmetric padding
])
def test_winograd_matches(n: int, ci: int, co: int, h: int, w: int, pads: list[int], residual: bool,
                          width: str) -> None:
    model, feeds = _chain(n, ci, co, h, w, pads, residual)
    ops = _ops(model, width)
    assert ops.count("WinogradProduct") == 1 and "WinogradInput" in ops and "WinogradOutput" in ops, ops
    check(model, feeds, TOL, target=width)


def test_winograd_ukernel_and_switch(width: str) -> None:
    model, feeds = _chain(1, 32, 32, 12, 12, [1, 1, 1, 1], True)
    check(model, feeds, TOL, strategy="ukernel", target=width)
    assert "WinogradProduct" not in _ops(model, width, winograd=False)
    check(model, feeds, TOL, winograd=False, target=width)


def test_winograd_bounds_checked(width: str) -> None:
    model, feeds = _chain(1, 32, 32, 7, 5, [1, 1, 1, 1], True)
    check(model, feeds, TOL, bounds_check=True, target=width)


def test_not_for_other_convs() -> None:
    """Stride 2, 1×1 and depthwise convs, and 3×3 convs with few channels, stay direct convolutions."""
    x = rand(1, 32, 12, 12, seed=1)
    nodes = [helper.make_node("Conv", ["x", "w0"], ["a"]),
             helper.make_node("Conv", ["a", "w1"], ["b"], kernel_shape=[3, 3], pads=[1] * 4, strides=[2, 2]),
             helper.make_node("Conv", ["b", "w2"], ["c"], kernel_shape=[3, 3], pads=[1] * 4, group=32),
             helper.make_node("Conv", ["c", "w3"], ["y"], kernel_shape=[3, 3], pads=[1] * 4)]
    consts = {"w0": _w(32, 32, 1, 2), "w1": _w(32, 32, 3, 3), "w2": _w(32, 1, 3, 4), "w3": _w(16, 32, 3, 5)}
    model = make_model(nodes, {"x": x}, ["y"], consts)
    assert "WinogradProduct" not in _ops(model)
    check(model, {"x": x}, TOL)


@pytest.mark.parametrize("chunk", [WEIGHT_CHUNK, 8 * 16 * 4, 1])  # one step; steps of 4 pairs and a rest of 2; 1
def test_weight_transform_in_chunks(chunk: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """U = G g Gᵀ per (co, ci) pair, straight from the packed layout, however many block pairs a step takes."""
    import kiln.graph.passes.winograd as wg
    monkeypatch.setattr(wg, "WEIGHT_CHUNK", chunk)
    wp = rand(3, 2, 3, 3, 8, 16, seed=8)  # [Co/nr, Ci/cb, 3, 3, cb, nr]: 6 block pairs
    u = transform_weights(wp)
    assert u.shape == (4, 4, 3, 2, 8, 16) and u.dtype == np.float32
    want = np.einsum("ra,oiabcn,sb->rsoicn", G, wp.astype(np.float64), G)
    np.testing.assert_allclose(u, want, rtol=1e-6, atol=1e-7)


def test_weight_transform_is_the_3x3_correlation() -> None:
    """Aᵀ[(G g Gᵀ) ⊙ (Bᵀ d B)]A = the 2×2 correlation outputs of the 4×4 patch d, through the packed layouts."""
    w = rand(32, 16, 3, 3, seed=6).astype(np.float64)
    d = rand(16, 4, 4, seed=7).astype(np.float64)
    u = transform_weights(pack_blocked_conv(w.astype(np.float32), 16, 16, False))  # [4, 4, Co/16, Ci/16, 16, 16]
    u = u.transpose(0, 1, 2, 5, 3, 4).reshape(4, 4, 32, 16).astype(np.float64)  # [r, c, co, ci]
    v = np.einsum("ra,iab,cb->rci", BT, d, BT)
    y = np.einsum("ir,rco,jc->oij", AT, np.einsum("rcoi,rci->rco", u, v), AT)
    direct = np.array([[[np.sum(w[o, :, :, :] * d[:, i:i + 3, j:j + 3]) for j in range(2)] for i in range(2)]
                       for o in range(32)])
    np.testing.assert_allclose(y, direct, rtol=1e-5, atol=1e-5)
    assert G.shape == (4, 3)
