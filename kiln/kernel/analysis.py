"""Index analysis shared by schedules and codegen: linearization and affine strides."""
from __future__ import annotations

import functools
from collections.abc import Callable

from kiln.kernel.ir import (
    Bin,
    Cast,
    Compute,
    Const,
    Expr,
    Load,
    Select,
    Sym,
    Un,
    Var,
    rewrite,
    substitute,
    walk,
)


@functools.lru_cache(maxsize=1 << 16)
def coef(e: Expr, v: Var) -> int | None:
    """d(e)/d(v) if e is affine in v with a constant coefficient, else None."""
    if e == v:
        return 1
    if isinstance(e, (Const, Var, Sym)):  # a symbolic dim is constant for the whole call
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


def box_corner(e: Expr, ranges: dict[Var, int], least: bool) -> Expr | None:
    """e at the corner of the box `ranges` (loop variable → extent, each from 0) where it is least (or greatest):
    an affine e's extremes are at corners. None where e is not affine in a box variable."""
    corner: dict[Expr, Expr] = {}
    for v, n in ranges.items():
        c = coef(e, v)
        if c is None:
            return None
        corner[v] = Const(0 if (c >= 0) == least else n - 1, "int64")
    return substitute(e, corner)


def flat_index(index: tuple[Expr, ...], shape: tuple[int, ...]) -> Expr:
    """Row-major linearization, folding away size-1 dims and zero indices. A single index into a buffer of
    higher rank is already linear (what `fuse_contiguous_axes` writes)."""
    if len(index) == 1 and len(shape) != 1:
        return index[0]
    terms: list[tuple[Expr, int]] = []  # (index, stride), innermost first
    stride = 1
    for i, d in reversed(list(zip(index, shape))):
        if d != 1 and not (isinstance(i, Const) and i.value == 0):
            terms.append((i, stride))
        stride *= d
    terms = _fold_div_mod(terms)
    split = [(a, s) for i, s in terms for a in _addends(i)]
    if len(split) > len(terms):
        # (x // c + r)·(c·s) + (x % c + q)·s: a 1×1 conv's pixel p split into (row, column) with its window offsets
        # (r, q: size-1 loops) added — folded per addend, p·s is affine in an unrolled tile's row
        folded = _fold_div_mod(split)
        if len(folded) < len(split):
            terms = folded
    flat: Expr | None = None
    for i, s in terms:
        term = i if s == 1 else i * s
        flat = term if flat is None else term + flat
    return flat if flat is not None else Const(0, "int64")


def _addends(e: Expr) -> list[Expr]:
    return _addends(e.a) + _addends(e.b) if isinstance(e, Bin) and e.op == "+" else [e]


def _fold_div_mod(terms: list[tuple[Expr, int]]) -> list[tuple[Expr, int]]:
    """(x // c)·(c·s) + (x % c)·s → x·s: an axis split into (x // c, x % c) and linearized back (a conv tile
    whose rows run over output-row ends: flatten_rows)."""
    out = list(terms)
    for j, (e, s) in enumerate(out):
        if not (isinstance(e, Bin) and e.op == "%" and isinstance(e.b, Const)):
            continue
        for i, (q, sq) in enumerate(out):
            if isinstance(q, Bin) and q.op == "//" and q.a == e.a and q.b == e.b and sq == s * int(e.b.value):
                out[j] = (e.a, s)
                del out[i]
                return _fold_div_mod(out)
    return out


def fuse_contiguous_axes(c: Compute, shape_of: Callable[[str], tuple[int, ...]]) -> Compute:
    """Merge the two innermost output axes (a, b) into one axis f = a·B + b wherever every access is
    affine with stride(a) = B·stride(b) — e.g. (h, w) of NCHW tensors in elementwise ops and 1×1
    convolutions — so a 7×7 or 56×56 plane is one contiguous loop of 49 or 3136 and vectors fill.
    Accesses become linear (single-index) loads and stores — an explicit store too (a padded copy's interior,
    kernel/lower.py: _pad_regions), whose affine offsets stay in the flat index. Repeats while it applies."""
    while len(c.axes) >= 2:
        # an outer axis of extent 1 (a batch lowered per sample) fuses whatever its stride: a is always 0 — in a
        # compute whose hints name no axes by position (an anchor's m_axis / n_axis would go stale)
        lone = c.extents[-2] == 1 and not any(h.endswith("_axis") for h in c.hints)
        a, b = c.axes[-2], c.axes[-1]
        B = c.extents[-1]
        flats = _mergeable(c, a, b, B, shape_of, lone)
        if flats is None:
            break
        f = Var(f"{a.name}{b.name}")
        rewritten = {ld: Load(ld.buf, (substitute(flat, {a: Const(0, "int64"), b: f}),), ld.dtype)
                     for ld, flat in flats.items()}
        store = rewritten.pop(Load(c.out, c.store_index))
        hints = {k: v for k, v in c.hints.items() if k != "spatial"}  # the rows are fused already
        c = Compute(c.out, c.axes[:-2] + (f,), c.extents[:-2] + (c.extents[-2] * B,), substitute(c.body, rewritten),
                    store.index, hints)
    return c


# hints that name axes by position or describe a conv's layout: a compute carrying one keeps its axes
_LAYOUT_HINTS = ("spatial", "block_axis", "in_block", "out_block", "depthwise", "rows_outer", "winograd", "reorder")


