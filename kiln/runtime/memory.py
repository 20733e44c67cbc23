"""Static memory plan: where every buffer lives when the compiled model runs.

Graph inputs and outputs live in the caller's arrays, constants in one weights blob, everything else
in one arena whose offsets are reused by buffers whose lifetimes (first write .. last read, in kernel
order) do not overlap — greedy best-fit by size, like TVM's and XLA's static planners."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from kiln.kernel.build import Program, root

ALIGN = 64


@dataclass(frozen=True)
class Place:
    kind: str      # "input" | "output" | "const" | "arena"
    index: int     # input/output position, or byte offset in the weights blob / arena


@dataclass
class MemoryPlan:
    places: dict[str, Place] = field(default_factory=dict)   # storage-owning buffer name → place
    arena_bytes: int = 0
    weights: bytes | memoryview = b""  # a buffer of bytes (the constants at their offsets)
    naive_bytes: int = 0    # what the arena would take without reuse (reported by `explain`)

    def place(self, prog: Program, name: str) -> Place:
        return self.places[root(prog.view_of, name)]


def _align(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def aligned_buffer(nbytes: int, align: int = ALIGN, zero: bool = True) -> np.ndarray:
    """uint8[nbytes] starting at a multiple of `align` bytes (numpy aligns large arrays to 16 only)."""
    raw = (np.zeros if zero else np.empty)(nbytes + align, dtype=np.uint8)
    off = (-raw.ctypes.data) % align
    return raw[off:off + nbytes] if nbytes else raw[off:off + 1]


def plan_memory(prog: Program, reuse: bool = True) -> MemoryPlan:
    g = prog.graph
    plan = MemoryPlan()
    for i, v in enumerate(g.inputs):
        plan.places[v.name] = Place("input", i)
    for i, v in enumerate(g.outputs):
        plan.places[v.name] = Place("output", i)
    consts: list[tuple[int, np.ndarray]] = []
    end = 0
    lifetimes: dict[str, list[int]] = {}
    for k, names in enumerate(prog.bindings):
        for name in names:
            r = root(prog.view_of, name)
            if r in plan.places:
                continue
            value = prog.consts.get(r)
            if value is not None:
                off = _align(end)
                end = off + value.nbytes
                consts.append((off, value))
                plan.places[r] = Place("const", off)
                continue
            span = lifetimes.setdefault(r, [k, k])
            span[1] = k
    # one buffer, each constant copied into it once (bert_base: 440 MB — a bytes blob grown piece by piece and
    # copied out again cost 1.6 s), aligned so the Executable takes it as it is
    blob = aligned_buffer(end)
    for off, value in consts:
        blob[off:off + value.nbytes] = np.ascontiguousarray(value).reshape(-1).view(np.uint8)
    plan.weights = blob.data.cast("B") if end else b""
    sizes = {r: _align(max(1, _nbytes(prog, r))) for r in lifetimes}
    plan.naive_bytes = sum(sizes.values())
    shares = in_place(prog, lifetimes) if reuse else {}
    for out, src in shares.items():  # out lives in src's storage: one lifetime spanning both
        lifetimes[src][1] = max(lifetimes[src][1], lifetimes.pop(out)[1])
    placed: list[tuple[int, int, int, int]] = []  # (offset, size, first, last)
    for r in sorted(lifetimes, key=lambda r: (-sizes[r], lifetimes[r][0])):
        first, last = lifetimes[r]
        size = sizes[r]
        if not reuse:
            off = sum(p[1] for p in placed)
        else:
            busy = sorted((o, o + s) for o, s, f, l in placed if not (l < first or f > last))
            off = 0
            for lo, hi in busy:
                if off + size <= lo:
                    break
                off = max(off, hi)
        placed.append((off, size, first, last))
        plan.places[r] = Place("arena", off)
        plan.arena_bytes = max(plan.arena_bytes, off + size)
    for out, src in shares.items():
        plan.places[out] = plan.places[src]
    return plan


def in_place(prog: Program, lifetimes: dict[str, list[int]]) -> dict[str, str]:
    """Kernel outputs that can be written over an input: out → the arena buffer whose storage it takes.

    A kernel may write its output O over an input R when R dies in that kernel and the kernel reads R only
    where it then writes O — `O[i] = f(…, R[i])`, e.g. a conv whose epilogue adds the residual R. Each
    element of R is read just before the same element of O is stored (by the same thread, in the same
    vector iteration or tile epilogue), so nothing reads an overwritten value; and the store hits the cache
    line the load just brought in instead of allocating a fresh one. Returns storage owners already
    resolved through chains (O over R, then P over O → P over R's owner)."""
    from kiln.kernel.analysis import flat_index
    from kiln.kernel.ir import Load, Reduce, walk

    shares: dict[str, str] = {}
    for k, (kern, names) in enumerate(zip(prog.kernels, prog.bindings)):
        canon = {b.name: n for b, n in zip(list(kern.args) + list(kern.scratch), names)}
        shape = {b.name: b.shape for b in list(kern.args) + list(kern.scratch)}
        writers = [c for c in kern.computes if c.out in canon]
        out_of = {c.out for c in writers}
        for c in writers:
            o = root(prog.view_of, canon[c.out])
            if o not in lifetimes or lifetimes[o][0] != k or sum(w.out == c.out for w in writers) != 1:
                continue
            where = flat_index(c.store_index, shape[c.out])
            # (a scratch contracted to one row per thread, schedule/fuse_rows.py, has no arena storage: not in canon)
            for r_canon in sorted(({x.buf for x in walk(c.body) if isinstance(x, Load)} - out_of) & canon.keys()):
                r = root(prog.view_of, canon[r_canon])
                if r not in lifetimes or r == o:  # inputs, outputs and weights have their own storage
                    continue
                if lifetimes[r][1] != k or _nbytes(prog, r) != _nbytes(prog, o) or \
                        prog.buffers[r].dtype != prog.buffers[o].dtype:
                    continue
                # every name under which the kernel sees r's storage (a reshape view is another argument)
                r_names = {cn for cn, n in canon.items() if root(prog.view_of, n) == r}
                if r_names != {r_canon}:
                    continue
                loads_elsewhere = any(isinstance(x, Load) and x.buf == r_canon for other in kern.computes
                                      if other is not c for x in walk(other.body))
                in_reduce = any(isinstance(x, Reduce) and any(isinstance(y, Load) and y.buf == r_canon
                                                              for y in walk(x.body)) for x in walk(c.body))
                same_point = all(flat_index(x.index, shape[r_canon]) == where for x in walk(c.body)
                                 if isinstance(x, Load) and x.buf == r_canon)
                if same_point and not loads_elsewhere and not in_reduce:
                    shares[o] = shares.get(r, r)
                    break
    return shares


def _nbytes(prog: Program, name: str) -> int:
    b = prog.buffers[name]
    return b.size * np.dtype(b.dtype).itemsize

