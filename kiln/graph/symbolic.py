"""Symbolic dimensions: a tensor dimension is an `int` or a sympy expression over named positive integer symbols.

    >>> s = symbol("seq")
    >>> normalize((s - 1) // 2 + 1)        # floor division of dims is sympy's floor(a/b): Python `//` gives it
    floor((seq - 1)/2) + 1
    >>> upper(3 * s, {"seq": (1, 512)}), evaluate(s * s, {"seq": 7})
    (1536, 49)

Every dimension that leaves a function here is normalized: a sympy Integer is always a Python `int`, so a
static shape is exactly the tuple of ints it was before symbols existed. A graph's symbols have inclusive bounds
(`Graph.bounds`, name → (lo, hi)); a symbol no one bounded ranges over (1, DEFAULT_BOUND).

Shape tensors whose values depend on symbols (Shape(x) of a symbolic x, and the arithmetic on it) are held as
NumPy object arrays of dims (`is_symbolic_array`) while the frontend folds them; they never reach a kernel."""
from __future__ import annotations

import contextlib
import contextvars
import functools
import itertools
from collections.abc import Iterable, Iterator

import numpy as np
import sympy

Dim = int | sympy.Expr
Bounds = dict[str, tuple[int, int]]

# The upper bound of a symbol no `dynamic_bounds=` entry names: the longest sequence the zoo's text models take.
# Tensors are planned at their upper bounds (the kernel half's "max layouts"), so this caps their memory.
DEFAULT_BOUND = 512

_BOUNDS: contextvars.ContextVar[Bounds | None] = contextvars.ContextVar("kiln_symbol_bounds", default=None)


@functools.cache
def symbol(name: str) -> sympy.Symbol:
    """The dimension symbol `name`: an integer ≥ 1 (sympy uses that to decide s + 1 > 0, Eq(s, -1), ...)."""
    return sympy.Symbol(name, integer=True, positive=True)


def normalize(d: object) -> Dim:
    """An int for anything constant (Python/NumPy ints, sympy Integers), else the sympy expression."""
    if isinstance(d, (bool, np.bool_)):
        return int(d)
    if isinstance(d, (int, np.integer)):
        return int(d)
    if isinstance(d, sympy.Basic):
        if d.is_Integer:
            return int(d)
        if d.is_Number:  # a rational from true division of two numbers: keep it exact, ints only when whole
            return int(d) if d == int(d) else d
        return d
    if isinstance(d, (float, np.floating)) and float(d).is_integer():
        return int(d)
    raise TypeError(f"not a dimension: {d!r} ({type(d).__name__})")


def normalize_shape(shape: Iterable[object]) -> tuple[Dim, ...]:
    return tuple(normalize(d) for d in shape)


def is_static(d: object) -> bool:
    """True for a dimension (or a shape) without symbols."""
    if isinstance(d, (tuple, list)):
        return all(is_static(x) for x in d)
    return not isinstance(d, sympy.Basic) or not d.free_symbols


def free_symbols(d: object) -> set[str]:
    """The names of the symbols in a dimension or a shape."""
    if isinstance(d, (tuple, list)):
        return set().union(*(free_symbols(x) for x in d)) if d else set()
    return {s.name for s in d.free_symbols} if isinstance(d, sympy.Basic) else set()


def current_bounds() -> Bounds:
    """The bounds in force (set by `using_bounds`: Graph.add / verify / infer set their graph's)."""
    return _BOUNDS.get() or {}


@contextlib.contextmanager
def using_bounds(bounds: Bounds | None) -> Iterator[None]:
    token = _BOUNDS.set(dict(bounds or {}))
    try:
        yield
    finally:
        _BOUNDS.reset(token)


def bound_of(name: str, bounds: Bounds | None = None) -> tuple[int, int]:
    b = current_bounds() if bounds is None else bounds
    return b.get(name, (1, DEFAULT_BOUND))


def _corners(d: sympy.Expr, bounds: Bounds | None) -> list[int]:
    syms = sorted(d.free_symbols, key=lambda s: s.name)
    return list(_corner_values(d, tuple(syms), tuple(bound_of(s.name, bounds) for s in syms)))


@functools.lru_cache(maxsize=1 << 16)  # the type rules ask for the same dims' extremes over and over
def _corner_values(d: sympy.Expr, syms: tuple[sympy.Symbol, ...], box: tuple[tuple[int, int], ...]) -> tuple[int, ...]:
    values = []
    for corner in itertools.product(*box):
        v = d.xreplace({s: sympy.Integer(c) for s, c in zip(syms, corner)})
        values.append(int(sympy.floor(v)) if v.is_Number and v.is_finite else _fail(d, corner))
    return tuple(values)


def _fail(d: sympy.Expr, corner: tuple[int, ...]) -> int:
    raise ValueError(f"dimension {dim_str(d)} does not evaluate to a number at {corner}")


def upper(d: object, bounds: Bounds | None = None) -> int:
    """The largest value of `d` over the bound box (every corner evaluated: monotone dims such as (h-1)//2+1,
    3*seq, seq*seq, b*s take their extremes there). `bounds` None: the bounds in force."""
    d = normalize(d)
    return d if isinstance(d, int) else max(_corners(d, bounds))


