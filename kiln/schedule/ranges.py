"""Clamps and tests that a loop box decides: over the box `ranges` (loop variable → extent, each from 0), an
affine integer index e has its least and greatest values at corners, so

    max(e, lo) → e        when min(e) ≥ lo          e ≥ c → true / false   when min(e) ≥ c / max(e) < c
    min(e, hi) → e        when max(e) ≤ hi          e < c → true / false   when max(e) < c / min(e) ≥ c
    select(true, a, b) → a, select(false, a, b) → b, true ∧ x → x, false ∧ x → false

A layout reorder of a padded input (the int8 stem's quantize + ToBlocked with its channel pad) carried
`min(max(w, 0), W − 1)` along the vectorized row: its loads were gathers, 0.054 ms for a 224×224×3 input; with the
clamps gone they are row loads (schedule/reorder.py)."""
from __future__ import annotations

from collections.abc import Callable

from kiln.kernel.analysis import box_corner
from kiln.kernel.ir import Bin, Const, Expr, Select, Var, children, rebuild, uses_var, value_at

TRUE, FALSE = Const(True, "bool"), Const(False, "bool")


def affine_bounds(e: Expr, ranges: dict[Var, int]) -> tuple[int, int] | None:
    """(least, greatest) of integer e over the box, or None when e is not affine in the box's variables with
    constant coefficients, or holds anything else that varies (another loop variable, a load)."""
    if not e.dtype.startswith(("int", "uint")):
        return None
    least, greatest = box_corner(e, ranges, least=True), box_corner(e, ranges, least=False)
    lo = None if least is None else value_at(least, {})
    hi = None if greatest is None else value_at(greatest, {})
    return None if lo is None or hi is None else (lo, hi)


def _const(e: Expr) -> int | None:
    return int(e.value) if isinstance(e, Const) and isinstance(e.value, (int, bool)) else None


# op → (bounds of a, constant b) → the rewritten node's replacement: "a" (the operand), a bool, or None (keep)
RULES: dict[str, Callable[[tuple[int, int], int], str | bool | None]] = {
    "max": lambda r, c: "a" if r[0] >= c else None,
    "min": lambda r, c: "a" if r[1] <= c else None,
    ">=": lambda r, c: True if r[0] >= c else False if r[1] < c else None,
    "<": lambda r, c: True if r[1] < c else False if r[0] >= c else None,
}


def drop_decided(e: Expr, ranges: dict[Var, int]) -> Expr:
    """e with every clamp and test that the box decides rewritten (see the module docstring)."""
    if not any(uses_var(e, v) for v in ranges):
        return e
    e = rebuild(e, [drop_decided(k, ranges) for k in children(e)]) if children(e) else e
    if isinstance(e, Bin) and e.op in RULES and _const(e.b) is not None:
        bounds = affine_bounds(e.a, ranges)
        out = None if bounds is None else RULES[e.op](bounds, _const(e.b))
        if out == "a":
            return e.a
        if isinstance(out, bool):
            return TRUE if out else FALSE
    if isinstance(e, Bin) and e.op == "and":
        if FALSE in (e.a, e.b):
            return FALSE
        if e.a == TRUE or e.b == TRUE:
            return e.b if e.a == TRUE else e.a
    if isinstance(e, Select) and e.cond in (TRUE, FALSE):
        return e.a if e.cond == TRUE else e.b
    return e
