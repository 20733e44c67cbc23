"""Row fusion (TVM's compute_at, for per-row work): adjacent parallel loops of one kernel that walk the same rows
become one loop, where each later body reads what an earlier one stored only at the row it is at; then a scratch
buffer that only one row at a time uses shrinks to one row per thread (storage contraction).

Softmax (kernel/lower.py: lower_softmax) is four computes, scheduled one by one into four parallel nests:

    for r in 0..R parallel: max[r] = max_k x[r, k]
    for r in 0..R parallel: for k vector: e[r, k] = exp(x[r, k] − max[r])        # e: scratch [R, K]
    for r in 0..R parallel: rsum[r] = 1 / Σ_k e[r, k]
    for r in 0..R parallel: for k vector: y[r, k] = e[r, k] · rsum[r]

— four fork/joins, and each row read from wherever the previous pass left it (bert_base's scores: 786 KB per
softmax, from L2 each time, e another 786 KB). After:

    for r in 0..R parallel:
      alloc e_row[K]                                                             # per thread, stays in L1
      max[r] = max_k x[r, k]
      for k vector: e_row[k] = exp(x[r, k] − max[r])
      rsum[r] = 1 / Σ_k e_row[k]
      for k vector: y[r, k] = e_row[k] · rsum[r]

one fork/join, every pass over a row in L1. LayerNormalization's mean, rstd and output the same (no contraction).

Fusion is legal when the two loops are parallel with equal constant extents and chunking, and — with the later
loop's variable renamed to the earlier one's — (a) every element the later body loads of a buffer the earlier body
stores was stored by the earlier body at the same row, and by no other row (checked by enumerating both index sets,
numerically, over every row and the loops around each access); (b) the later body stores nothing the earlier body
reads or stores; (c) neither calls out (a microkernel's pointer arguments say nothing of what it touches). A run-time
extent keeps its loops. Contraction takes a kernel scratch buffer used only inside one fused loop whose every access
has its row part (the dims its index reads the row in) apart from its in-row part, the in-row part at most
MAX_ROW_BYTES."""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from kiln.kernel.analysis import flat_index
from kiln.kernel.ir import (
    Alloc,
    Assign,
    Bin,
    Buffer,
    Call,
    Const,
    Expr,
    If,
    Kernel,
    Load,
    Local,
    Loop,
    Prefetch,
    Stmt,
    Store,
    Var,
    uses_var,
    walk,
    walk_stmts,
)
from kiln.schedule.primitives import rename

MAX_ELEMENTS = 1 << 24     # index sets enumerated per checked buffer (beyond it: not fused)
MAX_ROW_BYTES = 32 << 10   # a contracted row lives on each thread's stack
_NP_OPS = {"+": np.add, "-": np.subtract, "*": np.multiply, "//": np.floor_divide, "%": np.mod,
           "min": np.minimum, "max": np.maximum}


def fuse_rows(k: Kernel, nest: list[Stmt]) -> list[Stmt]:
    """The kernel's top-level nest with each run of fusable parallel loops merged into its first loop, and the
    scratch buffers that became row-private contracted (removed from `k.scratch`)."""
    out: list[Stmt] = []
    merged: set[int] = set()
    for s in nest:
        prev = out[-1] if out else None
        if isinstance(prev, Loop) and isinstance(s, Loop) and _fusable(k, prev, s):
            out[-1] = replace(prev, body=prev.body + rename(s.body, {s.var: prev.var}))
            merged.add(len(out) - 1)
        else:
            out.append(s)
    for i in sorted(merged):
        outside = {x.buf for j, s in enumerate(out) if j != i for x in _accesses([s])}
        for buf in [b for b in k.scratch if b.name not in outside]:
            loop = _contract(k, out[i], buf)
            if loop is not None:
                out[i] = loop
                k.scratch = [b for b in k.scratch if b.name != buf.name]
    return out


# -- what a nest touches ---------------------------------------------------------------------------------------
Access = Load | Store | Prefetch


