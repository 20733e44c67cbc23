"""Lowerings of the packed anchors (see graph/passes/pack_weights.py): weights read from their panels."""
from __future__ import annotations

from kiln.graph.ir import Node
from kiln.kernel.ir import Compute, Expr, Load, Reduce, Var
from kiln.kernel.lower import Lowered, _out, _padded, bcast_index, ld, lowering


@lowering("PackedMatMul")
def lower_packed_matmul(n: Node) -> Lowered:
    (a, bp), (y, ax) = n.inputs, _out(n)
    nr, k = n.attrs["nr"], Var("rk")
    j = ax[-1]
    ia = bcast_index(a.shape[:-2], ax[:-2]) + (ax[-2], k)
    body = Reduce("sum", ((k, a.shape[-1]),), ld(a, ia) * Load(bp.name, (j // nr, k, j % nr), bp.dtype))
    return Lowered([Compute(y.name, ax, y.shape, body, hints={"nr": nr, "n_axis": -1, "m_axis": -2})])


@lowering("PackedConv")
def lower_packed_conv(n: Node) -> Lowered:
    """out[b, co, oh, ow] = Σ X[b, ci, oh·s + kh·d, ow·s + kw·d] · Wp[co // NR, ci, kh, kw, co % NR] (+ bias):
    the tile runs its vectors over co (n axis 1) and its rows over the last spatial axis."""
    x, wp = n.inputs[0], n.inputs[1]
    y, ax = _out(n)
    a = n.attrs
    nd = len(x.shape) - 2
    nr, co = a["nr"], ax[1]
    pre, tmp, src = _padded(x, a["pads"], 0.0, f"{y.name}.pad")
    ci = Var("rc")
    ks = tuple(Var(f"rk{i}") for i in range(nd))
    sp = tuple(ax[2 + i] * a["strides"][i] + ks[i] * a["dilations"][i] for i in range(nd))
    xs = Load(src, (ax[0], ci) + sp, x.dtype)
    w = Load(wp.name, (co // nr, ci) + ks + (co % nr,), wp.dtype)
    body: Expr = Reduce("sum", ((ci, x.shape[1]),) + tuple(zip(ks, a["kernel"])), xs * w)
    if len(n.inputs) > 2:
        body = body + ld(n.inputs[2], (co,))
    comp = Compute(y.name, ax, y.shape, body, hints={"nr": nr, "n_axis": 1, "m_axis": -1})
    return Lowered(([pre] if pre else []) + [comp], [tmp] if tmp else [])
