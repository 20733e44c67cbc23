"""precision="bf16" (graph/passes/precision.py, kiln/schedule/amx.py): anchors multiply bfloat16 operands with float32
accumulation. Every test runs per x86 width: avx512 takes the AMX tiles where the process may use AMX
(exe.meta["precision"] says "amx"), else AVX512_BF16 `vdpbf16ps` where the CPU has it ("avx512bf16": weights in
VNNI pairs; MatMuls of two activations stay emulated there), avx2/sse the emulation (bf16 storage, float32
multiply-adds: "emulated").

Two references per output, both in float64:
  * exact:  the same products on operands rounded to bf16 (nearest even, ml_dtypes) — Kiln differs from it only by
            float32 accumulation order, so |kiln − exact| ≤ K·2⁻²⁴ · (|x|∘|w|) elementwise (|x|∘|w| the op applied to
            the absolute rounded operands: Σ|x_k w_k| per output) plus 2⁻²⁴|bias|. A truncating conversion, a wrong
            VNNI pair or a dropped K step is off by ≥ 2⁻⁹ relative and fails this.
  * fp32:   the op on the unrounded operands. bf16 keeps 8 significant bits (unit roundoff u = 2⁻⁸); each operand's
            rounding is ≤ u relative, a product's ≤ 2u + u², so |kiln − fp32| ≤ (2u + u²)·(|x|∘|w|) + the float32
            term above — the stated bf16 tolerance, elementwise. For random signs Σ|x_k w_k| ≈ √K·|y|, i.e. the
            relative error grows ∝ √K·2⁻⁸ in the worst case; the tests also report the typical max-relative error.
"""
from __future__ import annotations

import re

import ml_dtypes
import numpy as np
import onnx
import pytest
import torch
from onnx import helper

import kiln
from conftest import C, make_model, op_model, rand, run_kiln, run_ort
from kiln.codegen.dpbf16 import dpbf16_widths
from kiln.compiler import check_options, finish_cache_writes, lower
from kiln.graph.passes.pack_weights import MIN_N
from kiln.graph.passes.precision import bf16_dot_product, pairs_only
from kiln.runtime.amx import usable
from kiln.target import resolve

# where a width has no bf16 dot product Kiln keeps the anchors float32 (graph/passes/precision.py, switch
# native_bf16_only): these tests check the emulation there instead; test_no_bf16_dot_product_runs_float32 the default
EMULATE = {"native_bf16_only": False}
U = 2.0 ** -8        # bf16 unit roundoff (8 significant bits, round to nearest even)
F32 = 2.0 ** -24     # float32 unit roundoff


def bf16(a: np.ndarray) -> np.ndarray:
    return np.asarray(a, np.float32).astype(ml_dtypes.bfloat16).astype(np.float64)


def expected_path(width: str) -> str:
    """How a weight anchor (B packed in VNNI pairs at compile time) runs for `width` on this host."""
    t = resolve(width)
    if usable(t.features):
        return "amx"
    return "avx512bf16" if dpbf16_widths(t) else "emulated"


def untaken_path(width: str, amx_takes: bool = True) -> str:
    """How an anchor the vdpbf16ps tile cannot take runs — a MatMul of two activations or with a B too narrow to
    pack (AMX packs B into VNNI panels inside the kernel: `amx_takes`), a conv on an NCHW input: on AMX if it takes
    it; else float32 where vdpbf16ps is the only bf16 dot product (passes/precision.py pairs_only); else emulated."""
    t = resolve(width)
    if amx_takes and usable(t.features):
        return "amx"
    return "fp32" if pairs_only(t) else "emulated"


def activation_path(width: str) -> str:
    return untaken_path(width, amx_takes=True)


BT_ROWS = ((0, 2, -1.0), (1, 2, 1.0), (2, 1, -1.0), (1, 3, -1.0))  # Bᵀ row r: f(i) + s·f(j) (kernel/lower_winograd)
BT = np.array([[1.0 if a == i else s if a == j else 0.0 for a in range(4)] for i, j, s in BT_ROWS])
AT = np.array([[1.0, 1, 1, 0], [0, 1, -1, -1]])
G = np.array([[1, 0, 0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0, 0, 1]])


