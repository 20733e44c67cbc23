"""Fuse a Winograd input transform into the product that reads its V, tile block by tile block (step 4b of
`compiler.lower_graph`; option `fuse_winograd`).

Scheduled apart, the transform writes all of V (layer1 of resnet18: 3.2 MB, past L2) and the product reads it back;
when the host puts the two vCPUs on different L3s, V's lines move between the cores on the way (resnet18 grows 1.10×
there with Winograd, 1.03× without — README, sixth session). Where the product's parallel loop takes one tile block
per (position, output-channel block) iteration and its thread parts split the blocks (schedule/tile.py:
`image_thread_parts`, hint rows_outer), every block's product reads only the V of its own MR tiles. Fused, one parallel
loop over the blocks transforms a block's tiles and at once runs every product iteration of that block:

    before:  for (b, t, cib) parallel:  V[b, r, c, cib, t, :] = Bᵀ·d·B        (16 stores, schedule/winograd.py)
             for tile0 parallel:        (r, c, cob, block) = decode(tile0);  M[…, block·MR + i, :] = Σ V·U
    after:   for block parallel:
               for i < MR, cib:          V[b, r, c, cib, block·MR + i, :] = Bᵀ·d·B
               for q < Q:                tile0 = encode(block, q);  M[…] = Σ V·U      (V hot in this core's L1/L2)

Both loop nests are the scheduled ones, re-indexed: the transform's fused index becomes (block·MR + i)·CIB + cib, the
product's tile0 = (block // per)·Q·per + q·per + block % per (its thread parts outermost, `per` blocks each) — both
checked by evaluating the nests' V indices over their iterations; a pair that fits otherwise (batch > 1, a tail
block, a product split by position: fused, each thread would stream all of U) is left as it was. V stays an arena
buffer, written and read by one kernel now.

resnet18 at AVX-512 fuses layer1's and layer2's seven pairs (`python benchmarks/option_by_host_state.py resnet18 --off
fuse_winograd --rounds 200`, Zen 5): on one L3 unchanged (paired 1.001, 120 rounds), on two L3s 3.0% faster (75
rounds); the model's growth from one L3 to two 1.073× → 1.046× in that run."""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from kiln.kernel.build import Group, Program, rename_loads
from kiln.kernel.ir import (
    Bin,
    Buffer,
    Compute,
    Const,
    Expr,
    If,
    Kernel,
    Load,
    Loop,
    Stmt,
    Store,
    Var,
    uses_var,
    value_at,
    walk,
    walk_stmts,
)
from kiln.schedule.primitives import rename

I64 = "int64"


def fuse_winograd(prog: Program) -> int:
    """Fuse every (input transform, product) pair that fits; returns how many."""
    fused, k = 0, 0
    done: dict[tuple[int, int], Kernel | None] = {}  # repeated blocks share their scheduled nests: fuse those once
    while k + 1 < len(prog.kernels):
        new = _fuse_pair(prog, k, done)
        if new is None:
            k += 1
            continue
        prog.kernels[k:k + 2] = [new]
        prog.bindings[k:k + 2] = [prog.bindings[k + 1] + [prog.bindings[k][1]]]
        if len(prog.groups) > k + 1:  # the graph nodes each kernel computes (kiln explain, profiles)
            ga, gb = prog.groups[k], prog.groups[k + 1]
            prog.groups[k:k + 2] = [Group(ga.computes + gb.computes, ga.temps + gb.temps, ga.nodes + gb.nodes,
                                          gb.output)]
        fused += 1
        k += 1
    return fused


