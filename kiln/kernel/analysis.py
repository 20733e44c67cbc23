"""Index analysis shared by schedules and codegen: linearization and affine strides."""
from __future__ import annotations

from kiln.kernel.ir import Bin, Cast, Const, Expr, Load, Select, Un, Var


def coef(e: Expr, v: Var) -> int | None:
    """d(e)/d(v) if e is affine in v with a constant coefficient, else None."""
    if e == v:
        return 1
    if isinstance(e, (Const, Var)):
        return 0
    if isinstance(e, Bin):
        a, b = coef(e.a, v), coef(e.b, v)
        if a is None or b is None:
            return None
        if e.op in ("+", "-"):
            return a + b if e.op == "+" else a - b
        if e.op == "*":
            if a == 0 and b == 0:
                return 0
            if isinstance(e.b, Const) and b == 0:
                return a * int(e.b.value)
            if isinstance(e.a, Const) and a == 0:
                return b * int(e.a.value)
            return None
        return 0 if a == 0 and b == 0 else None
    if isinstance(e, Load):
        return 0 if all(coef(i, v) == 0 for i in e.index) else None
    if isinstance(e, (Un, Select, Cast)):
        kids = [e.a] if not isinstance(e, Select) else [e.cond, e.a, e.b]
        return 0 if all(coef(k, v) == 0 for k in kids) else None
    return None


def flat_index(index: tuple[Expr, ...], shape: tuple[int, ...]) -> Expr:
    """Row-major linearization, folding away size-1 dims and zero indices."""
    flat: Expr | None = None
    stride = 1
    for i, d in reversed(list(zip(index, shape))):
        if d != 1 and not (isinstance(i, Const) and i.value == 0):
            term = i if stride == 1 else i * stride
            flat = term if flat is None else term + flat
        stride *= d
    return flat if flat is not None else Const(0, "int64")
