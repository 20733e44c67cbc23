"""Clamps a fused body already satisfies, dropped: a float value's range is known through constant clamps,
round, + − × by a constant, and max(x, c) / min(x, c) is x when that range is already on the right side of c.

The int8 epilogue is the case: a ReLU6 folded into the requantization clamps to the quantized range, and the
Quantize that follows clamps the rounded value to the same range again —

    u8(min(max(round(min(max(acc·s, 0), 255)), 0), 255))  →  u8(round(min(max(acc·s, 0), 255)))

two of the ~10 vector operations per output vector of an epilogue that, at mobilenetv2's small K (16–96), costs
about as much as the dot products. kernel/build.py applies it to bodies with an integer result (where such a
clamp sits before the narrowing convert). A NaN is unaffected: the kept clamp passes it on (codegen/exprs.py's constant
bounds propagate NaN), as the dropped one would have."""
from __future__ import annotations

import math
from collections.abc import Callable

from kiln.kernel.ir import Bin, Const, Expr, Un, children, is_float, rebuild

Range = tuple[float, float]
ANY: Range = (-math.inf, math.inf)


def _c(e: Expr) -> float | None:
    return float(e.value) if isinstance(e, Const) and isinstance(e.value, (int, float)) else None


# how a float op with a constant right operand maps its left operand's range
BOUNDS: dict[str, Callable[[Range, float], Range]] = {
    "max": lambda r, c: (max(r[0], c), max(r[1], c)),
    "min": lambda r, c: (min(r[0], c), min(r[1], c)),
    "+": lambda r, c: (r[0] + c, r[1] + c),
    "-": lambda r, c: (r[0] - c, r[1] - c),
    "*": lambda r, c: (min(r[0] * c, r[1] * c), max(r[0] * c, r[1] * c)) if c != 0 else (0.0, 0.0),
    "/": lambda r, c: (min(r[0] / c, r[1] / c), max(r[0] / c, r[1] / c)) if c != 0 else ANY,
}


def float_range(e: Expr) -> Range:
    """Bounds of float e's non-NaN values (±inf where unknown)."""
    c = _c(e)
    if c is not None:
        return (c, c)
    if isinstance(e, Un) and e.op == "round":
        lo, hi = float_range(e.a)
        # floor/ceil: bounds whatever the tie rule (round half even or away from zero)
        return (float(math.floor(lo)) if math.isfinite(lo) else lo, float(math.ceil(hi)) if math.isfinite(hi) else hi)
    if isinstance(e, Bin) and e.op in BOUNDS and _c(e.b) is not None:
        r = BOUNDS[e.op](float_range(e.a), _c(e.b))
        return ANY if any(math.isnan(x) for x in r) else r
    return ANY


def drop_satisfied_clamps(e: Expr) -> Expr:
    """e with every float max(x, c) / min(x, c) whose x is already ≥ c / ≤ c replaced by x; each shared subtree
    visited once, an unchanged subtree kept as it is."""
    return _drop_clamps(e, {})  # id → (node, its rewrite); the node kept so its id is not reused


def _drop_clamps(x: Expr, done: dict[int, tuple[Expr, Expr]]) -> Expr:
    hit = done.get(id(x))
    if hit is not None:
        return hit[1]
    kids = children(x)
    new = [_drop_clamps(k, done) for k in kids]
    out = rebuild(x, new) if any(n is not k for n, k in zip(new, kids)) else x
    if isinstance(out, Bin) and out.op in ("max", "min") and is_float(out.dtype) and _c(out.b) is not None:
        lo, hi = float_range(out.a)
        if (out.op == "max" and lo >= _c(out.b)) or (out.op == "min" and hi <= _c(out.b)):
            out = out.a
    done[id(x)] = (x, out)
    return out