def winograd_bf16(x: np.ndarray, w: np.ndarray, pad: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The references of a bf16 Winograd F(2×2, 3×3) conv (graph/passes/winograd.py on a `pairs_only` target):
    V = Bᵀ d B summed in float32 in the kernel's order (each step one two-term add, so rounded as Kiln rounds it),
    then to bf16; U = G g Gᵀ in float64, to float32, to bf16; in float64 M = Σ_ci V·U and y = Aᵀ M A. Returns
    (exact — Kiln differs from it by its float32 sums of M and of the output transform; absprod = |Aᵀ|(Σ_ci |V||U|)|A|,
    what bf16's rounding of V and U scales with; vterm = |Aᵀ|(Σ_ci (|Bᵀ||d||B|)·|U|)|A|, what V's float32 sums' error
    scales with when they cancel)."""
    n, ci, h, wd = x.shape
    oh, ow = h + 2 * pad - 2, wd + 2 * pad - 2
    th, tw = -(-oh // 2), -(-ow // 2)
    xp = np.zeros((n, ci, 2 * th + 2, 2 * tw + 2), np.float32)
    xp[:, :, pad:pad + h, pad:pad + wd] = x[:, :, :2 * th + 2 - pad, :2 * tw + 2 - pad]
    d = np.stack([np.stack([xp[:, :, a:a + 2 * th:2, b:b + 2 * tw:2] for b in range(4)], -1) for a in range(4)], -2)
    t = np.stack([d[..., i] + np.float32(sg) * d[..., j] for i, j, sg in BT_ROWS], -1)       # t[.., a, c]
    v = np.stack([t[..., i, :] + np.float32(sg) * t[..., j, :] for i, j, sg in BT_ROWS], -2)  # V[.., r, c]
    absd = np.einsum("ra,...ab,cb->...rc", np.abs(BT), np.abs(d.astype(np.float64)), np.abs(BT))
    ub = bf16(np.einsum("ra,oiab,cb->oirc", G, w.astype(np.float64), G).astype(np.float32))
    vb = bf16(v)

    def out(vv: np.ndarray, uu: np.ndarray, a: np.ndarray) -> np.ndarray:
        m = np.einsum("nipqrc,oirc->nopqrc", vv, uu)
        y = np.einsum("xr,nopqrc,zc->nopxqz", a, m, a).reshape(n, uu.shape[0], 2 * th, 2 * tw)
        return y[:, :, :oh, :ow]
    return out(vb, ub, AT), out(np.abs(vb), np.abs(ub), np.abs(AT)), out(absd, np.abs(ub), np.abs(AT))


def takes_winograd(width: str, ci: int, co: int, k: int, s: int) -> bool:
    """Does a bf16 conv run as Winograd at `width` (graph/passes/winograd.py: 3×3 stride 1, ≥ 32 channels each
    side, a target whose one bf16 dot product is vdpbf16ps)?"""
    return pairs_only(resolve(width)) and k == 3 and s == 1 and ci >= 32 and co >= 32


def check_bf16(model: onnx.ModelProto, feeds: dict[str, np.ndarray], op, K: int, width: str,
               bias: np.ndarray | None = None, paths: set[str] | None = None, winograd_pad: int | None = None) -> dict:
    """Compile with precision="bf16" for `width`, compare with both references (module docstring). `op(x, w)` is
    the anchor in float64 on the given operands (x the input feed, w the model's weight initializer). With
    `winograd_pad` the conv is a bf16 Winograd one (3×3, that padding): its references are winograd_bf16's, the
    float32 sums K + 9 terms long (M's, then the output transform's)."""
    got = run_kiln(model, feeds, target=width, precision="bf16", **EMULATE)
    if got is None:
        return {}
    (x,) = feeds.values()
    w = onnx.numpy_helper.to_array(next(i for i in model.graph.initializer if i.name == "c1"))
    b = 0.0 if bias is None else bias.astype(np.float64)
    exact = op(bf16(x), bf16(w)) + b
    absprod = op(np.abs(bf16(x)), np.abs(bf16(w)))
    fp32 = op(x.astype(np.float64), w.astype(np.float64)) + b
    vterm = 0.0
    if winograd_pad is not None:
        exact, absprod, vterm = winograd_bf16(x, w, winograd_pad)
        exact, K = exact + b, K + 9
    y = got[0].astype(np.float64)
    assert got[0].dtype == np.float32 and y.shape == exact.shape
    want_paths = paths or {expected_path(width)}
    if want_paths == {"fp32"}:  # kept float32 (module docstring of passes/precision.py): float32 accuracy
        bound = K * F32 * op(np.abs(x.astype(np.float64)), np.abs(w.astype(np.float64))) + F32 * np.abs(b) + 1e-30
        assert (np.abs(y - fp32) <= 4 * bound).all(), np.abs(y - fp32).max()
        exe = kiln.compile(model, target=width, precision="bf16", **EMULATE, num_threads=2)
        assert set(exe.meta["precision"].values()) == want_paths, exe.meta["precision"]
        return exe.meta
    acc = K * F32 * absprod + F32 * np.abs(b) + 1e-30
    bad = np.abs(y - exact) > acc
    acc = acc + 4 * F32 * vterm  # (vs float32: V's own float32 sums, which the exact reference repeats)
    assert not bad.any(), (f"{bad.sum()} of {y.size} differ from the bf16-rounded reference beyond float32 "
                           f"accumulation; worst {np.abs(y - exact).max():.3g}")
    bound = (2 * U + U * U) * absprod + acc
    assert (np.abs(y - fp32) <= bound).all(), "beyond the bf16 error bound vs float32"
    # the fp32 reference is onnxruntime's too (the model means what the float64 op says)
    np.testing.assert_allclose(run_ort(model, feeds)[0], fp32, rtol=1e-4, atol=1e-4 * np.abs(fp32).max())
    exe = kiln.compile(model, target=width, precision="bf16", **EMULATE, num_threads=2)
    assert set(exe.meta["precision"].values()) == (paths or {expected_path(width)}), exe.meta["precision"]
    assert exe.meta["amx"] == ("amx" in exe.meta["precision"].values())
    assert any("winogradproduct" in k for k in exe.meta["kernels"]) == (winograd_pad is not None), exe.meta["kernels"]
    return exe.meta


def matmul(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    return x @ w


@pytest.mark.parametrize("shape", [(64, 64, 64), (37, 96, 50), (5, 40, 48), (2, 24, 160, 48), (1, 40, 17)],
                         ids=["64x64x64", "ragged", "K40", "batched", "narrow"])
def test_matmul(width: str, shape: tuple[int, ...]) -> None:
    *m, k, n = shape
    x, w = rand(*m, k, seed=1), rand(k, n, seed=2)
    model, feeds = op_model("MatMul", [x, C(w)])
    # B narrower than 32 columns is not packed (graph/passes/pack_weights.py MIN_N): a plain bf16 MatMul, whose B
    # the AMX schedule packs into VNNI panels at run time (one 16-column tile: kiln/schedule/amx.py _pack_b), and
    # without AMX it is emulated
    check_bf16(model, feeds, matmul, k, width, paths={activation_path(width)} if n < MIN_N else None)


ACTIVATION_MATMULS = {  # name: (A shape, B shape)
    "scores": ((1, 4, 128, 64), (1, 4, 64, 128)),     # attention Q·Kᵀ (BERT-base head size, sequence 128)
    "context": ((1, 4, 128, 128), (1, 4, 128, 64)),   # attention P·V
    "ragged": ((37, 40), (40, 50)),                   # K, N and M off every tile size: zero-padded panels, edge rows
    "broadcast": ((2, 3, 20, 24), (3, 24, 17)),       # B broadcast over the leading batch axis, N < 32
    "narrow": ((9, 72), (72, 8)),                     # one 16-column panel, half of it padding
}


@pytest.mark.parametrize("name", ACTIVATION_MATMULS)
def test_activation_matmul(width: str, name: str) -> None:
    """MatMul of two activations (attention): B is packed into VNNI panels inside the kernel (kiln/schedule/amx.py
    _pack_b), so it runs on AMX like a weight GEMM. The references and bounds of the module docstring (K ≤ 128:
    the bf16 bound vs float32 is (2u + u²)·Σ|a·b| per output, typically ≈ 2u·√K relative)."""
    sa, sb = ACTIVATION_MATMULS[name]
    x, y = rand(*sa, seed=31), rand(*sb, seed=32)
    model, feeds = op_model("MatMul", [x, y])
    got = run_kiln(model, feeds, target=width, precision="bf16", **EMULATE)
    if got is None:
        return
    K = sa[-1]
    exact, absprod = bf16(x) @ bf16(y), np.abs(bf16(x)) @ np.abs(bf16(y))
    fp32 = x.astype(np.float64) @ y.astype(np.float64)
    out = got[0].astype(np.float64)
    exe = kiln.compile(model, target=width, precision="bf16", **EMULATE, num_threads=2)
    assert exe.meta["precision"] == {"matmul_node": activation_path(width)}
    if activation_path(width) == "fp32":  # kept float32: float32 accuracy
        bound = K * F32 * (np.abs(x.astype(np.float64)) @ np.abs(y.astype(np.float64)))
        assert (np.abs(out - fp32) <= 4 * bound + 1e-30).all(), np.abs(out - fp32).max()
        return
    acc = K * F32 * absprod + 1e-30
    assert (np.abs(out - exact) <= acc).all(), np.abs(out - exact).max()
    assert (np.abs(out - fp32) <= (2 * U + U * U) * absprod + acc).all(), "beyond the bf16 error bound vs float32"
    ort = run_ort(model, feeds)[0]  # the float32 reference is onnxruntime's too
    np.testing.assert_allclose(ort, fp32, rtol=1e-4, atol=1e-4 * np.abs(fp32).max())
    assert not np.array_equal(got[0], ort)  # it did round to bf16


def test_gemm_trans_b_bias(width: str) -> None:
    x, w, b = rand(33, 72, seed=3), rand(72, 40, seed=4), rand(40, seed=5)
    model, feeds = op_model("Gemm", [x, C(np.ascontiguousarray(w.T)), C(b)], {"transB": 1})
    check_bf16(model, feeds, lambda a, wt: a @ wt.T, 72, width, bias=b)


def conv(stride: int = 1, pad: int = 0, group: int = 1):
    def op(x: np.ndarray, w: np.ndarray) -> np.ndarray:
        y = torch.nn.functional.conv2d(torch.from_numpy(x), torch.from_numpy(w), stride=stride, padding=pad,
                                       groups=group)
        return y.numpy()
    return op


CONVS = {  # name: (N, Ci, H, W, Co, k, stride, pad)
    "1x1": (1, 256, 7, 7, 64, 1, 1, 0),
    "3x3": (1, 32, 12, 12, 48, 3, 1, 1),
    "3x3-s2": (1, 32, 15, 15, 64, 3, 2, 1),
    "7x7-s2-rgb": (1, 3, 32, 32, 32, 7, 2, 3),    # NCHW input and output (the stem alone): see below
    "3x3-batch2": (2, 64, 9, 9, 32, 3, 1, 0),
    # 1.2 MB of bf16 weights (over half of L2) and 61 rows (a block of 32 + edge tiles of 16 and 13): one pass over
    # B, each work item a panel with all its rows (kiln/schedule/amx.py)
    "3x3-7x7-wide": (1, 256, 7, 7, 256, 3, 1, 1),
}


@pytest.mark.parametrize("name", CONVS)
def test_conv(width: str, name: str) -> None:
    n, ci, h, w_, co, k, s, p = CONVS[name]
    x, w, b = rand(n, ci, h, w_, seed=6), rand(co, ci, k, k, seed=7, lo=-0.5, hi=0.5), rand(co, seed=8)
    model, feeds = op_model("Conv", [x, C(w), C(b)], {"strides": [s, s], "pads": [p] * 4})
    # a conv whose output stays NCHW (a short reduction, < 256, with a graph output: block_layout keeps it plain)
    # would store its AMX C block transposed: it runs the emulated direct kernel (kiln/schedule/amx.py)
    paths = {untaken_path(width, amx_takes=False)} if ci * k * k < 256 else None
    if pads_to_pairs(width, ci):
        paths = {"avx512bf16"}
    pad = p if takes_winograd(width, ci, co, k, s) else None
    check_bf16(model, feeds, conv(s, p), ci * k * k, width, bias=b.reshape(-1, 1, 1), paths=paths, winograd_pad=pad)


def pads_to_pairs(width: str, ci: int) -> bool:
    """Does a bf16 conv on `ci` input channels read them padded to blocks of 4 at `width` (a few channels no float
    block divides, on a target whose one bf16 dot product is vdpbf16ps: graph/passes/pad_pair_channels.py)?"""
    return pairs_only(resolve(width)) and ci < 8


def test_pair_pad_follows_block_layout() -> None:
    """The channel pad is for the blocked pair tile: with the switch `block_layout` off (`kiln bench --ablate`) the
    pass leaves the conv as it was. On an avx512 target with AVX512_BF16 and without AMX, whatever this host is."""
    import dataclasses

    from kiln.frontend.onnx import import_onnx
    from kiln.graph.passes.pad_pair_channels import pad_pair_channels
    from kiln.graph.passes.precision import assign_precision
    from kiln.target import AMX_FEATURES, with_features

    t = with_features(resolve("avx512"), "avx512bf16")
    t = dataclasses.replace(t, features=",".join(f for f in t.features.split(",") if f[1:] not in AMX_FEATURES))
    assert pairs_only(t)
    for blocked in (True, False):
        model, _ = op_model("Conv", [rand(1, 3, 9, 9), C(rand(8, 3, 3, 3))], {"strides": [2, 2]})
        g = pad_pair_channels(assign_precision(import_onnx(model), "bf16"), t, {"block_layout": blocked})
        assert [n.op for n in g.nodes] == (["Pad", "Conv"] if blocked else ["Conv"])
        assert g.nodes[-1].inputs[1].shape == ((8, 4, 3, 3) if blocked else (8, 3, 3, 3))


@pytest.mark.parametrize("ci", [1, 3, 5])
def test_few_channels_padded_to_pairs(width: str, ci: int) -> None:
    """A stem-like 3×3/2 conv on 1, 3 or 5 input channels: where vdpbf16ps is the only bf16 dot product, its input
    is padded with zero channels to a multiple of 4, reordered into blocks of 4 and taken by the pair tile
    ("avx512bf16"; 5 channels: two blocks, 3 zero channels), against the bf16 references; elsewhere it is left as
    it was (no pad in the graph)."""
    x, w, b = rand(1, ci, 17, 17, seed=40 + ci), rand(32, ci, 3, 3, seed=50 + ci, lo=-0.5, hi=0.5), rand(32, seed=9)
    model, feeds = op_model("Conv", [x, C(w), C(b)], {"strides": [2, 2], "pads": [1] * 4})
    padded = pads_to_pairs(width, ci)
    c = lower(model, resolve(width), 2, check_options(EMULATE), precision="bf16", stop_after="kernels")
    pads = [n for n in c.graph.nodes if n.op == "Pad"]
    (anchor,) = [n for n in c.graph.nodes if n.op in ("PackedConv", "Conv")]
    assert len(pads) == padded and bool(anchor.attrs.get("pair_block")) == padded
    if padded:
        assert pads[0].outputs[0].shape[1] == -(-ci // 4) * 4 and anchor.attrs["in_block"] == 4
        assert anchor.attrs["vnni"] and anchor.inputs[0].dtype == "bfloat16"
    paths = {"avx512bf16"} if padded else {untaken_path(width, amx_takes=False)}
    check_bf16(model, feeds, conv(2, 1), ci * 9, width, bias=b.reshape(-1, 1, 1), paths=paths)
    if padded:  # the reorder's 16 pixels × 4 bf16 channels: two registers, each one word permute (vpermt2w) — not
        # a butterfly of unpacks and shuffles (codegen/transpose.py interleave_in_two_registers)
        from kiln.asm import function_asm
        from kiln.codegen.jit import emit_assembly, optimize

        t = resolve(width)
        low = lower(model, t, 2, check_options(EMULATE), precision="bf16", stop_after="llvm")
        name = next(k.name for k in low.program.kernels if "toblocked" in k.name)
        asm = function_asm(emit_assembly(optimize(low.llvm_ir, t), t), [name])
        assert re.search(r"vperm[ti]2w", asm), asm[:3000]
        # (5 channels: the pad's select reads the run-time block index — its blends are not the interleave's)
        assert ci != 3 or not re.search(r"vpunpck|vpshufb", asm), asm[:3000]


def test_no_bf16_dot_product_runs_float32(width: str) -> None:
    """By default a width without a bf16 dot product (no AMX, AVX512_BF16: avx2 and sse on Zen 4; every width on an
    AVX2 host) keeps the bf16 anchors float32 — what the float32 build computes, bit for bit, with exe.meta saying so;
    where the width has one (or with the switch native_bf16_only off) they multiply bf16. A residual block: its
    convs and the MatMul head."""
    x = rand(1, 16, 8, 8, seed=21)
    w1, w2, wm = rand(32, 16, 3, 3, seed=22), rand(32, 32, 1, 1, seed=23), rand(8, 32, seed=24)
    model, feeds = make_model([helper.make_node("Conv", ["x", "w1"], ["a"], pads=[1] * 4),
                               helper.make_node("Relu", ["a"], ["r"]),
                               helper.make_node("Conv", ["r", "w2"], ["b"]),
                               helper.make_node("Add", ["a", "b"], ["s"]),
                               helper.make_node("MatMul", ["s", "wm"], ["y"])],
                              {"x": x}, ["y"], {"w1": w1, "w2": w2, "wm": wm}), {"x": x}
    native = bf16_dot_product(resolve(width))
    c = lower(model, resolve(width), 2, check_options({}), precision="bf16", stop_after="kernels")
    marks = {n.name: n.attrs.get("precision") for n in c.graph.nodes if "precision" in n.attrs}
    assert marks and (("bf16" in marks.values()) == native), marks
    emulated = lower(model, resolve(width), 2, check_options(EMULATE), precision="bf16", stop_after="kernels")
    assert "bf16" in {n.attrs.get("precision") for n in emulated.graph.nodes}
    got = run_kiln(model, feeds, target=width, precision="bf16")
    if got is None:
        return
    exe = kiln.compile(model, target=width, precision="bf16", num_threads=2)
    if native:
        assert "bf16 dot products" in exe.meta["bf16"], exe.meta["bf16"]
        return
    assert set(exe.meta["precision"].values()) == {"fp32"} and "run float32" in exe.meta["bf16"], exe.meta
    fp32 = run_kiln(model, feeds, target=width)
    np.testing.assert_array_equal(got[0], fp32[0])
    assert kiln.compile(model, target=width).meta["bf16"] is None


def test_depthwise_stays_fp32(width: str) -> None:
    """Depthwise convs keep float32 (memory-bound: nothing for a bf16 dot product to speed up): fp32-exact."""
    x, w = rand(1, 32, 10, 10, seed=9), rand(32, 1, 3, 3, seed=10)
    model, feeds = op_model("Conv", [x, C(w)], {"group": 32, "pads": [1] * 4})
    got = run_kiln(model, feeds, target=width, precision="bf16", **EMULATE)
    if got is None:
        return
    np.testing.assert_allclose(got[0], conv(1, 1, 32)(x.astype(np.float64), w.astype(np.float64)),
                               rtol=0, atol=1e-5 * np.abs(got[0]).max())
    assert kiln.compile(model, target=width, precision="bf16", **EMULATE).meta["precision"] == {}


@pytest.mark.parametrize("hw", [16, 13], ids=["even", "odd"])
def test_winograd_in_bf16_only_beside_vdpbf16ps(width: str, hw: int) -> None:
    """A 3×3 stride-1 conv the fp32 build runs through Winograd: in bf16 it is Winograd with vdpbf16ps products where
    that is the target's one bf16 dot product (Zen 4: avx512 here), else a direct conv (AMX; emulated) — against
    the matching reference and bound (winograd_bf16; an odd size: the last tiles overhang the output)."""
    x, w = rand(1, 64, hw, hw, seed=11), rand(64, 64, 3, 3, seed=12, lo=-0.3, hi=0.3)
    model, feeds = op_model("Conv", [x, C(w)], {"pads": [1] * 4})
    wino = takes_winograd(width, 64, 64, 3, 1)
    meta = check_bf16(model, feeds, conv(1, 1), 64 * 9, width, winograd_pad=1 if wino else None)
    if not meta:  # a width this CPU cannot run: its build still takes the path, object emitted
        c = lower(model, resolve(width), 2, check_options(EMULATE), precision="bf16", stop_after="kernels")
        assert any(n.op == "WinogradProduct" for n in c.graph.nodes) == wino


def test_fused_chain(width: str) -> None:
    """conv → ReLU → conv → Add(residual) → MatMul: the bf16 casts fused into producers, residual kept float32;
    vs onnxruntime float32 with a bound of three bf16 layers (each ≤ 2u·√K relative, K ≤ 288: ≤ 3·2·2⁻⁸·17)."""
    x = rand(1, 32, 16, 16, seed=13)
    w1, w2 = rand(32, 32, 3, 3, seed=14, lo=-0.2, hi=0.2), rand(32, 32, 1, 1, seed=15, lo=-0.3, hi=0.3)
    wm = rand(16, 40, seed=16, lo=-0.5, hi=0.5)
    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"], pads=[1] * 4, name="conv1"),
             helper.make_node("Relu", ["a"], ["r"], name="relu"),
             helper.make_node("Conv", ["r", "w2"], ["c"], name="conv2"),
             helper.make_node("Add", ["c", "r"], ["s"], name="residual"),
             helper.make_node("MatMul", ["s", "wm"], ["y"], name="fc")]
    model = make_model(nodes, {"x": x}, ["y"], {"w1": w1, "w2": w2, "wm": wm})
    got = run_kiln(model, {"x": x}, target=width, precision="bf16", **EMULATE)
    if got is None:
        return
    want = run_ort(model, {"x": x})[0]
    rel = np.abs(got[0] - want).max() / np.abs(want).max()
    assert rel < 3 * 2 * U * np.sqrt(288), rel
    assert rel > 0, "bf16 rounding left no trace: the anchors did not run in bf16"
    meta = kiln.compile(model, target=width, precision="bf16", **EMULATE).meta
    # conv2's output (+ the residual) leaves the blocked layout for fc: an NCHW output, which the AMX tiles do not
    # take (their C block would be stored transposed) and the vdpbf16ps register tile does
    path = expected_path(width)
    nchw_out = "avx512bf16" if dpbf16_widths(resolve(width)) else "emulated"
    assert meta["precision"] == {"conv1": path, "conv2": nchw_out, "fc": path}, meta["precision"]


def test_fp32_default_untouched() -> None:
    x, w = rand(16, 64, seed=17), rand(64, 32, seed=18)
    model, feeds = op_model("MatMul", [x, C(w)])
    exe = kiln.compile(model, num_threads=2)
    assert exe.meta["precision"] == {} and exe.meta["amx"] is False
    np.testing.assert_allclose(exe.run(feeds)[0], x.astype(np.float64) @ w, rtol=1e-5, atol=1e-5)


def test_unknown_precision_is_refused() -> None:
    model, _ = op_model("MatMul", [rand(4, 4), C(rand(4, 4))])
    with pytest.raises(ValueError, match="unknown precision 'fp16'"):
        kiln.compile(model, precision="fp16")
    with pytest.raises(ValueError, match=r"unknown precision 'int8'.*kiln\.quantize\(model, calibration_feeds\)"):
        kiln.compile(model, precision="int8")


def test_precision_in_cache_key(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path))
    x, w = rand(16, 64, seed=19), rand(64, 32, seed=20)
    model, feeds = op_model("MatMul", [x, C(w)])
    a = kiln.compile(model, num_threads=2).run(feeds)[0]
    b = kiln.compile(model, num_threads=2, precision="bf16", **EMULATE).run(feeds)[0]
    assert not np.array_equal(a, b)
    finish_cache_writes()
    assert len(list(tmp_path.glob("*.kiln"))) == 2



def conv_case(target: str = "host") -> tuple[onnx.ModelProto, dict[str, np.ndarray], np.ndarray, np.ndarray]:
    """A 3×3 conv (K = 288) with its bf16-exact reference and Σ|x·w| per output (module docstring) — scaled so that
    the float32 bound is 288·2⁻²⁴ of it — as `target` builds it: where it takes bf16 Winograd (takes_winograd)
    the Winograd conv's references (winograd_bf16: K + 9 float32 terms, the bound's sum scaled by 297 / 288)."""
    x, w = rand(1, 32, 12, 12, seed=21), rand(48, 32, 3, 3, seed=22, lo=-0.5, hi=0.5)
    model, feeds = op_model("Conv", [x, C(w)], {"pads": [1] * 4})
    if takes_winograd(target, 32, 48, 3, 1):
        exact, absprod, _ = winograd_bf16(x, w, 1)
        return model, feeds, exact, absprod * (288 + 9) / 288
    return model, feeds, conv(1, 1)(bf16(x), bf16(w)), conv(1, 1)(np.abs(bf16(x)), np.abs(bf16(w)))


@pytest.mark.parametrize("target", ["aarch64-neon", "riscv64-rvv"])
def test_cross_isa_emulated(target: str, tmp_path) -> None:  # noqa: ANN001
    """The cross ISAs store bf16 and multiply in float32 (emulated), run under qemu-user: bf16-exact results."""
    import kiln.cross as kc

    t = resolve(target)
    missing = kc.have_toolchain(t.arch)
    if missing:
        pytest.skip(missing)
    model, feeds, exact, absprod = conv_case(target)
    binary = kc.build_binary(model, t, str(tmp_path / "b"), precision="bf16", options=EMULATE)
    outs, _ = kc.run_qemu(binary, feeds, vlen=128)
    assert (np.abs(outs[0] - exact) <= 288 * F32 * absprod + 1e-30).all()
    assert not np.array_equal(outs[0], run_ort(model, feeds)[0])  # it did round: bf16, not a float32 build


def test_cli_precision(tmp_path, capsys) -> None:  # noqa: ANN001
    from kiln.cli import main

    model, feeds, exact, absprod = conv_case()
    onnx.save(model, str(tmp_path / "m.onnx"))
    np.save(tmp_path / "x.npy", feeds["x0"])
    emulate = ["--disable", "native_bf16_only"]  # (a host without a bf16 dot product: its emulation, as EMULATE)
    assert main(["run", str(tmp_path / "m.onnx"), "--precision", "bf16", "--input", f"x0={tmp_path / 'x.npy'}",
                 "--output", str(tmp_path / "y.npy"), "--repeat", "1", "--no-cache", *emulate]) == 0
    y = np.load(tmp_path / "y.npy")
    assert (np.abs(y - exact) <= 288 * F32 * absprod + 1e-30).all()
    assert main(["compile", str(tmp_path / "m.onnx"), "--precision", "bf16", "-o", str(tmp_path / "m.kiln"),
                 *emulate]) == 0
    exe = kiln.load(str(tmp_path / "m.kiln"))
    assert exe.meta["precision"] == {"conv_node": expected_path("host")}
    assert (np.abs(exe.run(feeds)[0] - exact) <= 288 * F32 * absprod + 1e-30).all()


def bert_layer() -> onnx.ModelProto:
    from kiln.zoo.bert import HIDDEN, SEQ, encoder_layer
    from kiln.zoo.builder import GraphBuilder

    b = GraphBuilder(0)
    x = b.input("embeddings", (1, SEQ, HIDDEN))
    encoder_layer(b, x, "encoder.0", out="y")
    b.output("y", (1, SEQ, HIDDEN))
    return b.model("bert_layer")


def test_bert_layer(width: str) -> None:
    """One BERT-base encoder layer: the 6 dense layers and attention's two activation×activation MatMuls (Q·Kᵀ,
    P·V: B packed in the kernel) on AMX (avx512 here); softmax, layer norms, GELU and residuals float32. Error vs
    onnxruntime float32 ≤ 4·2⁻⁸ (measured ≈ 1e-3; OpenVINO bf16 gets 3.9e-3 on all 12 layers)."""
    model = bert_layer()
    feeds = {"embeddings": rand(1, 128, 768, seed=23)}
    got = run_kiln(model, feeds, target=width, precision="bf16", **EMULATE)
    if got is None:
        return
    want = run_ort(model, feeds)[0]
    rel = float(np.abs(got[0] - want).max() / np.abs(want).max())
    assert 0 < rel <= 4 * U, rel
    meta = kiln.compile(model, target=width, precision="bf16", **EMULATE).meta
    counts = {p: list(meta["precision"].values()).count(p) for p in set(meta["precision"].values())}
    want: dict[str, int] = {expected_path(width): 6}
    want[activation_path(width)] = want.get(activation_path(width), 0) + 2
    assert counts == want, counts
    assert meta["precision"]["encoder.0.attn.scores"] == meta["precision"]["encoder.0.attn.context"] \
        == activation_path(width)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["resnet50", "bert_base"])
def test_zoo_model_vs_openvino_bf16(name: str) -> None:
    """Whole networks (random weights) on the host: Kiln bf16's error vs onnxruntime float32 is at most 1.5× that
    of OpenVINO's bf16 build of the same model (a peer with the same arithmetic: resnet50 ≈ 0.10, bert ≈ 4e-3)."""
    ov = pytest.importorskip("openvino")
    from kiln import zoo

    model, feeds = zoo.build(name), zoo.inputs(name)
    want = run_ort(model, feeds)[0]
    exe = kiln.compile(model, num_threads=2, precision="bf16", **EMULATE)
    core = ov.Core()
    compiled = core.compile_model(core.read_model(model.SerializeToString(), b""), "CPU",
                                  {"INFERENCE_PRECISION_HINT": "bf16", "INFERENCE_NUM_THREADS": 2})
    ov_out = compiled(feeds)[0]

    def rel(y: np.ndarray) -> float:
        return float(np.abs(y - want).max() / np.abs(want).max())
    assert rel(exe.run(feeds)[0]) <= 1.5 * rel(ov_out), (rel(exe.run(feeds)[0]), rel(ov_out))
    assert expected_path("host") in exe.meta["precision"].values()


