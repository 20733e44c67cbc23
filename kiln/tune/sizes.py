"""The sizes a shape-generic kernel is tuned over (issue 15; DietCode's "tuned once for all shapes").

A kernel of a model compiled with symbolic dims (`Sym`: `batch`, `seq`) is ONE piece of code for every size within
its bounds. Tuned at a single size, it would be tuned for that size alone — a 512-token tile wastes most of a
3-token step. So the tuner measures each candidate at a small distribution of sizes drawn from the bounds, and its
cost is the geometric mean of its times there: every size counts by its ratio, not by its length (a 512-token
prompt would otherwise outweigh every decode step). The distribution is a function of the kernel alone (its
symbols' bounds), so it is part of the workload's signature (tune/workload.py) and every measurement of a workload
is comparable with every other.

    each symbol: POINTS sizes spaced geometrically from its lower to its upper bound (1, 3, 8, 23, 64, 181, 512:
                 a decode step, a few tokens, short and long prompts — 5 sizes (1, 5, 23, 108, 512) missed the
                 8- and 16-row steps where a shorter full tile's variants lose: tuned gpt_decoder ran 1.07–1.12×
                 slower there)
    several symbols: the sizes on the diagonal (each symbol at the same quantile of its range) and the corners
                     where one symbol is at its upper bound and the others at their lower (batch 4 × seq 1,
                     batch 1 × seq 512: one long dim, the others short)

    size_distribution(kernel)  [{"batch": 1, "seq": 1}, {"batch": 1, "seq": 3}, …, {"batch": 1, "seq": 512}]
"""
from __future__ import annotations

from kiln.kernel.ir import Expr, Kernel, Reduce, Sym, value_at, walk

POINTS = 7     # sizes per symbol (the diagonal's length)


def kernel_symbols(k: Kernel) -> list[Sym]:
    """The symbolic dims an unscheduled kernel's computes run over or index with, by slot."""
    found: dict[str, Sym] = {}
    for c in k.computes:
        exprs = [e for e in c.extents if isinstance(e, Expr)] + [c.body] + list(c.store_index or ())
        for e in exprs:
            for x in walk(e):
                if isinstance(x, Sym):
                    found.setdefault(x.name, x)
    return sorted(found.values(), key=lambda s: s.index)


def symbol_points(lo: int, hi: int, n: int = POINTS) -> list[int]:
    """n sizes from lo to hi, geometrically spaced, rounded, without repeats."""
    lo, hi = max(1, int(lo)), max(1, int(hi))
    if n <= 1 or hi <= lo:
        return [hi]
    ratio = (hi / lo) ** (1.0 / (n - 1))
    out: list[int] = []
    for i in range(n):
        v = min(hi, max(lo, round(lo * ratio ** i)))
        if v not in out:
            out.append(v)
    if out[-1] != hi:
        out.append(hi)
    return out


def size_distribution(k: Kernel) -> list[dict[str, int]]:
    """The sizes (symbol → value) a symbolic kernel is measured at; [] for a kernel of constant extents."""
    syms = kernel_symbols(k)
    if not syms:
        return []
    sizes = diagonal({s.name: symbol_points(s.lo, s.hi) for s in syms})
    if len(syms) > 1:
        for long in syms:
            sizes.append({s.name: (s.hi if s is long else max(1, s.lo)) for s in syms})
    out: list[dict[str, int]] = []
    for s in sizes:
        if s not in out:
            out.append(s)
    return out


def diagonal(points: dict[str, list[int]]) -> list[dict[str, int]]:
    """Sizes with every symbol at the same quantile of its points: as many as the longest list has."""
    n = max(len(p) for p in points.values())
    return [{s: p[round(q * (len(p) - 1) / max(1, n - 1))] for s, p in points.items()} for q in range(n)]


def dims_vectors(k: Kernel) -> list[list[tuple[int, int]]]:
    """Per size of the distribution, what to write into the module's dims array: (slot, value) pairs."""
    slots = {s.name: s.index for s in kernel_symbols(k)}
    return [[(slots[name], v) for name, v in size.items()] for size in size_distribution(k)]


def iterations_at(k: Kernel, size: dict[str, int]) -> int:
    """The useful iterations of a kernel's computes at `size` (symbol → value; a symbol not in it at its upper
    bound): every compute's points times its reduction's — what its flops scale with."""
    total = 0
    for c in k.computes:
        n = 1
        for e in c.extents:
            n *= max(0, value_at(e, size) or 0)
        for r in walk(c.body):
            if isinstance(r, Reduce):
                for _, ext in r.axes:
                    n *= max(0, value_at(ext, size) or 0)
        total += n
    return total


def flops_at(k: Kernel, size: dict[str, int]) -> float:
    """The kernel's flops (`Kernel.flops`, counted at the upper bounds) scaled to `size` by its useful iterations."""
    top = iterations_at(k, {})
    return k.flops * iterations_at(k, size) / top if top else 0.0