def _fuse_pair(prog: Program, k: int, done: dict[tuple[int, int], Kernel | None]) -> Kernel | None:
    a, b = prog.kernels[k], prog.kernels[k + 1]
    if len(a.computes) != 1 or a.computes[0].hints.get("winograd") != "input" or a.scratch or b.scratch:
        return None
    if len(b.computes) != 1 or b.computes[0].hints.get("op") != "WinogradProduct" or len(a.args) != 2:
        return None
    v_name, x_name = prog.bindings[k]
    names_b = prog.bindings[k + 1]
    if v_name not in names_b or any(v_name in names for i, names in enumerate(prog.bindings) if i not in (k, k + 1)):
        return None
    if len(a.body) != 1 or len(b.body) != 1:
        return None
    la, lb = a.body[0], b.body[0]
    if not (isinstance(la, Loop) and isinstance(lb, Loop) and la.kind == lb.kind == "parallel"):
        return None
    key = (id(la), id(lb))
    if key in done:  # the same nests (and so the same buffer names) as a pair fused before: share its fused nest
        twin = done[key]
        if twin is None:
            return None
        return replace(b, args=list(twin.args), body=twin.body, flops=a.flops + b.flops,
                       computes=[_moved_transform(a, b.args[names_b.index(v_name)].name, twin.args[-1].name),
                                 *b.computes])
    done[key] = fused = _fuse_nests(a, b, prog.bindings[k], names_b, la, lb)
    return fused


def _fuse_nests(a: Kernel, b: Kernel, names_a: list[str], names_b: list[str], la: Loop, lb: Loop) -> Kernel | None:
    v_name, x_name = names_a
    if x_name in names_b:
        return None
    v_a = a.args[0]                                    # V, as the transform names it
    v_b = b.args[names_b.index(v_name)]                # … and as the product does
    nb, _, _, ncib, nt, _ = v_a.shape
    if nb != 1 or value_at(la.extent, {}) != nt * ncib or value_at(lb.extent, {}) is None:
        return None
    if not _transform_order(la, v_a.name, ncib):
        return None
    found = _product_blocks(lb, v_b.name)
    if found is None:
        return None
    mr, encode, n_blocks, q_count = found
    if n_blocks * mr != nt:
        return None
    block, i, cib, q = Var("wblock"), Var("wtile"), Var("wcib"), Var("wq")
    taken = {x.name for x in b.args}
    x_new = Buffer(next(n for n in (f"b{j}" for j in range(len(taken), 2 * len(taken) + 2)) if n not in taken),
                   a.args[1].dtype, a.args[1].shape)
    bufs = {a.args[0].name: v_b.name, a.args[1].name: x_new.name}
    fused_index = (block * mr + i) * ncib + cib
    memo: dict[Expr, Expr] = {}
    transform = [_rename_bufs(s, bufs, memo) for s in rename(la.body, {la.var: fused_index})]
    product = rename(lb.body, {lb.var: encode(block, q)})
    body: list[Stmt] = [
        Loop(i, Const(mr, I64), [Loop(cib, Const(ncib, I64), transform)]),
        Loop(q, Const(q_count, I64), product),
    ]
    top = Loop(block, Const(n_blocks, I64), body, "parallel", chunks=lb.chunks)
    return replace(b, args=list(b.args) + [x_new], computes=[_moved_transform(a, v_b.name, x_new.name), *b.computes],
                   body=[top], flops=a.flops + b.flops)


def _moved_transform(a: Kernel, v: str, x: str) -> Compute:
    """The transform's compute definition in the fused kernel's names (V written as `v`, the input read as `x`)."""
    (ca,) = a.computes
    return replace(ca, out=v, body=rename_loads(ca.body, {a.args[1].name: x}))