def fuse_row_axes(c: Compute, shape_of: Callable[[str], tuple[int, ...]]) -> Compute:
    """A GEMM's batch axes merged into its rows (hint m_axis) where every access is affine with stride(batch) =
    M·stride(m) — the weights, which depend on neither, included:

        for b < 4, m < 3, n:  y[b, m, n]           = Σ_k x[b, m, k] · w[k, n]
      ⇒ for p < 12, n:        y[p·N + n] = Σ_k x[p // 3, p % 3, k] · w[k, n]

    The loads keep their shape (flat_index folds (p // 3)·3 + p % 3 back to p, as for a conv's flattened rows), so
    what reads their last index — the dot-product forms, the taps — reads it as before; the store is one flat index.
    A register tile then spans the batch: bert_base at batch 4 × 3 tokens ran four 3-row GEMMs per layer, each
    streaming every weight panel (12.97 ms; 7.34 merged: benchmarks/batched_rows.py). Only MatMul-like anchors
    (m_axis, n_axis counted from the end, no conv layout hints), static extents; repeats while it applies."""
    m_hint, n_hint = c.hints.get("m_axis"), c.hints.get("n_axis", -1)
    if not isinstance(m_hint, int) or m_hint >= 0 or not isinstance(n_hint, int) or n_hint >= 0 or \
            any(h in c.hints for h in _LAYOUT_HINTS) or (c.store is not None and len(c.store) != 1):
        return c
    while (m := m_hint % len(c.axes)) > 0 and all(isinstance(e, int) for e in c.extents[m - 1:m + 1]):
        a, b = c.axes[m - 1], c.axes[m]
        B = c.extents[m]
        # rows of extent 1 (one token per sequence: an index of constant 0 there) merge whatever the batch's stride
        flats = _mergeable(c, a, b, B, shape_of, B == 1)
        if flats is None:
            break
        p = Var(f"{a.name}{b.name}")
        at_p = {a: p, b: Const(0, "int64")} if B == 1 else {a: Const(0, "int64"), b: p}  # (stride(a) = B·stride(b))
        store = substitute(flats[Load(c.out, c.store_index)], at_p)  # one flat index
        c = Compute(c.out, c.axes[:m - 1] + (p,) + c.axes[m + 1:],
                    c.extents[:m - 1] + (c.extents[m - 1] * B,) + c.extents[m + 1:],
                    substitute(c.body, {a: p // B, b: p % B}), (store,), c.hints)
    return c


def _mergeable(c: Compute, a: Var, b: Var, B: int, shape_of: Callable[[str], tuple[int, ...]],
               lone: bool) -> dict[Load, Expr] | None:
    """Each access (and the store, as a Load of c.out) with its flat index, if axes a and b can be one axis a·B + b:
    every access affine in both with stride(a) = B·stride(b) (any stride when `lone`), no index load using them, and
    the body using them only in addresses (not in selects or counts); else None."""
    flats: dict[Load, Expr] = {}
    for ld in [x for x in walk(c.body) if isinstance(x, Load)] + [Load(c.out, c.store_index)]:
        flat = flat_index(ld.index, shape_of(ld.buf))
        ca, cb = coef(flat, a), coef(flat, b)
        if ca is None or cb is None or (ca != cb * B and not lone) or any(_uses(x, (a, b)) for x in _index_loads(ld)):
            return None
        flats[ld] = flat
    return None if _uses(_strip_loads(c.body), (a, b)) else flats


def _uses(e: Expr, vs: tuple[Var, ...]) -> bool:
    return any(x in vs for x in walk(e))


def _index_loads(ld: Load) -> list[Load]:
    """Loads nested inside a load's index (gathers): their own indices must not use the fused axes."""
    return [x for i in ld.index for x in walk(i) if isinstance(x, Load)]


def _strip_loads(e: Expr) -> Expr:
    """e with every load replaced by a constant: what remains uses axes outside addresses (selects, counts)."""
    return rewrite(e, pre=lambda x: Const(0, x.dtype) if isinstance(x, Load) else None)


def unclamped_index(e: Select) -> tuple[Expr, ...] | None:
    """For select(cond, X[…, clamp(i, lo, hi), …], c) whose cond has every clamp's two bounds tests as
    conjuncts — how padding reads its source — X's index with the clamps removed; otherwise None."""
    if not isinstance(e, Select) or not isinstance(e.a, Load) or not isinstance(e.b, Const):
        return None
    conj, stack = set(), [e.cond]
    while stack:
        x = stack.pop()
        if isinstance(x, Bin) and x.op == "and":
            stack += [x.a, x.b]
        else:
            conj.add(x)
    index = []
    for i in e.a.index:
        if isinstance(i, Bin) and i.op == "min" and isinstance(i.a, Bin) and i.a.op == "max" \
                and isinstance(i.b, Const) and isinstance(i.a.b, Const):
            inner, lo, hi = i.a.a, i.a.b.value, i.b.value
            bounds = (Bin(">=", inner, Const(lo, "int64")), Bin("<", inner, Const(hi + 1, "int64")))
            if any(b not in conj for b in bounds):
                return None
            index.append(inner)
        else:
            index.append(i)
    return tuple(index)


def simplify_panels(e: Expr, ni: Var, nr: int) -> Expr:
    """(x·NR + ni) // NR → x and (x·NR + ni) % NR → ni, valid because 0 ≤ ni < NR (a lane of the tile).
    This is what makes a packed panel load Bp[j // NR, k, j % NR] a plain contiguous vector load."""
    nr_c = Const(nr, "int64")

    def panel(_: Expr, y: Expr) -> Expr:
        if isinstance(y, Bin) and y.op in ("//", "%") and y.b == nr_c and isinstance(y.a, Bin) and y.a.op == "+" \
                and y.a.b == ni and isinstance(y.a.a, Bin) and y.a.a.op == "*" and y.a.a.b == nr_c:
            return y.a.a.a if y.op == "//" else ni
        return y
    return rewrite(e, panel)
