"""The dot-product forms of the 8-bit and bf16 anchors: which load is the activation, which the weight in VNNI order
(graph/quant_pack.py, graph/passes/precision.py), and the reduction axis taken `group` values at a time. Read by
the register tile (schedule/int8.py, schedule/bf16.py) and the int8 microkernel nest (schedule/dot_ukernel.py)."""
from __future__ import annotations

from dataclasses import dataclass

from kiln.kernel.dot import Dot2, Dot4
from kiln.kernel.ir import Bin, Cast, Compute, Const, Expr, Load, Reduce, Var, walk


@dataclass(frozen=True)
class DotForm:
    """The parts of a dot-product anchor's compute the tile needs (an integer anchor's, or a bf16 one's:
    schedule/bf16.py)."""
    red: Reduce
    a: Load           # the activation read (uint8 / int8 / bfloat16)
    b: Load           # the weight read, B[.., k // group, .., k % group]
    k: Var            # the reduction axis taken `group` at a time (the last one)
    k_ext: int
    group: int = 4    # operand values summed into one accumulator lane: 4 bytes (Dot4), or a pair (Dot2: bf16, or
    #                   8-bit activations by int16 weights on x86 without VNNI, graph/quant_pack.py dot_group)

    def dot(self, acc: Expr, a: Load, b: Load) -> Expr:
        return Dot4(acc, a, b) if self.group == 4 else Dot2(acc, a, b)


def grouped_reads(red: Reduce, a: Expr, b: Expr, group: int) -> DotForm | None:
    """The form if `a` reads the reduction's last axis k contiguously and `b` reads it as
    [.., k // group, .., k % group]
    (weights packed with the group innermost)."""
    k, k_ext = red.axes[-1]
    if not (isinstance(a, Load) and isinstance(b, Load)):
        return None
    g = Const(group, "int64")
    if a.index[-1] != k or Bin("//", k, g) not in b.index or b.index[-1] != Bin("%", k, g):
        return None
    return DotForm(red, a, b, k, k_ext, group)


def int8_form(c: Compute) -> DotForm | None:
    reds = [e for e in walk(c.body) if isinstance(e, Reduce)]
    if len(reds) != 1 or reds[0].op != "sum" or reds[0].dtype != "int32":
        return None
    red = reds[0]
    body = red.body
    if not (isinstance(body, Bin) and body.op == "*" and all(isinstance(x, Cast) for x in (body.a, body.b))):
        return None
    a, b = body.a.a, body.b.a
    if not (isinstance(a, Load) and isinstance(b, Load)) or a.dtype not in ("uint8", "int8") or \
            b.dtype not in ("int8", "int16"):
        return None
    return grouped_reads(red, a, b, 4 if b.dtype == "int8" else 2)