@pytest.mark.parametrize("switches", [{"amx": False}, {"amx": False, "dpbf16": False}], ids=["no-amx", "neither"])
def test_switches_off(switches: dict[str, bool]) -> None:
    """amx=False (an AVX-512 CPU without AMX takes the same path): vdpbf16ps where the CPU has AVX512_BF16, else the
    emulation; dpbf16=False too: the emulated kernel. The same bf16-exact result every way (a Winograd conv where
    the target's one bf16 dot product is vdpbf16ps: the graph pass decides by the target, conv_case)."""
    model, feeds, exact, absprod = conv_case()
    exe = kiln.compile(model, num_threads=2, precision="bf16", **EMULATE, cache=False, **switches)
    path = "avx512bf16" if switches.get("dpbf16", True) and dpbf16_widths(resolve("host")) else "emulated"
    assert exe.meta["precision"] == {"conv_node": path} and exe.meta["amx"] is False
    assert any("winogradproduct" in k for k in exe.meta["kernels"]) == takes_winograd("host", 32, 48, 3, 1)
    assert (np.abs(exe.run(feeds)[0] - exact) <= 288 * F32 * absprod + 1e-30).all()


def test_streamed_weights_one_pass() -> None:
    """A conv whose bf16 weights exceed half of L2 and whose rows end in edge tiles ("3x3-7x7-wide", checked
    numerically by test_conv): one parallel nest over (batch, panel) work items holding the blocks and the edge
    tiles (configurations of 16 and 13 rows), not one nest — and one pass over the weights — per row count."""
    from kiln.compiler import lower
    from kiln.kernel.ir import Loop

    target = resolve("host")
    if not usable(target.features):
        pytest.skip("the AMX schedule needs a host whose process may use AMX")
    n, ci, h, w_, co, k, s, p = CONVS["3x3-7x7-wide"]
    model, _ = op_model("Conv", [rand(n, ci, h, w_), C(rand(co, ci, k, k))], {"pads": [p] * 4})
    lowered = lower(model, target, 2, dict(EMULATE), stop_after="kernels", precision="bf16")
    (conv_kernel,) = [kern for kern in lowered.program.kernels if "packedconv" in kern.name]
    nests = [s for s in conv_kernel.body if isinstance(s, Loop) and s.kind == "parallel"]
    assert len(nests) == 1 and nests[0].extent.value == co // 32, nests
    assert {"kiln_amx_config_bf16_m16_k32", "kiln_amx_config_bf16_m13_k32"} <= set(conv_kernel.extern_ir)


