"""Default schedules: turn each compute of a kernel into a vectorized, parallel loop nest.

Rules (per compute): vectorize the innermost output axis (lanes from the target's vector width and the
widest element type); when there is enough work, fuse the outer output axes into one parallel loop, or
split a lone axis into parallel chunks of vectors."""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from kiln.kernel.analysis import coef, flat_index, fuse_contiguous_axes, fuse_row_axes
from kiln.kernel.ir import (
    PARALLEL_MIN_WORK,
    Assign,
    Compute,
    Const,
    Expr,
    If,
    Kernel,
    Load,
    Loop,
    Reduce,
    Stmt,
    Var,
    as_extent,
    cmp,
    hint,
    is_symbolic,
    walk,
)
from kiln.kernel.lower import rows_outermost
from kiln.schedule.amx import schedule_amx
from kiln.schedule.bf16 import bf16_form, schedule_dpbf16
from kiln.schedule.config import Config, Decisions, powers_of_two
from kiln.schedule.dot_ukernel import chosen_dot_ukernel
from kiln.schedule.fuse_rows import fuse_rows
from kiln.schedule.guards import interior_swap
from kiln.schedule.primitives import compute_to_loops, fuse, parallel, rename, split, vectorize
from kiln.schedule.reorder import schedule_reorder
from kiln.schedule.tail_calls import tail_calls
from kiln.schedule.tile import tile_compute
from kiln.schedule.tile_shape import TileShape, choose_tile
from kiln.schedule.transpose import schedule_transpose
from kiln.schedule.winograd import schedule_winograd
from kiln.target import Target


def _elem_bits(k: Kernel, c: Compute) -> int:
    names = {c.out} | {e.buf for e in walk(c.body) if isinstance(e, Load)}
    return max([8 * np.dtype(k.buffer(n).dtype).itemsize for n in names] + [32])