def _visit(stmts: list[Stmt], loops: tuple[Loop, ...], guarded: bool,
           out: list[tuple[Access, tuple[Loop, ...], bool]]) -> None:
    """Every access with the loops around it (outermost first) and whether an If stands between."""
    def exprs(roots: list[Expr]) -> None:
        out.extend((x, loops, guarded) for r in roots for x in walk(r) if isinstance(x, Load))
    for s in stmts:
        if isinstance(s, Loop):
            exprs([s.extent])
            _visit(s.body, loops + (s,), guarded, out)
        elif isinstance(s, If):
            exprs([s.cond])
            _visit(s.body + s.orelse, loops, True, out)
        elif isinstance(s, Store):
            exprs([*s.index, s.value])
            out.append((s, loops, guarded))
        elif isinstance(s, Prefetch):
            out.append((s, loops, guarded))
        elif isinstance(s, Local):
            exprs([s.init])
        elif isinstance(s, Assign):
            exprs([s.value] + ([s.slot] if s.slot is not None else []))
        elif isinstance(s, Call):
            exprs(list(s.args))


def _accesses(stmts: list[Stmt]) -> list[Access]:
    found: list[tuple[Access, tuple[Loop, ...], bool]] = []
    _visit(stmts, (), False, found)
    return [a for a, _, _ in found]


def _values(e: Expr, env: dict[Var, np.ndarray]) -> np.ndarray | None:
    """The integer expression over the grid `env` (each variable an array broadcast along its own axis), or None."""
    if isinstance(e, Const) and isinstance(e.value, (int, np.integer)):
        return np.asarray(int(e.value), np.int64)
    if isinstance(e, Var):
        return env.get(e)
    if isinstance(e, Bin) and e.op in _NP_OPS:
        a, b = _values(e.a, env), _values(e.b, env)
        if a is None or b is None or (e.op in ("//", "%") and not np.all(b)):
            return None
        return _NP_OPS[e.op](a, b)
    return None


def _points(k: Kernel, acc: Access, row: Loop, loops: tuple[Loop, ...]) -> np.ndarray | None:
    """The flat element index the access touches at each (row, inner iteration): shape [R, …] (None: not
    enumerable — a run-time extent, a variable not bound by these loops, a data-dependent index)."""
    grid = [row] + [lp for lp in loops if lp is not row]
    extents = [lp.extent.value if isinstance(lp.extent, Const) else None for lp in grid]
    if None in extents or np.prod(extents, dtype=np.float64) > MAX_ELEMENTS:
        return None
    env = {lp.var: np.arange(n, dtype=np.int64).reshape([-1 if i == d else 1 for i in range(len(grid))])
           for d, (lp, n) in enumerate(zip(grid, extents))}
    at = _values(flat_index(acc.index, k.buffer(acc.buf).shape), env)
    return None if at is None else np.broadcast_to(at, tuple(extents))


def _fusable(k: Kernel, a: Loop, b: Loop) -> bool:
    if not (a.kind == b.kind == "parallel" and isinstance(a.extent, Const) and a.extent == b.extent
            and a.chunks == b.chunks and a.work is None and b.work is None):
        return False
    names = [{s.name for s in walk_stmts(x.body) if isinstance(s, (Local, Alloc))} for x in (a, b)]
    if any(isinstance(s, Call) for s in walk_stmts(a.body + b.body)) or names[0] & names[1]:
        return False
    later = Loop(a.var, a.extent, rename(b.body, {b.var: a.var}), "parallel")
    first: list[tuple[Access, tuple[Loop, ...], bool]] = []
    second: list[tuple[Access, tuple[Loop, ...], bool]] = []
    _visit([a], (), False, first)
    _visit([later], (), False, second)
    if {x.buf for x, _, _ in second if isinstance(x, Store)} & {x.buf for x, _, _ in first}:
        return False
    stored = {x.buf for x, _, _ in first if isinstance(x, Store)}
    # the rows' accesses in the original order: a's, then b's — one list, so `later` (a's row variable) binds both
    both = [(x, (later,) + lps[1:], g) for x, lps, g in first] + second
    return all(_same_row(k, later, buf, both, second)
               for buf in {x.buf for x, _, _ in second if isinstance(x, Load)} & stored)


