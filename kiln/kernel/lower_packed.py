"""Lowerings of the packed anchors (see graph/passes/pack_weights.py and block_layout.py): weights read from
their panels, activations in NCHW or in the blocked layout xb[N, C/cb, H, W, cb]."""
from __future__ import annotations

from kiln.graph.ir import Node
from kiln.kernel.ir import Compute, Expr, Load, Reduce, Var
from kiln.kernel.lower import Lowered, _out, _padded, bcast_index, guarded_window, ld, lowering


@lowering("PackedMatMul")
def lower_packed_matmul(n: Node) -> Lowered:
    (a, bp), (y, ax) = n.inputs, _out(n)
    nr, k = n.attrs["nr"], Var("rk")
    j = ax[-1]
    ia = bcast_index(a.shape[:-2], ax[:-2]) + (ax[-2], k)
    # bf16 panels hold K in pairs (VNNI order, graph/passes/precision.py): Bv[n // NR, k // 2, n % NR, k % 2]
    w_at = (j // nr, k // 2, j % nr, k % 2) if n.attrs.get("vnni") else (j // nr, k, j % nr)
    body = Reduce("sum", ((k, a.shape[-1]),), ld(a, ia) * Load(bp.name, w_at, bp.dtype))
    return Lowered([Compute(y.name, ax, y.shape, body, hints={"nr": nr, "n_axis": -1, "m_axis": -2})])


@lowering("PackedConv")
def lower_packed_conv(n: Node) -> Lowered:
    """out[b, co, oh, ow] = Σ X[b, ci, oh·s + kh·d, ow·s + kw·d] · W[co, ci, kh, kw] (+ bias), with

      weights  Wp[co // NR, ci, kh, kw, co % NR], or Wp[co // NR, ci // cb, kh, kw, ci % cb, co % NR] for a
               blocked input (reduction order: input-channel blocks, taps, channels in the block), or
               Wd[c // NR, kh, kw, c % NR] for a depthwise conv (blocked in and out);
      input    X[b, ci, ih, iw] or Xb[b, ci // cb, ih, iw, ci % cb];
      output   out[b, co, oh, ow] (vectors over co: n axis 1) or out[b, co // NR, oh, ow, co % NR] (n axis last).

    The tile's rows run over the output row (m axis ow); `spatial` names (oh, ow) for tiles that cross rows."""
    x, wp = n.inputs[0], n.inputs[1]
    y, ax = _out(n)
    a = n.attrs
    nr, ib, ob, vnni = a["nr"], a.get("in_block", 0), a.get("out_block", 0), bool(a.get("vnni"))
    nd = len(a["kernel"])
    depthwise = a["group"] > 1
    b, sp_out = ax[0], ax[2:2 + nd]
    if ob:
        cob, coi = ax[1], ax[-1]
        co: Expr = cob * nr + coi
    else:
        co = ax[1]
        cob, coi = co // nr, co % nr
    # a depthwise conv reads its padding through guards (its interior tiles drop them: schedule/guards.py); a
    # dense one from a padded copy (its rows may cross output-row ends, where guards would not be affine)
    pre, tmp, src = ([], None, x.name) if depthwise else _padded(x, a["pads"], 0.0, f"{y.name}.pad")
    ks = tuple(Var(f"rk{i}") for i in range(nd))
    sp = tuple(sp_out[i] * a["strides"][i] + ks[i] * a["dilations"][i] for i in range(nd))
    taps = tuple(zip(ks, a["kernel"]))
    if depthwise:  # blocked in and out: channel co = (cob, coi) of the input too
        xs = guarded_window(x, (b, cob), tuple(p - a["pads"][i] for i, p in enumerate(sp)), (coi,))
        w = Load(wp.name, (cob,) + ks + (coi,), wp.dtype)
        axes = taps
    elif ib:
        cib, cii = Var("rcb"), Var("rc")
        xs = Load(src, (b, cib) + sp + (cii,), x.dtype)
        # bf16 weights pair the block's channels (VNNI order): Wv[cob, cib, kh, kw, cii // 2, coi, cii % 2]
        w = Load(wp.name, (cob, cib) + ks + ((cii // 2, coi, cii % 2) if vnni else (cii, coi)), wp.dtype)
        axes = ((cib, x.shape[1]),) + taps + ((cii, ib),)
    else:
        ci = Var("rc")
        xs = Load(src, (b, ci) + sp, x.dtype)
        if vnni:  # pairs along the flattened reduction k = (ci, kh, kw): Wv[cob, k // 2, coi, k % 2]
            kf: Expr = ci
            for kv, e in zip(ks, a["kernel"]):
                kf = kf * e + kv
            w = Load(wp.name, (cob, kf // 2, coi, kf % 2), wp.dtype)
        else:
            w = Load(wp.name, (cob, ci) + ks + (coi,), wp.dtype)
        axes = ((ci, x.shape[1]),) + taps
    body: Expr = Reduce("sum", axes, xs * w)
    if len(n.inputs) > 2:
        body = body + ld(n.inputs[2], (co,))
    # axes counted from the end: fuse_contiguous_axes may merge an NCHW output's (oh, ow) into one (and drops
    # `spatial`, the two axes a tile may flatten)
    last = -2 if ob else -1
    hints = {"nr": nr, "n_axis": -1 if ob else 1, "m_axis": last, "in_block": ib, "out_block": ob,
             "depthwise": depthwise}
    if nd == 2:
        hints["spatial"] = (last - 1, last)
    comp = Compute(y.name, ax, y.shape, body, hints=hints)
    return Lowered(pre + [comp], [tmp] if tmp else [])
