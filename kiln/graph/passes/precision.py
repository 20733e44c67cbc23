"""precision="bf16": the anchors multiply bfloat16 operands and accumulate in float32 (issue 18).

Two steps, both visible in `compiler.lower`:

  * `assign_precision(g, precision)` (right after import, beside the strategies) marks each MatMul and dense Conv
    `attrs["precision"] = "bf16"` — depthwise and grouped convs stay "fp32": a few multiply-adds per loaded value,
    memory-bound, nothing for a bf16 dot product to speed up. The layout passes read the mark: Winograd takes bf16
    convs only where vdpbf16ps is the one bf16 dot product (`pairs_only`; graph/passes/winograd.py: its transformed
    operands, each rounded to 8 bits, cost little accuracy with F(2×2, 3×3)'s coefficients; with AMX the
    multiply-adds it saves are the cheap part, and emulated bf16 is no faster than float32).
  * `lower_precision(g)` (the graph pass, after the layout passes, switch `lower_precision`) rewrites the marked
    anchors, now in their packed forms:

        PackedConv(x, Wp, b)  ⇒  PackedConv(xb = Cast(x, bfloat16), Wv, b)         output float32, vnni=True
        PackedMatMul(a, Bp)   ⇒  PackedMatMul(Cast(a, bfloat16), Bv)                output float32, vnni=True
        MatMul(a, b)          ⇒  MatMul(Cast(a), Cast(b) or b in bf16)              activation × activation
        Conv(x, W, b)         ⇒  Conv(Cast(x), W in bf16, b)                        dense convs left NCHW

    Weights are rounded (to nearest even, ml_dtypes) and packed at compile time in the VNNI pair order the bf16
    dot products read — K in pairs, the pair innermost:
        PackedMatMul  Bp[⌈N/NR⌉, K, NR]              → Bv[⌈N/NR⌉, Kp/2, NR, 2]   (Kp: K padded with zero rows to 32)
        blocked conv  Wp[Co/NR, Ci/cb, kh, kw, cb, NR] → Wv[Co/NR, Ci/cb, kh, kw, cb/2, NR, 2]  (pairs of the block's
                                                          channels: a 32-channel block is one AMX B tile's 16 rows)
        NCHW-in conv  Wp[⌈Co/NR⌉, Ci, kh, kw, NR]    → Wv[⌈Co/NR⌉, Kp/2, NR, 2], K = Ci·kh·kw
    One layout on every target: AMX tdpbf16ps and AVX512_BF16 vdpbf16ps take a B row of 16 columns × 2 as it is,
    and the emulation (bf16 storage, float32 multiply-adds: AVX2, SSE, the cross ISAs) reads it with a stride-2
    load. Biases, BatchNorm folds and every epilogue stay float32: the anchor's float32 accumulator goes through
    the epilogue before anything is rounded.

Activations: one Cast to bfloat16 per value that feeds a bf16 anchor. Fusion (kernel/build.py) puts it in the
producer's epilogue when the anchor is the value's only reader — conv → bias → ReLU → round → store bf16, one kernel
— so the activations between anchors are stored in bf16 (half the memory traffic). A value read by other ops too (a
residual branch, attention's skip path) stays float32 for them, and its Cast is a kernel of its own; a Cast of a
ToBlocked reorder read by its anchor alone becomes the reorder of a Cast (ToBlocked(Cast(x)): the Cast inlines into
the reorder, one kernel). What stays float32: softmax, layer/instance normalization (their statistics), reductions,
pooling, residual adds, every output. The kernels record how each anchor ran (exe.meta["precision"]): AMX tiles,
AVX512_BF16 vdpbf16ps ("avx512bf16"), emulated, or "fp32" — on a target whose only bf16 dot product is vdpbf16ps
(`pairs_only`), an anchor its tile cannot take stays float32 rather than run emulated.

A target with no bf16 dot product at all (AVX2 and SSE — Zen 3, Zen 2, Skylake —, AArch64 without BF16, RVV) keeps
every anchor float32 (`assign_precision`, switch `native_bf16_only`), as OpenVINO treats its bf16 hint there: the
emulation (bf16 storage, a widening per operand, float32 multiply-adds, no Winograd) measured 2.2–2.8× slower than
float32 as an AVX2 host (Zen 4 at KILN_HOST_VECTOR_BITS=256, 2 threads: resnet50 100.9 vs 36.0 ms, mobilenetv2 7.89
vs 3.58, bert_base 294 vs 119). exe.meta["bf16"] says so; with the switch off the anchors run emulated."""
from __future__ import annotations