def schedule_compute(k: Kernel, c: Compute, tag: str, target: Target, threads: int,
                     options: dict[str, bool], dec: Decisions | None = None, symbolic_ok: bool = False) -> list[Stmt]:
    """The loop nest of one compute. `dec` makes the choices that could be made otherwise (schedule/config.py):
    without it, or with an empty configuration, every knob takes the heuristic's value."""
    dec = dec if dec is not None else Decisions()
    if not symbolic_ok and symbolic_compute(c):  # run-time extents (kernel/dynamic.py)
        return schedule_symbolic(k, c, tag, target, threads, options, dec)
    if options.get("fuse_axes", True):  # a GEMM's batch axes into its rows, for every strategy and precision
        c = fuse_row_axes(c, lambda name: k.buffer(name).shape)
    if "reorder" in c.hints and options.get("vectorize", True):  # a layout change: transposes (reorder.py)
        nest = schedule_reorder(c, target, threads if options.get("parallel", True) else 1)
        if nest is not None:
            return nest
    if "winograd" in c.hints and options.get("vectorize", True):  # Winograd's transforms (winograd.py)
        nest = schedule_winograd(c, target, threads if options.get("parallel", True) else 1)
        if nest is not None:
            return nest
    if options.get("vectorize", True) and options.get("transpose_blocks", True):  # a transposing copy (transpose.py)
        nest = schedule_transpose(c, lambda name: k.buffer(name).shape, target,
                                  threads if options.get("parallel", True) else 1)
        if nest is not None:
            return nest
    if "int8" in c.hints:  # an integer anchor: the 8-bit dot-product tile (int8.py)
        from kiln.schedule.int8 import schedule_int8
        nest = schedule_int8(k, c, tag, target, threads, options, dec)
        if nest is not None:
            return nest
    if bf16_products(c) and not symbolic_ok:  # precision="bf16" (passes/precision.py): AMX tiles if the host has them
        node = str(c.hints.get("node", c.out))
        nest = schedule_amx(k, c, tag, target, threads, options, dec)
        if nest is not None:
            k.precision[node] = "amx"
            k.strategies.setdefault(node, str(c.hints.get("strategy", "direct")))
            return nest
        nest, why = chosen_dot_ukernel(k, c, bf16_form(c), str(c.hints.get("strategy", "direct")), tag, target,
                                       threads if options.get("parallel", True) else 1, dec)  # bf16 microkernels
        if nest is not None:
            k.precision[node] = "bfmmla" if target.arch == "aarch64" else "avx512bf16"
            k.strategies[node] = "ukernel"
            return nest
        nest = schedule_dpbf16(k, c, tag, target, threads, options, dec)  # else vdpbf16ps / bfdot / bfmmla
        if nest is not None:
            k.strategies[node] = f"direct (ukernel not available: {why})" if why else "direct"
            return nest
        k.precision[node] = "emulated"
        if why:
            k.strategies[node] = f"direct (ukernel not available: {why})"
    if len(c.axes) == 5 and c.store is None and not c.hints and threads > 1 and options.get("thread_parts", True) \
            and not any(isinstance(e, Reduce) for e in walk(c.body)):
        # an elementwise kernel of its own over a blocked image [N, C/cb, H, W, cb] — e.g. the bf16 Cast of a
        # residual sum that the next conv reads in bf16 and the next residual add in float32: its rows outermost,
        # so its parallel loop splits rows as the convs around it do (tile.py image_thread_parts) and each thread reads
        # what it wrote. (resnet50 bf16's 14 casts: 0.25 ms with the two vCPUs on one L3; on two, 1.04 ms split by
        # channel blocks, 0.93–0.95 by rows — DRAM's rate there: their input has left the L3s, README 17th session)
        c = rows_outermost(c)
    if options.get("fuse_axes", True):
        c = fuse_contiguous_axes(c, lambda name: k.buffer(name).shape)
    strategy = str(c.hints.get("strategy", "direct"))
    if strategy == "direct" and options.get("register_tile", True) and options.get("vectorize", True):
        from kiln.schedule.ukernel import ukernel_applies
        if ukernel_applies(k, c, target):  # the tuner may build a packed anchor on the microkernel instead
            strategy = str(dec.knob("strategy", "direct", ("direct", "ukernel")))
    if strategy not in ("direct", "auto"):  # the anchor built on a microkernel or a library call
        built = schedule_by_strategy(k, c, tag, target, threads, options, strategy, dec)
        if built is not None:
            k.strategies.setdefault(c.hints.get("node", c.out), strategy)  # plain "library": the schedule names it
            return built
    if "strategy" in c.hints and not k.strategies.get(c.hints.get("node", c.out), "").startswith("direct ("):
        k.strategies[c.hints.get("node", c.out)] = "direct"  # (a reason recorded above stays)
    if options.get("register_tile", True) and options.get("vectorize", True):
        shape = choose_tile(k, c, target, dec)
        if shape is not None and shape.prefetch and not options.get("prefetch", True):
            shape = replace(shape, prefetch=0)  # the switch `prefetch` (schedule/prefetch.py)
        if shape is not None:
            plain = (lambda pc, ptag: schedule_compute(k, pc, ptag, target, threads, options)) \
                if options.get("pack_operands", True) else None
            return tile_compute(k, c, shape, tag, threads if options.get("parallel", True) else 1, plain, dec,
                                parts=options.get("thread_parts", True),
                                prefetch_blocks=options.get("prefetch", True) and not target.scalable)
    nest = compute_to_loops(c, tag)
    if not c.axes:
        return nest
    symbolic = any(is_symbolic(n) for n in c.extents) or any(
        is_symbolic(n) for r in walk(c.body) if isinstance(r, Reduce) for _, n in r.axes)
    reds = [e for e in walk(c.body) if isinstance(e, Reduce)]
    red_size = int(np.prod([hint(n) for r in reds for _, n in r.axes])) if reds else 1
    work = int(np.prod([hint(n) for n in c.extents])) * red_size

    # the perfect nest of output loops, outermost first
    chain: list[Loop] = []
    cur: list[Stmt] = nest
    while len(cur) == 1 and isinstance(cur[0], Loop) and len(chain) < len(c.axes):
        chain.append(cur[0])
        cur = cur[0].body

    def rebuild(loops: list[Loop], body: list[Stmt]) -> list[Stmt]:
        for lp in reversed(loops):
            body = [Loop(lp.var, lp.extent, body, lp.kind, lp.lanes, lp.masked)]
        return body

    inner = chain[-1]
    n_inner = hint(inner.extent)
    lanes = target.lanes(_elem_bits(k, c))
    vec_out = False
    red_loop = _innermost_reduction(cur)
    if options.get("vectorize", True):
        out_contig = _contiguous(k, c.body, inner.var)
        if red_loop is not None and _contiguous(k, c.body, red_loop.var) and (n_inner < 4 or not out_contig) \
                and hint(red_loop.extent) >= 4:
            red_loop.kind, red_loop.lanes, red_loop.masked = "vector_reduce", lanes, True
        elif n_inner >= 4:
            while lanes > n_inner and lanes > 4:
                lanes //= 2
            # wider than a register: LLVM splits the vector, i.e. the loop is unrolled by lanes / register lanes
            lanes = int(dec.knob("lanes", lanes, powers_of_two(4, min(4 * target.lanes(_elem_bits(k, c)),
                                                                          max(lanes, n_inner)))))
            chain[-1] = vectorize(inner, lanes)
            vec_out = True

    if reds and not symbolic:  # a window over padding (blocked pooling): interior iterations without the guards
        ranges = {v: n for r in reds for v, n in r.axes}
        if vec_out:
            ranges[inner.var] = n_inner
        found = interior_swap(c.body, ranges)
        if found is not None:
            cur = [If(found[1], rename(cur, found[0]), cur)]
    if not options.get("parallel", True) or threads <= 1 or \
            not dec.knob("parallel", work >= PARALLEL_MIN_WORK, (False, True)):
        return rebuild(chain, cur)
    if len(chain) == 1 and vec_out:  # a single vector axis: parallel chunks of whole vectors
        n = n_inner
        chunk = max(lanes, -(-n // (threads * int(dec.knob("parallel_min", 4, powers_of_two(1, 64))))))
        if symbolic:  # planned for the upper bound, a chunk would hold all of a short run: chunks of a fixed size
            chunk = max(lanes, SYMBOLIC_CHUNK)
        chunk = -(-chunk // lanes) * lanes
        if chunk >= n:
            return rebuild(chain, cur)
        return [_serial_below(parallel(split(chain[0], chunk)), c)]
    # fuse outer (non-vector) loops until there is enough parallelism
    outer = chain[:-1] if vec_out else chain
    fused = rebuild(outer[:1], [])[0]
    fused.body = rebuild(outer[1:], rebuild(chain[len(outer):], cur))
    used = 1
    least = threads * int(dec.knob("parallel_min", 8, powers_of_two(1, 64)))
    while used < len(outer) and hint(fused.extent) < least:
        fused = fuse(fused)
        used += 1
    return [_serial_below(parallel(fused), c)]


def _serial_below(loop: Loop, c: Compute) -> Loop:
    """A parallel loop over run-time extents was planned for the upper bounds: it carries its actual work as an
    expression, and below PARALLEL_MIN_WORK it runs serially (a 16-token LayerNorm: 1 µs of work, 50 µs of
    fork/join; codegen/kernel.py)."""
    if symbolic_compute(c):
        work: Expr = as_extent(c.extents[0])
        for e in list(c.extents[1:]) + [n for r in walk(c.body) if isinstance(r, Reduce) for _, n in r.axes]:
            work = work * e
        loop.work = work
    return loop


def symbolic_compute(c: Compute) -> bool:
    """Does the compute run over a symbolic dim (an extent known only at run time)?"""
    return any(is_symbolic(n) for n in c.extents) or any(
        is_symbolic(n) for r in walk(c.body) if isinstance(r, Reduce) for _, n in r.axes)


# schedules built for constant extents, which a compute with run-time extents runs without (exe.meta says so)
_SPECIALIZED = {"reorder": "in-register transposes (reorder.py)", "winograd": "Winograd transforms (winograd.py)",
                "int8": "the 8-bit dot-product tile (int8.py)"}


def schedule_symbolic(k: Kernel, c: Compute, tag: str, target: Target, threads: int, options: dict[str, bool],
                      dec: Decisions) -> list[Stmt]:
    """A compute with run-time extents. The transposes' and Winograd's schedules, the 8-bit and AMX tiles, the
    microkernels and library calls are built for constant extents: such a compute runs the direct register tile
    (its tile counts and edges computed at run time) or the plain vectorized nest, and `Kernel.strategies` says so
    for an anchor that asked for another strategy."""
    node = c.hints.get("node")
    if node is not None and c.hints.get("strategy", "direct") not in ("direct", "auto"):
        k.strategies[node] = "direct (symbolic dims)"
        k.fallbacks.append(f"{node}: strategy {c.hints['strategy']} → direct register tile")
    for hint_name, what in _SPECIALIZED.items():
        if hint_name in c.hints:
            k.fallbacks.append(f"{c.out}: {what} → the plain vectorized nest")
    if bf16_products(c):  # no AMX tile over run-time rows yet
        k.precision[str(node or c.out)] = "emulated"
        k.fallbacks.append(f"{node or c.out}: bf16 AMX tiles → emulated (bf16 storage, fp32 FMAs)")
    if options.get("fuse_axes", True):
        c = fuse_contiguous_axes(c, lambda name: k.buffer(name).shape)
    if options.get("register_tile", True) and options.get("vectorize", True):
        shape = choose_tile(k, c, target, dec)
        if shape is not None:
            if node is not None:
                k.strategies.setdefault(node, "direct")
            threads = threads if options.get("parallel", True) else 1
            nest = regime_tiles(k, c, shape, tag, target, threads, dec)
            across = _batch_rows(k, c, shape, tag, target, threads, dec)
            return nest if across is None else [If(across[0], across[1], nest)]
    plain = {h: v for h, v in c.hints.items() if h not in ("reorder", "winograd", "int8", "strategy")}
    c = Compute(c.out, c.axes, c.extents, c.body, c.store, plain)
    opts = {**options, "register_tile": False}
    nest = schedule_compute(k, c, tag, target, threads, opts, dec, symbolic_ok=True)
    short = _short_rows_copy(k, c, target) if options.get("vectorize", True) else None
    if short is not None:  # below one vector of run-time rows: the copy vectorized along its static axis instead
        lanes = Const(target.lanes(_elem_bits(k, c)), "int64")
        nest = [If(cmp("<", as_extent(c.extents[-1]), lanes),
                   schedule_compute(k, short, f"{tag}s", target, threads, opts, Decisions(), symbolic_ok=True), nest)]
    return nest


def _short_rows_copy(k: Kernel, c: Compute, target: Target) -> Compute | None:
    """A transposing compute (no reduction) whose innermost axis is run-time — Kᵀ in attention, [b, h, d, seq] from
    [b, seq, h·d] — is vectorized along that axis, its stores contiguous; at one token every vector holds one lane
    (256 single-lane iterations per head group). The same compute with a static axis along which every load is
    contiguous or invariant (d) moved innermost: whole-vector loads, strided stores. Chosen at run time below one
    vector of rows (gpt_decoder's Kᵀ copy was 2.4% of a 1-token step). None where there is no such axis."""
    loads = [e for e in walk(c.body) if isinstance(e, Load)]
    if not loads or not c.axes or not is_symbolic(c.extents[-1]) or any(isinstance(e, Reduce) for e in walk(c.body)):
        return None
    lanes = target.lanes(_elem_bits(k, c))
    flats = [flat_index(ld.index, k.buffer(ld.buf).shape) for ld in loads]
    for i, (v, n) in enumerate(zip(c.axes[:-1], c.extents[:-1])):
        steps = [coef(f, v) for f in flats]
        if not is_symbolic(n) and int(n) >= lanes and 1 in steps and all(x in (0, 1) for x in steps):
            order = [j for j in range(len(c.axes)) if j != i] + [i]
            return Compute(c.out, tuple(c.axes[j] for j in order), tuple(c.extents[j] for j in order), c.body,
                           c.store_index, c.hints)
    return None


# elements per parallel chunk of a vector loop over a run-time extent (the pool then deals the chunks out: a
# 16-token GELU gets 24 of them, a 512-token one 768)
SYMBOLIC_CHUNK = 2048

# the tail tiles of a register tile over run-time rows (a symbolic M): one nest of full tiles, its last, partial
# row block on the smallest tail (below the full tile's rows) that covers it, picked at run time, so at most a few
# rows of FMAs are wasted at any M. A GEMM with packed weights (full tiles of 8 rows, tile.py: RUN_TIME_MR): 77 rows
# run 9 full tiles and a 6-row tail (5 rows), 16 two full tiles, 9 one and a 1-row tail. Before, the whole
# M ran on one of 14, 8, 4, 3 or 1 rows picked by a row-steps cost (77 rows: 84 on 14-row tiles): the tails measured
# 0.95–0.96× that at 1×77, 4×77 and 1×200 tokens of gpt_decoder and bert_base, 0.98× at 4 × 512, equal at 1–16
# tokens (Zen 5, one interleaved A/B run), and with one nest instead of five the model's LLVM time 1.06 → 0.77 CPU-s.
# The 6-row tail: 5 or 6 rows left had run the full tile clamped — gpt_decoder 1×5 1.35×, 4×5 1.49×, 1×6 1.26× its
# static builds; with it 0.85–0.87× that (one interleaved run)
TAIL_ROWS = (8, 6, 4, 3, 1)
# the tails that call a shared microkernel instead (schedule/tail_calls.py): the 6-, 4- and 3-row ones, one call
# group — one C tile and one epilogue per kernel for all three —, so the 6-row tail cost the dynamic build almost no
# compile time (gpt_decoder 0.468 → 0.477 s with it; emitted, 0.46 → 0.49 s), and the called 3-row tail less than
# the emitted one (0.52 → 0.51 s). Called, the same speed: gpt_decoder 1×2 … 4×4 0.99–1.01× the emitted tails (the
# microkernel prefetching its panel as far ahead as the emitted tile). The 1-row tail — a decode step's whole GEMM —
# stays emitted: its epilogue on registers counts there, and it is cheap to compile
TAIL_CALL_ROWS = (6, 4, 3)
# an activation × activation product (attention's): the 1-row tail only (a decode step's one query row; before, a
# 1-row nest of its own — the same speed, 5% more LLVM time; without it, 1×1 and 4×1 tokens 1.06× slower). Its 8-,
# 4- and 3-row tails measured 0.96–0.99× at gpt_decoder's 1×3 … 1×200 for 10% more LLVM time; the 4-row one alone
# 0.95–0.97× at 1×2 … 4×3 for 20% more of these kernels' codegen and LLVM time (one interleaved run each)
PRODUCT_TAIL_ROWS = (1,)


def regime_tiles(k: Kernel, c: Compute, shape: TileShape, tag: str, target: Target, threads: int,
                 dec: Decisions) -> list[Stmt]:
    """The register tile of a compute with run-time extents; when its rows M are a symbolic dim, one nest of full
    MR-row tiles whose last row block runs on a tail tile picked at run time (DietCode's shape-generic micro-kernels,
    here by hand from the registers):

        for mo < ⌈M/MR⌉:  left = M − mo·MR
          if left ≤ 1: 1-row tile   elif left ≤ 3: 3-row   elif left ≤ 4: 4-row   elif left ≤ 6: 6-row
          else: the MR-row tile, rows past M clamped (read row M − 1, not stored)
    with TAIL_ROWS for a GEMM with packed weights — those in TAIL_CALL_ROWS calls of shared microkernels
    (tail_calls.py) —, PRODUCT_TAIL_ROWS for an activation × activation product. A is read in place (no run-time
    packing: with 8-row tiles the copy measured slower than the rows' L1 conflicts it saves, gpt_decoder's K = 1024
    down-projection 1.06× at 4 × 128); an activation × activation product's tile loops run on the calling thread
    when small (_small_on_caller)."""
    M = c.extents[shape.m_axis]
    rows = TAIL_ROWS if "nr" in c.hints else PRODUCT_TAIL_ROWS
    tails = tuple(r for r in rows if r < shape.mr) if is_symbolic(M) and not shape.flatten_rows else ()
    calls = None
    # the knob `tail_calls`: a packed GEMM's tails in TAIL_CALL_ROWS call the shared microkernels (tail_calls.py)
    if "nr" in c.hints and any(r in TAIL_CALL_ROWS for r in tails) and dec.knob("tail_calls", True, (False, True)):
        red = next(e for e in walk(c.body) if isinstance(e, Reduce))
        calls = tail_calls(k, c, red, c.axes[shape.m_axis], c.axes[shape.n_axis], shape.nr, target,
                           tuple(r for r in tails if r in TAIL_CALL_ROWS), shape.prefetch)
        node = c.hints.get("node")
        if calls is not None and node is not None and k.strategies.get(node) == "direct":
            k.strategies[node] = "direct (tails " + ", ".join(f"{r}-row" for r in calls.kernels) + ": microkernel)"
    return _small_on_caller(tile_compute(k, c, shape, tag, threads, None, dec, tails=tails, calls=calls), c)


def _batch_rows(k: Kernel, c: Compute, shape: TileShape, tag: str, target: Target, threads: int,
                dec: Decisions) -> tuple[Expr, list[Stmt]] | None:
    """A GEMM with packed weights over run-time [batch, seq] rows: the nest of tiles whose rows are the batch
    entries, for when there are more of them than tokens — (batch > seq, that nest; its knobs `batch_rows.…`) — or
    None.

    The buffers are laid out for the bounds (kernel/dynamic.py), so a batch entry's rows start a constant stride
    apart and a tile over the batch axis is affine; one over batch × seq rows would not be (analysis.fuse_row_axes
    merges them in a static build). At 4 × 1 tokens the seq-rows nest ran four 1-row tiles per weight panel —
    bert_base_dynamic 1.56×, gpt_decoder 1.69× their static builds."""
    m = shape.m_axis % len(c.axes)
    if "nr" not in c.hints or m == 0 or shape.flatten_rows or any(h in c.hints for h in ("spatial", "in_block")):
        return None
    batch, seq = c.extents[m - 1], c.extents[m]
    if not (is_symbolic(batch) and is_symbolic(seq)):
        return None
    c_b = Compute(c.out, c.axes, c.extents, c.body, c.store, {**c.hints, "m_axis": m - 1 - len(c.axes)})
    saved, dec.prefix = dec.prefix, dec.prefix + "batch_rows."
    try:
        shape_b = choose_tile(k, c_b, target, dec)
        if shape_b is None or shape_b.m_axis % len(c.axes) != m - 1:
            return None
        more_batch = cmp(">", as_extent(batch), as_extent(seq))
        return more_batch, regime_tiles(k, c_b, shape_b, tag + "b", target, threads, dec)
    finally:
        dec.prefix = saved


def _small_on_caller(nest: list[Stmt], c: Compute) -> list[Stmt]:
    """An activation × activation product (attention's, no packed weights) carries its run-time work on its tile
    loops, and below PARALLEL_MIN_WORK runs on the calling thread (_serial_below), as its static build decides at
    compile time: at one token each of a decoder's attention matmuls is 256 multiply-adds per head, less than the
    pool's fork/join (gpt_decoder's 1-token step 1.21 → 1.11× its static build). A GEMM with packed weights stays on
    the pool at any size: its weights stream from memory faster on both cores (with every tile loop on the calling
    thread when small, the model ran 1.03–1.15× slower)."""
    if "nr" in c.hints:
        return nest
    for st in nest:
        if isinstance(st, Loop) and st.kind == "parallel":
            _serial_below(st, c)
        elif isinstance(st, If):
            _small_on_caller(st.body, c)
            _small_on_caller(st.orelse, c)
    return nest


def schedule_by_strategy(k: Kernel, c: Compute, tag: str, target: Target, threads: int,
                         options: dict[str, bool], strategy: str, dec: Decisions | None = None) -> list[Stmt] | None:
    """The loop nest of an anchor built with a microkernel or a library, or None where that strategy does
    not apply to this compute (it is then emitted directly, and `Kernel.strategies` records that)."""
    if strategy == "ukernel":
        from kiln.schedule.ukernel import schedule_ukernel
        return schedule_ukernel(k, c, tag, target, threads, options, dec)
    from kiln.schedule.library import schedule_library
    lib = schedule_library(k, c, tag, threads, options, strategy)
    if lib is None:
        return None
    pre = [s for i, p in enumerate(lib.pre) for s in schedule_compute(k, p, f"{tag}l{i}", target, threads, options)]
    post = [s for i, p in enumerate(lib.post) for s in schedule_compute(k, p, f"{tag}e{i}", target, threads, options)]
    return [*pre, *lib.calls, *post]


def _innermost_reduction(body: list[Stmt]) -> Loop | None:
    """The innermost loop of a reduction nest [Local, Loop(r0, [Loop(r1, [Assign])]), Store]."""
    loops = [s for s in body if isinstance(s, Loop)]
    if len(loops) != 1:
        return None
    lp = loops[0]
    while len(lp.body) == 1 and isinstance(lp.body[0], Loop):
        lp = lp.body[0]
    return lp if len(lp.body) == 1 and isinstance(lp.body[0], Assign) else None


def _contiguous(k: Kernel, e: Expr, v: Var) -> bool:
    """Does some load in `e` walk memory with unit stride along `v`?"""
    for ld in walk(e):
        if isinstance(ld, Load):
            b = k.buffer(ld.buf)
            if coef(flat_index(ld.index, b.shape), v) == 1:
                return True
    return False


def bf16_products(c: Compute) -> bool:
    """Does the compute reduce products of bfloat16 operands (a bf16 anchor)?"""
    return any(isinstance(r, Reduce) and any(isinstance(x, Load) and x.dtype == "bfloat16" for x in walk(r.body))
               for r in walk(c.body))


def schedule_kernel(k: Kernel, target: Target, threads: int, options: dict[str, bool],
                    config: Config | Decisions | None = None) -> Kernel:
    """Schedule every compute of `k`. `config` (a tuned record, a search candidate: schedule/config.py) sets the
    knobs by name, "<compute index>:<knob>"; the decisions taken are left in `k.decisions`."""
    dec = config if isinstance(config, Decisions) else Decisions(config or {})
    k.body, k.shared_ir = [], {}
    for i, c in enumerate(k.computes):
        nest = schedule_compute(k, c, str(i), target, threads, options, dec.at(i))
        k.body += split_parallel(nest, dec, threads)
    if options.get("fuse_rows", True):  # per-row statistics and their consumer in one parallel loop (fuse_rows.py)
        k.body = fuse_rows(k, k.body)
    k.decisions = dec
    return k


def split_parallel(nest: list[Stmt], dec: Decisions, threads: int) -> list[Stmt]:
    """The parallel split knob: how many chunks per thread the pool hands out for each top-level parallel loop
    (0: codegen's rule — 4 per thread, more for a long kernel, codegen/kernel.py)."""
    if threads <= 1 or not any(isinstance(s, Loop) and s.kind == "parallel" for s in nest):
        return nest
    chunks = int(dec.knob("chunks", 0, [0] + powers_of_two(1, 64)))
    if not chunks:
        return nest
    return [replace(s, chunks=chunks) if isinstance(s, Loop) and s.kind == "parallel" else s for s in nest]


def schedule_key(k: Kernel) -> str:
    """Kernels with equal keys get equal schedules: the printed computes and buffers (kernel/build.py names
    buffers b0, b1, … per kernel) and every hint but the node's name, with the kernel's own name left out."""
    hints = [{h: v for h, v in c.hints.items() if h != "node"} for c in k.computes]
    return str(k).replace(k.name, "K", 1) + repr(hints)


def schedule_program(kernels: list[Kernel], target: Target, threads: int, options: dict[str, bool],
                     configs: dict[int, Config] | None = None) -> None:
    """Schedule each distinct kernel once (ResNet's repeated blocks: resnet50's 83 kernels are 36 schedules);
    a repeat takes the first one's loop nest, scratch buffers, microkernels and decisions (the nest is shared, not
    copied: nothing after scheduling rewrites it). `configs`: tuned knob settings by kernel index (step 3b); a
    kernel with one is distinct from its untuned twin."""
    first: dict[str, Kernel] = {}
    for i, k in enumerate(kernels):
        config = (configs or {}).get(i)
        key = schedule_key(k) + (repr(sorted(config.items())) if config else "")
        done = first.get(key)
        if done is None:
            first[key] = schedule_kernel(k, target, threads, options, config)
            continue
        k.body, k.scratch, k.decisions = done.body, list(done.scratch), done.decisions
        k.extern_ir, k.symbols, k.fallbacks = dict(done.extern_ir), list(done.symbols), list(done.fallbacks)
        k.shared_ir = dict(done.shared_ir)
        for mine, theirs in zip(k.computes, done.computes):
            for mine_map, their_map in ((k.strategies, done.strategies), (k.precision, done.precision)):
                how = their_map.get(theirs.hints.get("node", theirs.out))
                if how is not None:
                    mine_map[mine.hints.get("node", mine.out)] = how
