"""Elementwise rules as data: each core op → the expression it computes (`UNARY`, `BINARY`), and the math they
share (log1p, atan, pow by a constant, round to float16, ...), all built from kernel IR primitives so that every
target's codegen vectorizes them (codegen/mathfn.py for exp/log/erf/tanh). kernel/lower.py wraps them in computes."""
from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from kiln.kernel.ir import Bin, Cast, Const, Expr, Select, Un, cmp, const_like, maximum, minimum


def f(v: float, like: Expr) -> Const:
    return const_like(v, like)


# -- elementwise rules: core op → expression builder --------------------------------------------------------
def _log1p(y: Expr) -> Expr:
    """log(1 + y), accurate for tiny y too: log(u)·y/(u − 1) with u = 1 + y rounded (Goldberg's trick)."""
    u = y + 1.0
    return Select(cmp("==", u, 1.0), y, Un("log", u) * (y / (u - 1.0)))


def _softplus(x: Expr) -> Expr:
    return Select(cmp(">", x, 20.0), x, _log1p(Un("exp", x)))


UNARY: dict[str, Callable[[Expr, dict], Expr]] = {
    "Relu": lambda x, a: maximum(x, f(0, x)),
    "Sigmoid": lambda x, a: Un("sigmoid", x),
    "Tanh": lambda x, a: Un("tanh", x), "Exp": lambda x, a: Un("exp", x), "Log": lambda x, a: Un("log", x),
    "Sqrt": lambda x, a: Un("sqrt", x), "Neg": lambda x, a: Un("neg", x), "Abs": lambda x, a: Un("abs", x),
    "Erf": lambda x, a: Un("erf", x), "Reciprocal": lambda x, a: f(1, x) / x,
    "Floor": lambda x, a: Un("floor", x), "Ceil": lambda x, a: Un("ceil", x),
    "Round": lambda x, a: Un("round", x), "Not": lambda x, a: Un("not", x), "Identity": lambda x, a: x,
    "Sin": lambda x, a: Un("sin", x), "Cos": lambda x, a: Un("cos", x),
    "Softplus": lambda x, a: _softplus(x),
    "Sign": lambda x, a: Select(cmp(">", x, 0), f(1, x), Select(cmp("<", x, 0), f(-1, x), f(0, x))),
    "Clip": lambda x, a: clip(x, a["min"], a["max"]),
    "LeakyRelu": lambda x, a: Select(cmp(">=", x, 0.0), x, x * a["alpha"]),
    "Elu": lambda x, a: Select(cmp(">=", x, 0.0), x, (Un("exp", x) - 1.0) * a["alpha"]),
    "Celu": lambda x, a: Select(cmp(">=", x, 0.0), x, (Un("exp", x * (1 / a["alpha"])) - 1.0) * a["alpha"]),
    "ThresholdedRelu": lambda x, a: Select(cmp(">", x, a["alpha"]), x, f(0, x)),
    "HardSigmoid": lambda x, a: clip(x * a["alpha"] + a["beta"], 0.0, 1.0),
    "HardSwish": lambda x, a: x * clip(x * (1 / 6) + 0.5, 0.0, 1.0),
    "Mish": lambda x, a: x * Un("tanh", _softplus(x)),
    "Selu": lambda x, a: Select(cmp(">", x, 0.0), x * a["gamma"],
                                (Un("exp", x) - 1.0) * (a["alpha"] * a["gamma"])),
    "Gelu": lambda x, a: x * 0.5 * (_gelu_inner(x, a["approximate"]) + 1.0),
    "Cast": lambda x, a: cast(x, a["to"]),
    "RoundFloat16": lambda x, a: _round_float16(x),
    "Tan": lambda x, a: Un("sin", x) / Un("cos", x),
    "Sinh": lambda x, a: _sinh(x), "Cosh": lambda x, a: (Un("exp", x) + Un("exp", Un("neg", x))) * 0.5,
    "Atan": lambda x, a: _atan(x),
    "Asin": lambda x, a: _atan(x / Un("sqrt", (f(1.0, x) - x) * (x + 1.0))),
    "Acos": lambda x, a: _atan(Un("sqrt", (f(1.0, x) - x) / (x + 1.0))) * 2.0,
    "Asinh": lambda x, a: _copysign(_log1p(Un("abs", x) + x * x / (Un("sqrt", x * x + 1.0) + 1.0)), x),
    "Acosh": lambda x, a: Un("log", x + Un("sqrt", (x - 1.0) * (x + 1.0))),
    "Atanh": lambda x, a: _log1p(x * 2.0 / (f(1.0, x) - x)) * 0.5,
    "Softsign": lambda x, a: x / (Un("abs", x) + 1.0),
    "Swish": lambda x, a: x * Un("sigmoid", x * a["alpha"]),
    "Shrink": lambda x, a: Select(cmp("<", x, -a["lambd"]), x + a["bias"],
                                  Select(cmp(">", x, a["lambd"]), x - a["bias"], f(0, x))),
    "IsNaN": lambda x, a: cmp("!=", x, x),
    "IsInf": lambda x, a: _isinf(x, a["positive"], a["negative"]),
}