import numpy as np

from kiln.graph.ir import Graph, Node, TensorType, Value
from kiln.target import AMX_FEATURES, Target, dpbf16_widths, features_on

PRECISIONS: tuple[str, ...] = ("fp32", "bf16")
# a flattened K (a GEMM's, an NCHW-input conv's Ci·kh·kw) is padded with zero rows to a multiple of one AMX step
# (32 bf16 values: a 64-byte tile row), so the tile kernels never read past a panel (kiln/schedule/amx.py)
K_STEP = 32
BF16 = "bfloat16"


def check_precision(p: str) -> str:
    if p not in PRECISIONS:
        hint = " (int8 is a quantized model: kiln.quantize(model, calibration_feeds), then compile it — or " \
            "`kiln compile --quantize int8 --calibrate DATA.npz`)" if p in ("int8", "uint8") else ""
        raise ValueError(f"unknown precision {p!r}; known: {', '.join(PRECISIONS)}{hint}")
    return p


def bf16_dot_product(target: Target) -> bool:
    """Does `target` multiply bf16 in hardware: AMX tiles, AVX512_BF16 vdpbf16ps, AArch64 BF16 (BFDOT / BFMMLA)?"""
    return bool(dpbf16_widths(target)) or (target.arch == "x86_64" and AMX_FEATURES <= features_on(target.features))


def assign_precision(g: Graph, precision: str = "fp32", target: Target | None = None,
                     options: dict[str, bool] | None = None) -> Graph:
    """Mark every MatMul and dense Conv with `attrs["precision"]` (bf16 anchors) — see the module docstring. On a
    target without a bf16 dot product (switch `native_bf16_only`) they stay float32, marked `bf16_kept_fp32`."""
    check_precision(precision)
    # bf16 where the target multiplies it, or is asked to emulate it (the switch off); else float32
    use_bf16 = target is None or bf16_dot_product(target) or not (options or {}).get("native_bf16_only", True)
    for n in g.nodes:
        if n.op == "MatMul" or n.op == "Conv":
            dense = n.op == "MatMul" or n.attrs.get("group", 1) == 1
            floats = all(v.dtype == "float32" for v in n.inputs[:2])
            bf16 = precision == "bf16" and dense and floats
            n.attrs["precision"] = "bf16" if bf16 and use_bf16 else "fp32"
            if bf16 and not use_bf16:
                n.attrs["bf16_kept_fp32"] = True   # exe.meta["precision"] says "fp32" for it
    return g


def to_bf16(a: np.ndarray) -> np.ndarray:
    """float32 → bfloat16, rounded to nearest even (ml_dtypes, the numpy type onnx itself depends on)."""
    import ml_dtypes
    return np.asarray(a, np.float32).astype(ml_dtypes.bfloat16)


