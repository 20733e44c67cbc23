"""Lowerings of the quantized core ops (kiln/graph/quant_ops.py) to compute definitions.

    Quantize     y[i] = to(clamp(roundeven(x[i] / s[i]) + zp[i], lo, hi))      (a division, as onnxruntime's)
    Dequantize   y[i] = f32(x[i] − zp[i]) · s[i]
    MatMulInteger / ConvInteger: the int32 reduction Σ (x − zx)·(w − zw) in plain integer arithmetic — the
    reference form, scheduled by the default schedule. The fast integer anchors (QMatMul, QConv: packed weights,
    u8 × s8 dot products) are built by the graph pass quantize_qdq and lowered in kernel/lower_qanchor.py."""
from __future__ import annotations

from kiln.graph.ir import Node
from kiln.graph.quant_ops import qrange
from kiln.kernel.dot import LaneDot4
from kiln.kernel.ir import Cast, Compute, Const, Expr, Load, Reduce, Un, Var
from kiln.kernel.lower import Lowered, _out, _padded, bcast_index, clamp, guarded_window, ld, lowering


def i32(e: Expr) -> Expr:
    return e if e.dtype == "int32" else Cast("int32", e)


def f32(e: Expr) -> Expr:
    if isinstance(e, Const):
        return Const(float(e.value), "float32")
    return e if e.dtype == "float32" else Cast("float32", e)


def quantize_expr(x: Expr, scale: Expr, zp: Expr, to: str) -> Expr:
    lo, hi = qrange(to)
    return Cast(to, clamp(Un("round", x / scale) + f32(zp), lo, hi))


def dequantize_expr(x: Expr, scale: Expr, zp: Expr) -> Expr:
    if x.dtype == "int32":
        return f32(x - zp) * scale
    if isinstance(zp, Const) and zp.value == 0:
        return f32(x) * scale
    return (f32(x) - f32(zp)) * scale


@lowering("Quantize")
def lower_quantize(n: Node) -> Lowered:
    y, ax = _out(n)
    x, s, zp = (ld(v, bcast_index(v.shape, ax)) for v in n.inputs)
    return Lowered([Compute(y.name, ax, y.shape, quantize_expr(x, s, zp, n.attrs["to"]))])


@lowering("Dequantize")
def lower_dequantize(n: Node) -> Lowered:
    y, ax = _out(n)
    x, s, zp = (ld(v, bcast_index(v.shape, ax)) for v in n.inputs)
    return Lowered([Compute(y.name, ax, y.shape, dequantize_expr(x, s, zp))])


@lowering("MatMulInteger")
def lower_matmul_integer(n: Node) -> Lowered:
    (a, b, az, bz), (y, ax) = n.inputs, _out(n)
    k = Var("rk")
    batch = ax[:-2]
    ia = bcast_index(a.shape[:-2], batch) + (ax[-2], k)
    ib = bcast_index(b.shape[:-2], batch) + (k, ax[-1])
    term = (i32(ld(a, ia)) - i32(ld(az, bcast_index(az.shape, ia)))) * \
        (i32(ld(b, ib)) - i32(ld(bz, bcast_index(bz.shape, ib))))
    return Lowered([Compute(y.name, ax, y.shape, Reduce("sum", ((k, a.shape[-1]),), term))])


