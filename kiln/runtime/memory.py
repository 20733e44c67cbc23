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
    weights: bytes = b""
    naive_bytes: int = 0    # what the arena would take without reuse (reported by `explain`)

    def place(self, prog: Program, name: str) -> Place:
        return self.places[root(prog.view_of, name)]


def _align(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def plan_memory(prog: Program, reuse: bool = True) -> MemoryPlan:
    g = prog.graph
    plan = MemoryPlan()
    for i, v in enumerate(g.inputs):
        plan.places[v.name] = Place("input", i)
    for i, v in enumerate(g.outputs):
        plan.places[v.name] = Place("output", i)
    blob = bytearray()
    lifetimes: dict[str, list[int]] = {}
    for k, names in enumerate(prog.bindings):
        for name in names:
            r = root(prog.view_of, name)
            if r in plan.places:
                continue
            value = prog.consts.get(r)
            if value is not None:
                off = _align(len(blob))
                blob.extend(b"\0" * (off - len(blob)))
                blob.extend(np.ascontiguousarray(value, dtype=np.uint8 if value.dtype == np.bool_ else None).tobytes())
                plan.places[r] = Place("const", off)
                continue
            span = lifetimes.setdefault(r, [k, k])
            span[1] = k
    plan.weights = bytes(blob)
    sizes = {r: _align(max(1, _nbytes(prog, r))) for r in lifetimes}
    plan.naive_bytes = sum(sizes.values())
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
    return plan


def _nbytes(prog: Program, name: str) -> int:
    b = prog.buffers[name]
    return b.size * np.dtype(b.dtype).itemsize