def lower(d: object, bounds: Bounds | None = None) -> int:
    """The smallest value of `d` over the bound box (see `upper`)."""
    d = normalize(d)
    return d if isinstance(d, int) else min(_corners(d, bounds))


def evaluate(d: object, values: dict[str, int]) -> int:
    """The value of `d` with every symbol given; a missing symbol is a ValueError naming it."""
    d = normalize(d)
    if isinstance(d, int):
        return d
    missing = free_symbols(d) - set(values)
    if missing:
        raise ValueError(f"dimension {dim_str(d)}: no value for symbol(s) {sorted(missing)}")
    v = d.subs({symbol(n): int(values[n]) for n in free_symbols(d)})
    return int(v)


def evaluate_shape(shape: Iterable[object], values: dict[str, int]) -> tuple[int, ...]:
    return tuple(evaluate(d, values) for d in shape)


def dim_str(d: object) -> str:
    return str(normalize(d)).replace(" ", "")


def shape_str(shape: Iterable[object]) -> str:
    return "[" + ",".join(dim_str(d) for d in shape) + "]"


def prod(dims: Iterable[object]) -> Dim:
    return _prod(tuple(dims))


@functools.lru_cache(maxsize=1 << 16)  # the element count of the same symbolic shapes, asked at every verify
def _prod(dims: tuple[object, ...]) -> Dim:
    out: Dim = 1
    for d in dims:
        out = out * normalize(d)
    return normalize(out)


def equal(a: object, b: object) -> bool:
    """True when two dims are provably equal for every value of their symbols within the bounds in force (s and 8
    are equal where s is bounded to (8, 8))."""
    a, b = normalize(a), normalize(b)
    if isinstance(a, int) and isinstance(b, int):
        return a == b
    if a == b:
        return True
    diff = normalize(sympy.simplify(sympy.sympify(a) - b))
    if isinstance(diff, int):
        return diff == 0
    try:
        return lower(diff) == upper(diff) == 0
    except ValueError:  # undefined somewhere in the box (a division by a dim that can be 0): not provably equal
        return False


def decide(rel: object, what: str = "") -> bool:
    """The truth of a relation between dims (s > 0, Eq(s, -1), ...) when sympy can decide it from the symbols
    being positive integers or the bounds in force; else a TypeError saying what could not be decided."""
    if isinstance(rel, (bool, np.bool_)):
        return bool(rel)
    if rel in (sympy.true, sympy.false):
        return bool(rel)
    if isinstance(rel, sympy.Rel):
        diff = normalize(sympy.sympify(rel.lhs - rel.rhs))
        lo, hi = (diff, diff) if isinstance(diff, int) else (lower(diff), upper(diff))
        verdict = {sympy.Eq: (lo == hi == 0, lo > 0 or hi < 0), sympy.Ne: (lo > 0 or hi < 0, lo == hi == 0),
                   sympy.Lt: (hi < 0, lo >= 0), sympy.Le: (hi <= 0, lo > 0),
                   sympy.Gt: (lo > 0, hi <= 0), sympy.Ge: (lo >= 0, hi < 0)}.get(type(rel))
        if verdict is not None and verdict[0]:
            return True
        if verdict is not None and verdict[1]:
            return False
    names = sorted(free_symbols(sympy.sympify(rel))) if isinstance(rel, sympy.Basic) else []
    within = ", ".join(f"{n} in {list(bound_of(n))}" for n in names)
    raise TypeError(f"cannot decide {rel} for every value of its symbols ({within}; `dynamic_bounds=` narrows "
                    f"them){': ' + what if what else ''}")


# -- shape tensors holding dims (NumPy object arrays) ---------------------------------------------------------
def is_symbolic_array(a: object) -> bool:
    """An array of dims with at least one symbol (Shape(x) of a symbolic x and the arithmetic on it)."""
    return isinstance(a, np.ndarray) and a.dtype == object and any(
        isinstance(x, sympy.Basic) and x.free_symbols for x in a.reshape(-1))


def dims_array(values: Iterable[object], shape: tuple[int, ...] | None = None) -> np.ndarray:
    """An object array of normalized dims (ints where static); the carrier of symbolic shape tensors."""
    flat = [normalize(v) for v in values]
    out = np.empty(len(flat), dtype=object)
    out[:] = flat
    return out.reshape(shape) if shape is not None else out


def normalize_array(a: np.ndarray) -> np.ndarray:
    """Every element of an object array normalized (sympy Integers → int, exact rationals kept)."""
    return dims_array(a.reshape(-1).tolist(), a.shape)


def substitute(obj: object, values: dict[str, int]) -> object:
    """`obj` (a dim, or tuples/lists/dicts of them: a node's attributes, a shape) with every symbol given a value:
    what an attribute such as Reshape's shape or Slice's ends is at one run's sizes."""
    if isinstance(obj, sympy.Basic):
        return evaluate(obj, values)
    if isinstance(obj, tuple):
        return tuple(substitute(x, values) for x in obj)
    if isinstance(obj, list):
        return [substitute(x, values) for x in obj]
    if isinstance(obj, dict):
        return {k: substitute(v, values) for k, v in obj.items()}
    return obj