def _transform_order(loop: Loop, v: str, ncib: int) -> bool:
    """Does the transform's fused index run (tile, channel block), the block fastest? Checked on its V stores."""
    stores = [s for s in walk_stmts(loop.body) if isinstance(s, Store) and s.buf == v]
    x = np.arange(value_at(loop.extent, {}) or 0, dtype=np.int64)
    if not stores or not len(x):
        return False
    try:
        got = [np.broadcast_to(_ev(stores[0].index[d], {loop.var.name: x}), x.shape) for d in (3, 4)]
    except KeyError:
        return False
    return np.array_equal(got[0], x % ncib) and np.array_equal(got[1], x // ncib)


def _product_blocks(loop: Loop, v: str):  # noqa: ANN202 - (MR, encode, blocks, iterations per block) | None
    """The product's tile blocks: MR (its unrolled tile loop's extent), and how its parallel index tile0 maps to
    (block, q) — checked over every iteration against the block its V loads read."""
    loads = [e for s in walk_stmts(loop.body) for e in _exprs(s) if isinstance(e, Load) and e.buf == v]
    if not loads or any(isinstance(s, If) for s in loop.body):
        return None
    tile_index = loads[0].index[4]
    inner = {s.var: s.extent for s in walk_stmts(loop.body) if isinstance(s, Loop) and s.kind == "unroll"
             and uses_var(tile_index, s.var)}
    if len(inner) != 1:  # (the accumulating loop and the storing one share the tile index)
        return None
    (i_var, i_extent), = inner.items()
    mr, total = value_at(i_extent, {}), value_at(loop.extent, {})
    if not mr or not total:
        return None
    t0 = np.arange(total, dtype=np.int64)
    try:
        start = np.broadcast_to(_ev(tile_index, {loop.var.name: t0, i_var.name: np.zeros_like(t0)}), t0.shape)
    except KeyError:
        return None
    if (start % mr).any():
        return None
    block = start // mr
    n = int(block.max()) + 1
    counts = np.bincount(block, minlength=n)
    if counts.min() != counts.max():
        return None
    q_count = int(counts[0])
    # only a product whose thread parts split the blocks (each thread already streams all of U): fused, a product
    # split by position (a weight-heavy stage) would have every thread stream all of U
    for parts in (p for p in (2, 3, 4, 6, 8) if n % p == 0):
        per = n // parts
        if np.array_equal(block, (t0 // (q_count * per)) * per + t0 % per):

            def enc(blk: Expr, q: Expr, per: int = per) -> Expr:  # (part, q, within): the within part fastest
                return Bin("//", blk, Const(per, I64)) * (q_count * per) + q * per + Bin("%", blk, Const(per, I64))
            return mr, enc, n, q_count
    return None


_OPS = {"+": np.add, "-": np.subtract, "*": np.multiply, "//": np.floor_divide, "%": np.mod, "max": np.maximum,
        "min": np.minimum}


def _ev(e: Expr, env: dict[str, np.ndarray]) -> np.ndarray | int:
    """An integer index expression over arrays of loop-variable values (KeyError: anything else in it)."""
    if isinstance(e, Const) and isinstance(e.value, (int, np.integer)) and not isinstance(e.value, bool):
        return int(e.value)
    if isinstance(e, Var):
        return env[e.name]
    if isinstance(e, Bin) and e.op in _OPS:
        return _OPS[e.op](_ev(e.a, env), _ev(e.b, env))
    raise KeyError(repr(e))


def _exprs(s: Stmt) -> list[Expr]:
    roots: list[Expr] = []
    if isinstance(s, Store):
        roots = [*s.index, s.value]
    elif hasattr(s, "value") and isinstance(s.value, Expr):
        roots = [s.value]
    return [e for r in roots for e in walk(r)]


def _rename_bufs(s: Stmt, bufs: dict[str, str], memo: dict[Expr, Expr]) -> Stmt:
    if isinstance(s, Store):
        return Store(bufs.get(s.buf, s.buf), tuple(rename_loads(i, bufs, memo) for i in s.index),
                     rename_loads(s.value, bufs, memo))
    if isinstance(s, Loop):
        return replace(s, body=[_rename_bufs(x, bufs, memo) for x in s.body])
    if isinstance(s, If):
        return replace(s, cond=rename_loads(s.cond, bufs, memo), body=[_rename_bufs(x, bufs, memo) for x in s.body],
                       orelse=[_rename_bufs(x, bufs, memo) for x in s.orelse])
    raise TypeError(f"a Winograd input transform holds {type(s).__name__}")