def test_dpbf16_emitted_on_any_x86_host() -> None:
    """The vdpbf16ps tile is lowered and its object emitted for an AVX512_BF16 CPU on any x86 host — an AVX2 host
    included, which cannot run it (the class of bug that let an AVX-512-only path crash where CI was green)."""
    from kiln.codegen.jit import emit_assembly, optimize
    from kiln.compiler import lower
    from kiln.target import with_features

    host = resolve("host")
    if host.arch != "x86_64":
        pytest.skip("an x86 target")
    t = with_features(resolve("avx512"), "avx512bf16", "avx512vl")
    x, w = rand(37, 96, seed=40), rand(96, 80, seed=41)
    model, _ = op_model("MatMul", [x, C(w)])
    low = lower(model, t, 2, {"amx": False, **EMULATE}, precision="bf16", stop_after="llvm")
    assert [k.precision for k in low.program.kernels if k.precision] == [{"matmul_node": "avx512bf16"}]
    asm = emit_assembly(optimize(low.llvm_ir, t), t)
    assert "vdpbf16ps" in asm and "zmm" in asm


def test_isa_report_vdpbf16ps_loop() -> None:
    """The ISA report's bf16 rows for Kiln's vdpbf16ps tile and its emulation (kiln/isa/bf16.py gemm_loop, built for
    an AVX512_BF16 CPU on any x86 host): the tile's K loop spends one A broadcast per row and step and loads B once
    per vector, so fewer than half the emulation's instructions per multiply-accumulate (it widens bf16 loads and
    does one FMA per product)."""
    from kiln.isa.bf16 import gemm_loop

    if resolve("host").arch != "x86_64":
        pytest.skip("an x86 target")
    (n_dp, macs_dp), (n_emu, macs_emu) = gemm_loop(True), gemm_loop(False)
    assert macs_dp >= 14 * 32 and macs_emu >= 14 * 16, (macs_dp, macs_emu)
    assert n_dp / macs_dp < 0.07 and n_dp / macs_dp < 0.5 * n_emu / macs_emu, (n_dp, macs_dp, n_emu, macs_emu)