def vnni_pairs(w: np.ndarray, k_axis: int, multiple: int = 2) -> np.ndarray:
    """Split axis `k_axis` (padded with zeros to a multiple of `multiple`) into pairs and move the pair innermost:
    W[..., K, ..., N] → W[..., K/2, ..., N, 2]."""
    k = w.shape[k_axis]
    if k % multiple:
        pad = [(0, 0)] * w.ndim
        pad[k_axis] = (0, -k % multiple)
        w = np.pad(w, pad)
        k += -k % multiple
    split = w.reshape(w.shape[:k_axis] + (k // 2, 2) + w.shape[k_axis + 1:])
    return np.ascontiguousarray(np.moveaxis(split, k_axis + 1, -1))


def _weights(n: Node) -> np.ndarray | None:
    """The node's weights converted to bf16 in the layout its bf16 lowering reads, or None if it keeps them."""
    w = n.inputs[1].const
    if w is None:
        return None
    if n.op == "PackedMatMul":                       # Bp[P, K, NR] → Bv[P, Kp/2, NR, 2]
        return to_bf16(vnni_pairs(w, 1, K_STEP))
    if n.op == "PackedConv":
        if n.attrs.get("in_block"):                  # Wp[cob, cib, kh, kw, cb, NR] → [.., cb/2, NR, 2]
            return to_bf16(vnni_pairs(w, w.ndim - 2))
        flat = w.reshape(w.shape[0], -1, w.shape[-1])  # Wp[cob, Ci, kh, kw, NR] → [cob, K, NR] → [cob, Kp/2, NR, 2]
        return to_bf16(vnni_pairs(flat, 1, K_STEP))
    return to_bf16(w)                                # MatMul B[K, N] / Conv W[Co, Ci, kh, kw]: plain layout


def _convertible(n: Node) -> bool:
    if n.attrs.get("precision") != "bf16" or n.inputs[0].dtype != "float32":
        return False
    if n.op == "PackedConv":
        return n.attrs.get("group", 1) == 1
    return n.op in ("PackedMatMul", "MatMul", "Conv")


def pairs_only(target: Target | None) -> bool:
    """Is AVX512_BF16's vdpbf16ps the target's only bf16 dot product (no AMX: Zen 4, Cooper Lake)? Its register
    tile (schedule/bf16.py) reads weights paired at compile time and A with each pair contiguous; an anchor it cannot
    take would run emulated — bf16 rounding for no speed (the emulation's float32 multiply-adds cost what float32's
    do, plus the casts) — so there such anchors stay float32 (`_pair_tile_takes`). Targets without any bf16 dot
    product (AVX2, SSE, the cross ISAs) keep every anchor float32 (`assign_precision`, switch `native_bf16_only`; off:
    all emulated — bf16 storage, as asked)."""
    if target is None or target.arch != "x86_64" or target.vector_bits < 256:
        return False
    on = features_on(target.features)
    return "avx512bf16" in on and not AMX_FEATURES <= on   # the AMX test of schedule/amx.py (runtime/amx.py)


def _pair_tile_takes(n: Node) -> bool:
    """Does the vdpbf16ps tile take this anchor: a weight GEMM, or a blocked conv (A's channel pairs contiguous)?
    Not: MatMuls of two activations (B is not paired), convs on NCHW inputs (A's flattened K is strided)."""
    return n.op == "PackedMatMul" or (n.op == "PackedConv" and bool(n.attrs.get("in_block")))


def lower_precision(g: Graph, target: Target | None = None) -> Graph:
    casts: dict[int, Value] = {}   # id(float32 value) → its bf16 Cast
    keep_fp32 = pairs_only(target)
    readers = g.consumers()
    outputs = {id(v) for v in g.outputs}
    dropped: set[int] = set()      # ToBlocked nodes rebuilt on bf16
    old, g.nodes = g.nodes, []     # rebuilt in order: g.add appends the casts before their anchors

    def cast(v: Value) -> Value:
        if id(v) in casts:
            return casts[id(v)]
        reorder = v.producer
        if reorder is not None and reorder.op == "ToBlocked" and id(v) not in outputs \
                and len(readers.get(id(v), [])) == 1:
            # ToBlocked(x) read by this anchor alone: ToBlocked(Cast(x)) instead, so that the Cast inlines into the
            # reorder (one kernel writing half the bytes) rather than being a kernel of its own after it
            (casts[id(v)],) = g.add("ToBlocked", [cast(reorder.inputs[0])], dict(reorder.attrs), reorder.name,
                                    [g.fresh(v.name + ".bf16")])
            dropped.add(id(reorder))
        else:
            (casts[id(v)],) = g.add("Cast", [v], {"to": BF16}, f"{v.name}.to_bf16", [g.fresh(v.name + ".bf16")])
        return casts[id(v)]

    for n in old:
        if _convertible(n) and keep_fp32 and not _pair_tile_takes(n):
            n.attrs["precision"] = "fp32"
            n.attrs["bf16_kept_fp32"] = True   # exe.meta["precision"] says "fp32" for it
        if not _convertible(n):
            g.nodes.append(n)
            continue
        ins = list(n.inputs)
        ins[0] = cast(ins[0])
        w = _weights(n)
        if w is not None:
            ins[1] = Value(g.fresh(ins[1].name + ".bf16"), TensorType(BF16, w.shape), const=w)
        elif ins[1].dtype == "float32":             # MatMul of two activations (attention)
            ins[1] = cast(ins[1])
        n.inputs = ins
        if n.op in ("PackedMatMul", "PackedConv"):
            n.attrs["vnni"] = True
        g.nodes.append(n)
    g.nodes = [n for n in g.nodes if id(n) not in dropped]
    return g
