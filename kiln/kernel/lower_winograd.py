"""Lowerings of the Winograd F(2×2, 3×3) stages (graph/passes/winograd.py), scheduled by schedule/winograd.py.

    Bᵀ = [[1, 0, −1, 0], [0, 1, 1, 0], [0, −1, 1, 0], [0, 1, 0, −1]]     Aᵀ = [[1, 1, 1, 0], [0, 1, −1, −1]]

The transforms are written as selects over the transform index (r, c, or the output parity), each arm a sum
of ±1 terms; once the schedule makes that index a constant (unrolled), the selects fold away and each value
is two to four additions of loads."""
from __future__ import annotations

from collections.abc import Callable

from kiln.graph.ir import Node
from kiln.kernel.ir import Cast, Compute, Const, Expr, Load, Reduce, Select, Var, cmp
from kiln.kernel.lower import Lowered, _out, guarded_window, ld, lowering


def bt_row(r: Expr, f: Callable[[int], Expr]) -> Expr:
    """Row r of Bᵀ applied to f(0..3)."""
    return Select(cmp("==", r, 0), f(0) - f(2), Select(cmp("==", r, 1), f(1) + f(2),
                                                          Select(cmp("==", r, 2), f(2) - f(1), f(1) - f(3))))


def at_row(i: Expr, f: Callable[[int], Expr]) -> Expr:
    """Row i of Aᵀ applied to f(0..3)."""
    return Select(cmp("==", i, 0), f(0) + f(1) + f(2), f(1) - f(2) - f(3))


@lowering("WinogradInput")
def lower_winograd_input(n: Node) -> Lowered:
    """V[b, r, c, cib, t, ci] = Σ Bᵀ[r, a] Bᵀ[c, b'] X[b, cib, 2·th + a − pt, 2·tw + b' − pl, ci], t = th·TW + tw,
    the padding (and the last tiles' overhang) read as zeros through guards."""
    (x,), (v, ax) = n.inputs, _out(n)
    b, r, c, cib, t, ci = ax
    tw_n = -(-n.attrs["out_hw"][1] // 2)
    pt, pl = n.attrs["pads"][0], n.attrs["pads"][1]
    th, tw = t // tw_n, t % tw_n

    def d(a: int, bb: int) -> Expr:
        return guarded_window(x, (b, cib), (th * 2 + (a - pt), tw * 2 + (bb - pl)), (ci,))
    body = bt_row(r, lambda a: bt_row(c, lambda bb: d(a, bb)))
    if v.dtype != x.dtype:  # a bf16 product's V (graph/passes/winograd.py): summed in float32, rounded once
        body = Cast(v.dtype, body)
    return Lowered([Compute(v.name, ax, v.shape, body, hints={"winograd": "input"})])


@lowering("WinogradProduct")
def lower_winograd_product(n: Node) -> Lowered:
    """M[b, r, c, cob, t, co] = Σ_{cib, ci} V[b, r, c, cib, t, ci] · U[r, c, cob, cib, ci, co]: per (r, c) a blocked
    1×1 conv over the tiles — the conv register tile (rows: tiles t, vectors: co)."""
    (vv, u), (m, ax) = n.inputs, _out(n)
    b, r, c, cob, t, co = ax
    cib, ci = Var("rcb"), Var("rc")
    # bf16: U in VNNI pairs, U[r, c, cob, cib, ci // 2, co, ci % 2] (the vdpbf16ps tile's form, schedule/bf16.py)
    u_at = (r, c, cob, cib) + ((ci // 2, co, ci % 2) if len(u.shape) == 7 else (ci, co))
    body = Reduce("sum", ((cib, vv.shape[3]), (ci, vv.shape[5])),
                  Load(vv.name, (b, r, c, cib, t, ci), vv.dtype) * Load(u.name, u_at, u.dtype))
    hints = {"nr": n.attrs["nr"], "n_axis": -1, "m_axis": -2, "in_block": vv.shape[5], "out_block": n.attrs["nr"],
             "block_axis": 3, "rows_outer": True}
    return Lowered([Compute(m.name, ax, m.shape, body, hints=hints)])


@lowering("WinogradOutput")
def lower_winograd_output(n: Node) -> Lowered:
    """y[b, cob, oh, ow, co] = Σ Aᵀ[oh % 2, r] Aᵀ[ow % 2, c] M[b, r, c, cob, t, co] (+ bias),
    t = (oh // 2)·TW + ow // 2."""
    mm, (y, ax) = n.inputs[0], _out(n)
    b, cob, oh, ow, co = ax
    tw_n = -(-n.attrs["out_hw"][1] // 2)
    t = (oh // 2) * tw_n + ow // 2
    body = at_row(oh % 2, lambda r: at_row(ow % 2, lambda c: Load(mm.name, (b, Const(r, "int64"), Const(c, "int64"),
                                                                          cob, t, co), mm.dtype)))
    if len(n.inputs) > 1:
        body = body + ld(n.inputs[1], (cob * y.shape[-1] + co,))
    return Lowered([Compute(y.name, ax, y.shape, body, hints={"winograd": "output"})])