def test_isa_report_bf16_microkernel_loops() -> None:
    """The bf16 table's microkernel rows (kiln/isa/bf16.py ukernel_loop, each kernel compiled alone): vdpbf16ps, one
    per row and B vector per K step (14 × 2), and BFMMLA, one per 2×2 block (4 × 4), with the loads, broadcasts,
    zips and address updates around them — under 0.1 / 0.2 instructions per multiply-accumulate."""
    from kiln.isa.bf16 import ukernel_loop

    n, dots = ukernel_loop("dpbf16_512", "avx512", "+avx512bf16,+avx512vl", "vdpbf16ps")
    assert dots == 28 and n / (32 * dots) < 0.1, (n, dots)
    n, mmla = ukernel_loop("bfmmla", "aarch64-neon", "+bf16", "bfmmla")
    assert mmla == 16 and n / (16 * mmla) < 0.2, (n, mmla)


def test_isa_report_aarch64_block_tile() -> None:
    """Direct emission on AArch64 BF16 (kiln/isa/bf16.py aarch64_gemm_loop, objects only): the tile with its rows in
    pairs runs BFMMLA — 16 MACs an instruction, so well under the BFDOT tile's (switch mmla off) instructions per
    multiply-accumulate, and within the BFMMLA microkernel's ballpark (< 0.2)."""
    from kiln.isa.bf16 import aarch64_gemm_loop

    (n_mm, macs_mm), (n_dot, macs_dot) = aarch64_gemm_loop(True), aarch64_gemm_loop(False)
    assert macs_mm >= 16 * 16 and macs_dot >= 8 * 16, (macs_mm, macs_dot)
    assert n_mm / macs_mm < 0.2 and n_mm / macs_mm < 0.6 * n_dot / macs_dot, (n_mm, macs_mm, n_dot, macs_dot)


