"""Loop partitioning of padded windows: a register tile whose reads all fall inside the input runs without the
padding guards.

A padded read is select(lo ≤ i ∧ i < hi ∧ …, X[…, clamp(i, lo, hi − 1), …], 0) (kernel/lower.py
`guarded_window`): per lane, a masked load. Over one tile — its rows mi < MR, its lanes ni < NR, the taps of the
reduction — every guarded index i is affine with constant coefficients, so its least and greatest values are
at corners of that box: the tile is *interior* when min(i) ≥ lo and max(i) < hi for every guard, one scalar
test per tile on the tile's own coordinates, and there each select is its plain (unclamped) load:

    for tile:                                  for tile:
      acc += select(in, X[clamp(i)], 0)·w  ⇒     if interior(mo, no, …):  acc += X[i]·w                (loads)
                                                 else:                    acc += select(in, X[clamp(i)], 0)·w

A depthwise 3×3 conv on 56×56 with 4-pixel row tiles: 12 of every 14 tiles on 54 of 56 rows are interior."""
from __future__ import annotations

from kiln.kernel.analysis import box_corner, unclamped_index
from kiln.kernel.ir import Bin, Const, Expr, Load, Select, Var, substitute, uses_var, walk


def _conjuncts(e: Expr) -> list[Expr]:
    if isinstance(e, Bin) and e.op == "and":
        return _conjuncts(e.a) + _conjuncts(e.b)
    return [e]


def _corner_test(test: Expr, ranges: dict[Var, int]) -> Expr | None:
    """`test` (i ≥ lo or i < hi) for every point of the box `ranges` (var → extent), as a test on the other
    variables; None when i is not affine in the box's variables."""
    if not (isinstance(test, Bin) and test.op in (">=", "<") and isinstance(test.b, Const)):
        return None
    at = box_corner(test.a, ranges, least=test.op == ">=")  # the corner where i is least (≥) or greatest (<)
    if at is None:
        return None
    out = Bin(test.op, at, test.b)
    return None if any(uses_var(out, v) for v in ranges) else out


def split_interior(term: Expr, ranges: dict[Var, int]) -> tuple[Expr, Expr] | None:
    """(term without its padding guards, the scalar test that the box `ranges` reads only inside), or None when
    `term` has no guards or a guard does not vary affinely over the box."""
    found = interior_swap(term, ranges)
    return None if found is None else (substitute(term, found[0]), found[1])


def interior_swap(term: Expr, ranges: dict[Var, int]) -> tuple[dict[Expr, Expr], Expr] | None:
    """({guarded select: its plain load}, the interior test) for split_interior, applied to whole nests by
    schedule/default.py (pooling in the blocked layout)."""
    guarded = [e for e in walk(term) if isinstance(e, Select) and unclamped_index(e) is not None]
    if not guarded:
        return None
    tests: list[Expr] = []
    swap: dict[Expr, Expr] = {}
    for s in guarded:
        for conj in _conjuncts(s.cond):
            t = _corner_test(conj, ranges)
            if t is None:
                return None
            if t not in tests:
                tests.append(t)
        swap[s] = Load(s.a.buf, unclamped_index(s), s.a.dtype)
    cond = tests[0]
    for t in tests[1:]:
        cond = Bin("and", cond, t)
    return swap, cond
