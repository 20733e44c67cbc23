"""Winograd F(2×2, 3×3) for blocked 3×3 stride-1 convolutions (Lavin & Gray 2016):

    PackedConv(xb, Wp, b) 3×3/1  ⇒  V = WinogradInput(xb)       V[n, r, c, cib, t, ci] = (Bᵀ d B)[r, c]
                                    M = WinogradProduct(V, U)  M[n, r, c, cob, t, co] = Σ_ci V · U
                                    y = WinogradOutput(M, b)   y[n, cob, oh, ow, co] = (Aᵀ m A)[oh%2, ow%2] + b

per 2×2 output tile t (d: its 4×4 input patch, m: its 16 products), with the weights transformed at compile time,
U[r, c, cob, cib, ci, co] = (G g Gᵀ)[r, c] for each (co, ci) pair's 3×3 kernel g. The multiply-adds per output
fall from 9·Ci to 4·Ci (the 16 products serve 4 outputs): the product is 16 independent GEMMs, one per (r, c),
each a blocked 1×1 convolution over the tiles — the same register tile as every other conv
(schedule/tile.py). The transforms are additions (Bᵀ, Aᵀ hold 0 and ±1) and streaming memory traffic: V and M
are 16/4 = 4× the input / output size. The epilogue (bias, folded BN, activation, residual add) fuses into the
output transform.

Applies where the layout is blocked in and out (graph/passes/block_layout.py) — for the direct strategy and the
microkernel one (the product is a GEMM the microkernel nest takes as it takes a blocked conv; a library keeps
its NCHW im2col convolution) — and where the GEMMs have enough work to repay the transforms: Ci ≥ 32 and
Co ≥ 32. Rounding: the transforms add at most a few ulps per product (F(2, 3)'s coefficients are 0, ±1/2, ±1),
far inside the 1e-4 relative tolerance the tests hold it to.

bf16 convs (precision="bf16", graph/passes/precision.py) take it only where vdpbf16ps is the target's one bf16 dot
product (`pairs_only`: AVX512_BF16 without AMX — Zen 4, Cooper Lake). There the direct bf16 conv runs near the
vdpbf16ps peak, twice float32's, while Winograd's fp32 build does 2.25× fewer multiply-adds: the fp32 Winograd conv
and the bf16 direct one cost about the same (resnet50 on Zen 4: 7.8 and 6.9 ms for the 13 such convs) and bf16's
products on the 2.25× fewer multiply-adds are where it gains. V is stored in bf16 (each value a sum of up to 4
inputs in float32, rounded once) and U (G g Gᵀ in float64, rounded to float32 as for fp32) rounded to bf16 in VNNI
pair order U[.., ci // 2, co, ci % 2]; the products accumulate in float32 (on the vdpbf16ps tile; emulated with the
switch `dpbf16` off) and the output transform and its epilogue stay float32. Each V·U product has bf16's error
2u relative (u = 2⁻⁸), the output transform sums 9 of them with coefficients ±1 (tests/test_bf16.py bounds it
elementwise). With AMX the tiles' multiply-adds are the cheap part: bf16 convs stay direct there, as on targets
that emulate bf16."""
from __future__ import annotations

import numpy as np

from kiln.graph import symbolic
from kiln.graph.ir import Graph, Node, TensorType, Value
from kiln.graph.ops import OPS, OpDef, acc_dtype
from kiln.graph.passes.precision import BF16, pairs_only, to_bf16, vnni_pairs
from kiln.strategy import strategy_of
from kiln.target import Target

MIN_CHANNELS = 32

G = np.array([[1, 0, 0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0, 0, 1]])
G_KRON = np.einsum("ra,cb->abrc", G, G).reshape(9, 16)  # (G ⊗ G)ᵀ: g[a, b] ↦ U[r, c] = Σ G[r, a] g[a, b] G[c, b]