def test_bounds_checked_bf16_build(width: str) -> None:
    """The debug build (bounds_check=True) emits each pair product plainly (Dot2.expand: every load checked): the
    same bf16-rounded result as the fast build, within float32 accumulation (K·2⁻²⁴·Σ|x·w|)."""
    x, w = rand(37, 96, seed=42), rand(96, 80, seed=43)
    model, feeds = op_model("MatMul", [x, C(w)])
    fast = run_kiln(model, feeds, target=width, precision="bf16", **EMULATE)
    if fast is None:
        return
    checked = run_kiln(model, feeds, target=width, precision="bf16", **EMULATE, bounds_check=True)[0]
    absprod = np.abs(bf16(x)) @ np.abs(bf16(w))
    assert (np.abs(checked.astype(np.float64) - fast[0]) <= 2 * 96 * F32 * absprod + 1e-30).all()
    assert (np.abs(checked - bf16(x) @ bf16(w)) <= 96 * F32 * absprod + 1e-30).all()


@pytest.mark.parametrize("shape", [(19, 64, 48), (2, 5, 37, 32)], ids=["rows19", "batched-oddK"])
def test_bf16_ukernel(width: str, shape: tuple[int, ...]) -> None:
    """strategy="ukernel" with precision="bf16": the vdpbf16ps microkernel (kiln/ukernels/dot.py) where the width has
    AVX512_BF16 — within float32 accumulation of the bf16-rounded product (an odd K's last pair in the epilogue,
    a partial row tile); AMX takes the anchor first where the process may use it; elsewhere the anchor is built
    directly and says why."""
    from kiln.ukernels.dot import method_for

    *m, k, n = shape
    x, w = rand(*m, k, seed=1), rand(k, n, seed=2)
    model, feeds = op_model("MatMul", [x, C(w)])
    got = run_kiln(model, feeds, target=width, precision="bf16", **EMULATE, strategy="ukernel")
    if got is not None:
        exact, absprod = bf16(x) @ bf16(w), np.abs(bf16(x)) @ np.abs(bf16(w))
        err = np.abs(got[0].astype(np.float64) - exact)
        assert (err <= k * F32 * absprod + 1e-30).all(), err.max()
    t = resolve(width)
    from kiln.compiler import check_options, lower
    c = lower(model, t, 2, check_options(EMULATE), strategy="ukernel", precision="bf16", stop_after="llvm")
    built = {node: how for kern in c.program.kernels for node, how in kern.strategies.items()}
    method, why = method_for(t, "bfloat16", 2 * t.lanes(32))
    if usable(t.features):
        assert {how for kern in c.program.kernels for how in kern.precision.values()} == {"amx"}
    elif method is not None:
        assert built == {"matmul_node": "ukernel"}, built
        assert f"kiln_ukr_{method}_bf16_" in c.llvm_ir
    else:
        assert built == {"matmul_node": f"direct (ukernel not available: {why})"}, built