def _owners(k: Kernel, row: Loop, buf: str, found: list[tuple[Access, tuple[Loop, ...], bool]],
            rows: int) -> np.ndarray | None:
    """For each element of `buf`, the row whose iteration of `row` stores it (−1: none), or None where an element is
    stored by two rows, or a store cannot be enumerated or stands under an If (it may not run)."""
    n = int(np.prod(k.buffer(buf).shape))
    if n > MAX_ELEMENTS:
        return None
    owner = np.full(n, -1, np.int64)
    for x, loops, guarded in found:
        if not (isinstance(x, Store) and x.buf == buf):
            continue
        at = None if guarded else _points(k, x, row, loops)
        if at is None:
            return None
        r = np.broadcast_to(np.arange(rows).reshape([-1] + [1] * (at.ndim - 1)), at.shape)
        if np.any((owner[at] != -1) & (owner[at] != r)):
            return None
        mine = owner.copy()
        mine[at] = r
        if np.any(mine[at] != r):  # one element stored at two rows (the last assignment won)
            return None
        owner = mine
    return owner


def _same_row(k: Kernel, row: Loop, buf: str, found: list[tuple[Access, tuple[Loop, ...], bool]],
              reads: list[tuple[Access, tuple[Loop, ...], bool]]) -> bool:
    """Is every element of `buf` that `reads` load stored (in `found`) at the row that loads it, and by that row
    alone?"""
    rows = int(row.extent.value)
    owner = _owners(k, row, buf, found, rows)
    if owner is None:
        return False
    for x, loops, _ in reads:
        if isinstance(x, Load) and x.buf == buf:
            at = _points(k, x, row, loops)
            if at is None or np.any(owner[at] != np.arange(rows).reshape([-1] + [1] * (at.ndim - 1))):
                return False
    return True


# -- storage contraction ---------------------------------------------------------------------------------------
def _contract(k: Kernel, loop: Loop, buf: Buffer) -> Loop | None:
    """`loop` with the scratch buffer `buf` replaced by one row (an Alloc at the top of its body), or None."""
    found: list[tuple[Access, tuple[Loop, ...], bool]] = []
    _visit([loop], (), False, found)
    mine = [(x, lps) for x, lps, _ in found if x.buf == buf.name]
    if not mine or not _same_row(k, loop, buf.name, found, found):
        return None
    # the dims whose size is not 1, split into the row part (indices reading the row variable) and the in-row part
    dims = [d for d, n in enumerate(buf.shape) if n != 1]
    row_dims: set[int] | None = None
    for x, lps in mine:
        if len(x.index) != len(buf.shape):
            return None  # a linear index into a higher-rank buffer (kernel/analysis.py: fuse_contiguous_axes)
        reads = {d for d in dims if uses_var(x.index[d], loop.var)}
        if any(uses_var(x.index[d], lp.var) for d in reads for lp in lps if lp is not loop):
            return None  # an index mixing the row with an in-row loop
        if row_dims is not None and reads != row_dims:
            return None
        row_dims = reads
    inner = [d for d in dims if d not in (row_dims or set())]
    shape = tuple(buf.shape[d] for d in inner) or (1,)
    if int(np.prod(shape)) * np.dtype(buf.dtype).itemsize > MAX_ROW_BYTES:
        return None

    def local(index: tuple[Expr, ...]) -> tuple[Expr, ...]:
        return tuple(index[d] for d in inner) or (Const(0, "int64"),)
    name = f"{buf.name}.row"
    loads = {x: Load(name, local(x.index), x.dtype) for x, _ in mine if isinstance(x, Load)}
    body = _retarget(rename(loop.body, loads), buf.name, name, local)
    return replace(loop, body=[Alloc(name, buf.dtype, shape)] + body)


def _retarget(stmts: list[Stmt], old: str, new: str, local) -> list[Stmt]:  # noqa: ANN001
    out: list[Stmt] = []
    for s in stmts:
        if isinstance(s, Store) and s.buf == old:
            s = Store(new, local(s.index), s.value)
        elif isinstance(s, Prefetch) and s.buf == old:
            s = replace(s, buf=new, index=local(s.index))
        elif isinstance(s, Loop):
            s = replace(s, body=_retarget(s.body, old, new, local))
        elif isinstance(s, If):
            s = replace(s, body=_retarget(s.body, old, new, local), orelse=_retarget(s.orelse, old, new, local))
        out.append(s)
    return out