def _copysign(mag: Expr, like: Expr) -> Expr:
    return Select(cmp("<", like, 0.0), Un("neg", mag), mag)


def _sinh(x: Expr) -> Expr:
    """(eˣ − e⁻ˣ)/2, and its Taylor series near 0, where the difference cancels."""
    x2 = x * x
    small = x + x * x2 * (f(1 / 6, x) + x2 * (1 / 120))
    return Select(cmp("<", Un("abs", x), 0.1), small, (Un("exp", x) - Un("exp", Un("neg", x))) * 0.5)


def _atan(x: Expr) -> Expr:
    """Cephes' atanf: reduce to |t| ≤ tan(π/8) with π/2 − atan(1/x) and π/4 + atan((x−1)/(x+1)), then a
    degree-9 odd polynomial (≈ 1 ulp)."""
    a = Un("abs", x)
    big, mid = cmp(">", a, 2.414213562373095), cmp(">", a, 0.4142135623730950)
    t = Select(big, f(-1.0, a) / a, Select(mid, (a - 1.0) / (a + 1.0), a))
    base = Select(big, f(math.pi / 2, a), Select(mid, f(math.pi / 4, a), f(0.0, a)))
    z = t * t
    p = (((z * 8.05374449538e-2 - 1.38776856032e-1) * z + 1.99777106478e-1) * z - 3.33329491539e-1) * z * t + t
    return _copysign(base + p, x)


def _isinf(x: Expr, positive: int, negative: int) -> Expr:
    pos, neg = cmp("==", x, math.inf), cmp("==", x, -math.inf)
    if positive and negative:
        return Bin("or", pos, neg)
    return pos if positive else neg if negative else Bin("and", pos, neg)  # neither: all false


def _round_float16(x: Expr) -> Expr:
    """x rounded to the nearest float16 value, in float32 arithmetic (IEEE, no fast-math): Veltkamp's split
    keeps 11 significant bits; below 2^-14 (half subnormals) adding and removing 0.75 rounds to a multiple of
    2^-24; beyond the largest half (65504) it overflows to ±inf."""
    c = x * 8193.0                      # 2^13 + 1
    normal = c - (c - x)
    tiny = (x + 0.75) - 0.75
    tiny = Select(cmp("==", tiny, 0.0), x * 0.0, tiny)  # a zero keeps x's sign
    r = Select(cmp("<", Un("abs", x), 2.0 ** -14), tiny, normal)
    big = Select(cmp(">", x, 0.0), f(math.inf, x), Select(cmp("<", x, 0.0), f(-math.inf, x), x))  # NaN stays
    return Select(cmp("<", Un("abs", x), 65520.0), r, big)


def _gelu_inner(x: Expr, approximate: str) -> Expr:
    if approximate == "none":
        return Un("erf", x * (1 / math.sqrt(2)))
    return Un("tanh", (x + x * x * x * 0.044715) * math.sqrt(2 / math.pi))


def clip(x: Expr, lo: float, hi: float) -> Expr:
    if x.dtype.startswith(("int", "uint")):
        lo, hi = max(lo, np.iinfo(x.dtype).min), min(hi, np.iinfo(x.dtype).max)
    y = maximum(x, f(lo, x)) if lo > -math.inf else x
    return minimum(y, f(hi, x)) if hi < math.inf else y


def cast(x: Expr, to: str) -> Expr:
    if to == x.dtype:
        return x
    if to == "bool":
        return cmp("!=", x, f(0, x))
    return Cast(to, x)