@pytest.mark.parametrize("name", ["gemm_odd", "conv_r50_3x3"])
def test_bf16_tiles_on_sve_under_qemu(tmp_path, name: str) -> None:  # noqa: ANN001
    """An SVE target with BF16 runs a bf16 GEMM's packed tile, and a bf16 conv in the blocked layout, in NEON
    registers (a fixed-width loop of the scalable build): BFMMLA, BFDOT with the switch mmla off, the BFMMLA
    microkernel under strategy="ukernel" — each against the emulation (switch dpbf16 off) within float32 summation
    order, at VL 256 under qemu."""
    import dataclasses

    import kiln.cross as kc
    from kiln import zoo
    from kiln.cross import have_toolchain

    if have_toolchain("aarch64"):
        pytest.skip(have_toolchain("aarch64"))
    base = resolve("aarch64-sve")
    t = dataclasses.replace(base, features=base.features + ",+bf16")
    model, feeds = zoo.build(name), zoo.inputs(name)
    builds = {"direct": ("direct", None, "bfmmla"), "bfdot": ("direct", {"mmla": False}, "bfdot"),
              "ukernel": ("ukernel", None, "bfmmla"), "emulated": ("direct", {"dpbf16": False}, None)}
    out = {}
    for label, (strategy, options, instr) in builds.items():
        b = kc.build_binary(model, t, str(tmp_path / label), strategy=strategy, options={**(options or {}), **EMULATE},
                            precision="bf16")
        out[label] = kc.run_qemu(b, feeds, vlen=256)[0][0]
        asm = (tmp_path / label / "model.s").read_text()
        assert [i for i in ("bfmmla", "bfdot") if i in asm] == ([instr] if instr else []), label
    scale = np.abs(out["emulated"]).max()
    for label in ("direct", "bfdot", "ukernel"):
        assert np.abs(out[label] - out["emulated"]).max() <= 1e-5 * scale, label