@lowering("ConvInteger")
def lower_conv_integer(n: Node) -> Lowered:
    x, w, xz, wz = n.inputs
    y, ax = _out(n)
    a = n.attrs
    nd = len(x.shape) - 2
    cig, cog = w.shape[1], w.shape[0] // a["group"]
    fill = ld(xz, ())
    pre, tmp, src = _padded(x, a["pads"], fill, f"{y.name}.pad")
    ci = Var("rc")
    ks = tuple(Var(f"rk{i}") for i in range(nd))
    chan = ci if a["group"] == 1 else (ax[1] // cog) * cig + ci
    sp = tuple(ax[2 + i] * a["strides"][i] + ks[i] * a["dilations"][i] for i in range(nd))
    xs = Load(src, (ax[0], chan) + sp, x.dtype)
    wi = (ax[1], ci) + ks
    term = (i32(xs) - i32(fill)) * (i32(ld(w, wi)) - i32(ld(wz, bcast_index(wz.shape, wi))))
    body = Reduce("sum", ((ci, cig),) + tuple(zip(ks, w.shape[2:])), term)
    return Lowered(pre + [Compute(y.name, ax, y.shape, body)], [tmp] if tmp else [])


# -- the integer anchors (graph/passes/quantize_qdq.py) in their plain layouts --------------------------------------
def _addend(n: Node, at: tuple[Expr, ...]) -> Expr:
    """addend[n] (+ a_zp · negwsum[n] when the zero point is a run-time value)."""
    e = ld(n.inputs[2], at)
    if len(n.inputs) > 4:
        e = e + i32(ld(n.inputs[4], ())) * ld(n.inputs[3], at)
    return e


def product(x: Expr, w: Expr, acc: str) -> Expr:
    return (f32(x) * w) if acc == "float32" else (i32(x) * i32(w))


@lowering("QMatMul")
def lower_qmatmul(n: Node) -> Lowered:
    (a, w), (y, ax) = n.inputs[:2], _out(n)
    k = Var("rk")
    ia = bcast_index(a.shape[:-2], ax[:-2]) + (ax[-2], k)
    body = Reduce("sum", ((k, a.shape[-1]),), product(ld(a, ia), ld(w, (k, ax[-1])), "int32"))
    return Lowered([Compute(y.name, ax, y.shape, body + _addend(n, (ax[-1],)))])


@lowering("QConv")
def lower_qconv(n: Node) -> Lowered:
    x, w = n.inputs[:2]
    y, ax = _out(n)
    a = n.attrs
    acc = a["acc"]
    nd = len(x.shape) - 2
    cig, cog = w.shape[1], w.shape[0] // a["group"]
    pre, tmp, src = _padded(x, a["pads"], Const(int(a["fill"]), x.dtype), f"{y.name}.pad")
    ci = Var("rc")
    ks = tuple(Var(f"rk{i}") for i in range(nd))
    chan = ci if a["group"] == 1 else (ax[1] // cog) * cig + ci
    sp = tuple(ax[2 + i] * a["strides"][i] + ks[i] * a["dilations"][i] for i in range(nd))
    term = product(Load(src, (ax[0], chan) + sp, x.dtype), ld(w, (ax[1], ci) + ks), acc)
    body = Reduce("sum", ((ci, cig),) + tuple(zip(ks, w.shape[2:])), term) + _addend(n, (ax[1],))
    return Lowered(pre + [Compute(y.name, ax, y.shape, body)], [tmp] if tmp else [])


@lowering("QPackedMatMul")
def lower_qpacked_matmul(n: Node) -> Lowered:
    """out[.., m, n] = Σ_k a[.., m, k] · Bp[n // NR, k // G, n % NR, k % G] + addend[n]: the VNNI layout
    (graph/quant_pack.py: G = 4 int8, or 2 int16), scheduled by schedule/int8.py as dot products of k-groups."""
    (a, bp), (y, ax) = n.inputs[:2], _out(n)
    nr, k = n.attrs["nr"], Var("rk")
    j = ax[-1]
    ia = bcast_index(a.shape[:-2], ax[:-2]) + (ax[-2], k)
    g = bp.shape[-1]
    w = Load(bp.name, (j // nr, k // g, j % nr, k % g), bp.dtype)
    body = Reduce("sum", ((k, a.shape[-1]),), product(ld(a, ia), w, "int32")) + _addend(n, (j,))
    hints = {"int8": "matmul", "nr": nr, "n_axis": -1, "m_axis": -2}
    return Lowered([Compute(y.name, ax, y.shape, body, hints=hints)])


@lowering("QPackedConv")
def lower_qpacked_conv(n: Node) -> Lowered:
    """Blocked in and out (graph/passes/block_layout.py): out[b, cob, oh, ow, coi] =
      dense      Σ_{cib, kh, kw, ci} X[b, cib, oh·s + kh·d, ow·s + kw·d, ci] ·
                 Wp[cob, cib, kh, kw, ci // G, coi, ci % G] on a copy of X padded with its zero point (int32);
      depthwise  Σ_{kh, kw} i32(X[b, cob, ih, iw, coi]) · i32(Wd[cob, kh, kw, coi]), padding read through guards
                 that yield the zero point (int32, on the depthwise tile of schedule/tile.py: each product a 16-bit
                 pair with a zero upper half, so LLVM emits `vpdpwssd` / `pmaddwd`, no int→float convert per tap);
                 with `quads` (x86 with VNNI, kw ≤ 4: graph/passes/block_layout.py) Σ_kh lane_dot4(X at the row's kw
                 taps, Wq[cob, kh, coi, 0..3]) — one vpdpbusd per window row and 16 channels;
    plus addend[co]. The hints are PackedConv's (schedule/tile.py, schedule/int8.py)."""
    x, wp = n.inputs[0], n.inputs[1]
    y, ax = _out(n)
    a = n.attrs
    nr, ib = a["nr"], a["in_block"]
    b, cob, coi = ax[0], ax[1], ax[-1]
    sp_out = ax[2:4]
    ks = (Var("rk0"), Var("rk1"))
    sp = tuple(sp_out[i] * a["strides"][i] + ks[i] * a["dilations"][i] for i in range(2))
    taps = tuple(zip(ks, a["kernel"]))
    fill = Const(int(a["fill"]), x.dtype)
    pre, tmp = [], None
    if a["depthwise"] and a.get("quads"):  # a window row's taps, one 4-byte group per lane: LaneDot4
        row = sp[0] - a["pads"][0]
        xq = [guarded_window(x, (b, cob), (row, sp_out[1] * a["strides"][1] + q * a["dilations"][1] - a["pads"][1]),
                             (coi,), int(a["fill"])) if q < a["kernel"][1] else Const(0, x.dtype) for q in range(4)]
        w = Load(wp.name, (cob, ks[0], coi, Const(0, "int64")), wp.dtype)
        body = Reduce("sum", taps[:1], LaneDot4(Const(0, "int32"), *xq, w, a["dilations"][1] * x.shape[-1]))
    elif a["depthwise"]:
        xs = guarded_window(x, (b, cob), tuple(p - a["pads"][i] for i, p in enumerate(sp)), (coi,), int(a["fill"]))
        body = Reduce("sum", taps, product(xs, Load(wp.name, (cob,) + ks + (coi,), wp.dtype), "int32"))
    else:
        pre, tmp, src = _padded(x, a["pads"], fill, f"{y.name}.pad")
        cib, cii = Var("rcb"), Var("rc")
        xs = Load(src, (b, cib) + sp + (cii,), x.dtype)
        g = wp.shape[-1]
        w = Load(wp.name, (cob, cib) + ks + (cii // g, coi, cii % g), wp.dtype)
        body = Reduce("sum", ((cib, x.shape[1]),) + taps + ((cii, ib),), product(xs, w, "int32"))
    body = body + _addend(n, (cob * nr + coi,))
    hints = {"nr": nr, "n_axis": -1, "m_axis": -2, "in_block": ib, "out_block": nr, "depthwise": a["depthwise"],
             "spatial": (-3, -2)}
    if not a["depthwise"]:
        hints["int8"] = "conv"
    return Lowered(pre + [Compute(y.name, ax, y.shape, body, hints=hints)], [tmp] if tmp else [])