BINARY: dict[str, Callable[[Expr, Expr], Expr]] = {
    "Add": lambda a, b: a + b, "Sub": lambda a, b: a - b, "Mul": lambda a, b: a * b,
    "Div": lambda a, b: a / b, "Pow": lambda a, b: _pow(a, b), "Max": maximum, "Min": minimum,
    "PRelu": lambda a, b: Select(cmp(">=", a, 0.0), a, a * b),
    "Equal": lambda a, b: cmp("==", a, b), "Less": lambda a, b: cmp("<", a, b),
    "Greater": lambda a, b: cmp(">", a, b), "LessOrEqual": lambda a, b: cmp("<=", a, b),
    "GreaterOrEqual": lambda a, b: cmp(">=", a, b), "And": lambda a, b: Bin("and", a, b),
    "Or": lambda a, b: Bin("or", a, b), "Xor": lambda a, b: Bin("xor", a, b),
    "BitAnd": lambda a, b: Bin("and", a, b), "BitOr": lambda a, b: Bin("or", a, b),
    "BitXor": lambda a, b: Bin("xor", a, b),
}

def _pow(a: Expr, b: Expr) -> Expr:
    if a.dtype.startswith(("int", "uint")):  # integer powers go through double, as onnxruntime's do
        return Cast(a.dtype, Bin("pow", Cast("float64", a), cast(b, "float64")))
    if isinstance(b, Const) and np.isfinite(float(b.value)):
        return _pow_const(a, float(b.value))
    return Bin("pow", a, cast(b, a.dtype))


MAX_POW_MULTIPLIES = 64  # |n| up to this: x^n by squaring (≤ 2·log2(n) multiplies, error ≈ their count in ulp)


def _int_pow(x: Expr, n: int) -> Expr:
    """x^n, n ≥ 1, by repeated squaring (x·x·x for n = 3)."""
    out: Expr | None = None
    sq = x
    while n:
        if n & 1:
            out = sq if out is None else out * sq
        n >>= 1
        if n:
            sq = sq * sq
    assert out is not None
    return out


def _pow_const(x: Expr, e: float) -> Expr:
    """pow(x, e) for a constant e without a per-lane libm call (llvm.pow.v16f32 is sixteen scalar powf calls):
    integer e → multiplies, half-integer e → multiplies and one sqrt, a reciprocal for negative e; any other e →
    exp(e·log|x|) on the vector exp/log (codegen/mathfn.py). C's pow at ±0 and ±inf kept exact."""
    zero, inf, one = f(0.0, x), f(math.inf, x), f(1.0, x)
    n2 = 2 * e
    if n2 == int(n2) and abs(e) <= MAX_POW_MULTIPLIES:
        whole, half = divmod(abs(int(n2)), 2)
        if whole == 0 and half == 0:
            return one                                   # pow(x, 0) = 1, even for NaN
        parts = ([_int_pow(x, whole)] if whole else []) + ([Un("sqrt", x)] if half else [])
        mag = parts[0] if len(parts) == 1 else parts[0] * parts[1]
        r = one / mag if e < 0 else mag
        if not half:
            return r
        r = Select(cmp("==", x, zero), zero if e > 0 else inf, r)    # pow(−0, k/2) = +0 (√−0 = −0)
        return Select(cmp("==", x, -inf), zero if e < 0 else inf, r)  # √−inf is NaN, pow(−inf, k/2) is not
    odd = e == int(e) and int(e) % 2 == 1
    r = Un("exp", Un("log", Un("abs", x) if e == int(e) else x) * e)  # x < 0 (non-integer e), NaN → NaN
    if odd:
        r = Select(cmp("<", x, zero), -r, r)
    big = inf if e > 0 else zero                         # pow at |x| = inf, and the overflow side
    r = Select(cmp("==", Un("abs", x), inf), Select(cmp("<", x, zero), -big, big) if odd else big, r)
    return Select(cmp("==", x, zero), zero if e > 0 else inf, r)  # pow at x = ±0 (the sign of −0 aside)


def mod(a: Expr, b: Expr, fmod: int) -> Expr:
    """fmod=1: C fmod/srem (the dividend's sign); fmod=0 (integers): moved by b when the signs differ."""
    r = a % b
    if fmod:
        return r
    zero = f(0, r)
    wrong = Bin("and", cmp("!=", r, zero), Bin("xor", cmp("<", r, zero), cmp("<", b, zero)))
    out = Select(wrong, r + b, r)
    if r.dtype.startswith("float"):  # a zero remainder takes the divisor's sign (Python's %)
        out = Select(cmp("==", r, zero), Select(cmp("<", b, zero), Un("neg", zero), zero), out)
    return out