@pytest.mark.parametrize("name", ["gemm_odd", "conv_r50_3x3"])
def test_bf16_aarch64_under_qemu(tmp_path, name: str) -> None:  # noqa: ANN001
    """AArch64 with BF16: direct emission's tile takes its rows in pairs and runs BFMMLA (2×2 float32 blocks of
    4-value bf16 dot products: schedule/mmla.py), or with the switch mmla off the pair dot product BFDOT
    (codegen/dpbf16.py); strategy="ukernel" the BFMMLA microkernel; all against the emulation (bf16 operands,
    float32 FMAs: switch dpbf16 off) under qemu — one float32 sum order against another."""
    import dataclasses

    import kiln.cross as kc
    from kiln import zoo
    from kiln.cross import have_toolchain

    if have_toolchain("aarch64"):
        pytest.skip(have_toolchain("aarch64"))
    t = dataclasses.replace(resolve("aarch64-neon"), features="+neon,+fp-armv8,+bf16")
    model, feeds = zoo.build(name), zoo.inputs(name)
    builds = {"ukernel": ("ukernel", None), "direct": ("direct", None), "bfdot": ("direct", {"mmla": False}),
              "emulated": ("direct", {"dpbf16": False})}
    out = {}
    for label, (strategy, options) in builds.items():
        b = kc.build_binary(model, t, str(tmp_path / label), strategy=strategy, options={**(options or {}), **EMULATE},
                            precision="bf16")
        out[label] = kc.run_qemu(b, feeds)[0][0]
    assert "bfmmla" in (tmp_path / "ukernel" / "model.s").read_text()
    asm = {label: (tmp_path / label / "model.s").read_text() for label in ("direct", "bfdot")}
    assert "bfmmla" in asm["direct"] and "bfdot" not in asm["direct"]
    assert "bfdot" in asm["bfdot"] and "bfmmla" not in asm["bfdot"]
    assert "bfdot" not in (tmp_path / "emulated" / "model.s").read_text()
    scale = np.abs(out["emulated"]).max()
    for label in ("ukernel", "direct", "bfdot"):
        assert np.abs(out[label] - out["emulated"]).max() <= 1e-5 * scale, label