def tiles(oh: int, ow: int) -> tuple[int, int]:
    return -(-oh // 2), -(-ow // 2)


def _input_shape(ts: list[TensorType], a: dict) -> list[TensorType]:
    n, cib, _, _, cb = ts[0].shape
    th, tw = tiles(*a["out_hw"])
    return [TensorType(a.get("dtype", ts[0].dtype), (n, 4, 4, cib, th * tw, cb))]


def _product_shape(ts: list[TensorType], a: dict) -> list[TensorType]:
    n, _, _, _, t, _ = ts[0].shape
    cob, nr = ts[1].shape[2], ts[1].shape[-2 if len(ts[1].shape) == 7 else -1]  # (bf16: U in VNNI pairs)
    return [TensorType(acc_dtype(ts[0].dtype), (n, 4, 4, cob, t, nr))]


def _output_shape(ts: list[TensorType], a: dict) -> list[TensorType]:
    n, _, _, cob, _, nr = ts[0].shape
    return [TensorType(ts[0].dtype, (n, cob) + tuple(a["out_hw"]) + (nr,))]


OPS["WinogradInput"] = OpDef(_input_shape, None, "data")
OPS["WinogradProduct"] = OpDef(_product_shape, None, "anchor")
OPS["WinogradOutput"] = OpDef(_output_shape, None, "unary")


WEIGHT_CHUNK = 1 << 14  # weights per step of the transform: its float64 temporaries stay in cache (~1 MB)


def transform_weights(wp: np.ndarray) -> np.ndarray:
    """Wp[Co/nr, Ci/cb, 3, 3, cb, nr] (block_layout.pack_blocked_conv) → U[4, 4, Co/nr, Ci/cb, cb, nr] with
    U[r, c, ·] = G g Gᵀ: per block pair, (G ⊗ G)[16, 9] · Wp[9, cb·nr] in float64, rounded once. Straight from the
    packed layout, a few block pairs at a time: unpacking to W[Co·Ci, 9] first and transforming it whole was five
    passes over float64 temporaries up to 4× the weights (resnet50's 13 transforms: 0.84 s alone, now 0.04 s)."""
    cob, cib, _, _, cb, nr = wp.shape
    w = wp.reshape(cob * cib, 9, cb * nr)
    u = np.empty((16, cob * cib, cb * nr), np.float32)
    step = max(1, WEIGHT_CHUNK // (cb * nr))
    for s in range(0, cob * cib, step):
        u[:, s:s + step] = (G_KRON.T @ w[s:s + step].astype(np.float64)).transpose(1, 0, 2)
    return u.reshape(4, 4, cob, cib, cb, nr)


def _eligible(n: Node, bf16_too: bool) -> bool:
    a = n.attrs
    if n.op != "PackedConv" or strategy_of(a) not in ("direct", "ukernel") or a["group"] != 1 \
            or not a.get("in_block") or not a.get("out_block") or a["kernel"] != (3, 3) or a["strides"] != (1, 1) \
            or a["dilations"] != (1, 1) or n.inputs[1].const is None or (a.get("precision") == "bf16" and not bf16_too):
        return False
    x, y = n.inputs[0], n.outputs[0]
    if not symbolic.is_static(y.shape[2:4]):
        return False  # a symbolic spatial dim: the 2×2 tile count would be a run-time extent; the conv stays direct
    # (a symbolic batch is not in this decision: such convs still take Winograd)
    return x.shape[1] * x.shape[-1] >= MIN_CHANNELS and a["co"] >= MIN_CHANNELS and x.shape[0] == y.shape[0]


def winograd_conv(g: Graph, target: Target | None = None) -> Graph:
    old, g.nodes = g.nodes, []
    bf16_too = pairs_only(target)
    for n in old:
        if not _eligible(n, bf16_too):
            g.nodes.append(n)
            continue
        x, wp, y = n.inputs[0], n.inputs[1], n.outputs[0]
        a = n.attrs
        nr = a["nr"]
        out_hw = tuple(y.shape[2:4])
        u = transform_weights(wp.const)
        bf16 = a.get("precision") == "bf16"
        if bf16:  # U[4, 4, cob, cib, cb, nr] → [4, 4, cob, cib, cb/2, nr, 2], rounded to nearest even
            u = to_bf16(vnni_pairs(u, 4))
        uv = Value(g.fresh(wp.name + ".winograd"), TensorType(BF16 if bf16 else "float32", u.shape), const=u)
        (v,) = g.add("WinogradInput", [x], {"out_hw": out_hw, "pads": a["pads"], **({"dtype": BF16} if bf16 else {})},
                     n.name + ".winograd_input")
        (m,) = g.add("WinogradProduct", [v, uv], {"nr": nr, "strategy": a.get("strategy", "direct")}, n.name)
        # the last stage keeps the conv's output value (its consumers read it)
        last = Node("WinogradOutput", [m] + n.inputs[2:], [y], {"out_hw": out_hw}, n.name + ".winograd_output")
        y.producer = last
        g.nodes.append(last)
    return g
