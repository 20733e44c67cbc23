"""Lowering of PackedMatMul (see graph/passes/pack_weights.py): B is read from its panel layout."""
from __future__ import annotations

from kiln.graph.ir import Node
from kiln.kernel.ir import Compute, Load, Reduce, Var
from kiln.kernel.lower import Lowered, _out, bcast_index, ld, lowering


@lowering("PackedMatMul")
def lower_packed_matmul(n: Node) -> Lowered:
    (a, bp), (y, ax) = n.inputs, _out(n)
    nr, k = n.attrs["nr"], Var("rk")
    j = ax[-1]
    ia = bcast_index(a.shape[:-2], ax[:-2]) + (ax[-2], k)
    body = Reduce("sum", ((k, a.shape[-1]),), ld(a, ia) * Load(bp.name, (j // nr, k, j % nr), bp.dtype))
    return Lowered([Compute(y.name, ax, y.shape, body, hints={"nr": nr, "m_axis": len(ax) - 2})])
