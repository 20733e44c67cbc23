"""Register tiling for reductions that have a shared vector operand (MatMul, Conv): the direct-emission
GEMM/convolution schedule.

For out[.., m, .., n] = epilogue(Σ_r body(m, n, r)) with n the innermost (contiguous) axis, pick an axis
m such that some load in `body` varies with n but not with m (the shared operand: B[k, n] in a MatMul,
the input row in an NCHW conv) and some load varies with m but not n (the broadcast operand: A[m, k], the
weights). Then an MR×NR tile of outputs lives in MR·NR/lanes vector registers for the whole reduction:

    parallel for (others, no, mo):                       # others: remaining output axes; (mo, no) when
                                                         # the reduction is short (see tile_compute)
      for ni in 0..min(NR, N − no·NR) vector<NR> masked: # one NR-wide tile column, masked at the edge
        local $acc[MR] = 0
        for r…:                                          # the reduction, in its own order
          for mi in 0..MR unroll:
            $acc[mi] += body(m = min(mo·MR + mi, M−1), n = no·NR + ni, r)
        for mi in 0..MR unroll:
          if mo·MR + mi < M: out[m, n] = epilogue($acc[mi])

Each reduction step loads the shared operand once (NR/lanes vector loads) and reuses it for MR FMAs."""
from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from kiln.kernel.analysis import simplify_panels
from kiln.kernel.ir import (
    Assign,
    Bin,
    Compute,
    Const,
    Expr,
    If,
    Kernel,
    Load,
    Local,
    LocalRef,
    Loop,
    Reduce,
    Select,
    Stmt,
    Store,
    Var,
    as_extent,
    cmp,
    hint,
    init_value,
    is_symbolic,
    minimum,
    substitute,
    walk,
)
from kiln.schedule.config import Decisions, divisors, powers_of_two
from kiln.schedule.dot_edge import dot_edge, dot_edge_operands
from kiln.schedule.guards import split_interior
from kiln.schedule.pack import pack_rows
from kiln.schedule.prefetch import DISTANCES as PREFETCH_DISTANCES
from kiln.schedule.prefetch import (
    operand_bytes,
    prefetch_ahead,
    prefetch_next_block,
    prefetch_panel,
    streamed_loads,
)
from kiln.schedule.primitives import combine
from kiln.schedule.tile_shape import TileShape

if TYPE_CHECKING:
    from kiln.schedule.tail_calls import TailCalls

# a blocked input's channel loop is unrolled in runs of at most this many FMAs (see tile_compute): AVX2 6×16 tiles
# unroll 16-channel blocks whole (192 FMAs), AVX-512 14×32 and 8×32 tiles 8 of their 32 channels (224, 128).
# 256 let LLVM's znver5 scheduling model hoist the 8×32 tile's broadcasts across 16 channels until 86 vectors spilled
# per trip (resnet18/50's last-stage Winograd products; not under sapphirerapids'), and the spilling kernel's
# speed then varied 0.51–0.98 ms with where the JIT placed it (tests/test_register_pressure.py)
UNROLL_FMAS = 224


def flatten_rows(c: Compute) -> Compute:
    """Merge a conv's output rows (oh, ow) — the hint `spatial` — into one pixel axis p:

        for b, co, oh, ow (, ci):  out[b, co, oh, ow (, ci)] = f(oh, ow)
      ⇒ for b, co, p < OH·OW (, ci):  out[b, co, p // OW, p % OW (, ci)] = f(p // OW, p % OW)

    An MR-row tile then covers MR consecutive pixels, crossing row ends (14 pixels a row: 33 tiles of 6 instead
    of 6+6+2 per row). Output-shaped accesses stay affine in p (flat_index folds (p // OW)·OW + p % OW to p);
    the input rows a tile reads are per-row addresses, computed once per tile."""
    h_axis, w_axis = (a % len(c.axes) for a in c.hints["spatial"])
    oh, ow = c.axes[h_axis], c.axes[w_axis]
    w = c.extents[w_axis]
    p = Var(f"{oh.name}{ow.name}")
    m: dict[Expr, Expr] = {oh: p // w, ow: p % w}
    keep = [i for i in range(len(c.axes)) if i != w_axis]
    axes = tuple(p if i == h_axis else c.axes[i] for i in keep)
    extents = tuple(c.extents[i] * w if i == h_axis else c.extents[i] for i in keep)
    shift = lambda i: i - (i > w_axis)  # noqa: E731  (axis positions after w's removal, counted from the start)
    hints = {k: v for k, v in c.hints.items() if k != "spatial"}
    hints.update(m_axis=h_axis, n_axis=shift(c.hints.get("n_axis", -1) % len(c.axes)), pixel_rows=True)
    return Compute(c.out, axes, extents, substitute(c.body, m), substitute_all(c.store_index, m), hints)


def tile_compute(k: Kernel, c: Compute, t: TileShape, tag: str, threads: int,
                 schedule_plain: Callable[[Compute, str], list[Stmt]] | None = None,
                 dec: Decisions | None = None, tails: tuple[int, ...] = (),
                 calls: TailCalls | None = None, parts: bool = True, prefetch_blocks: bool = True) -> list[Stmt]:
    """`tails`: over run-time rows, the tail tiles' heights (schedule/default.py: regime_tiles); `calls`: those of
    them that call a shared microkernel instead (schedule/tail_calls.py); `parts`: split the parallel loop into one
    part of the image per thread where it divides (`image_thread_parts`; switch `thread_parts`); `prefetch_blocks`: the
    knob `prefetch_block` may apply (off with the switch `prefetch`, and on scalable targets)."""
    dec = dec if dec is not None else Decisions()
    if t.flatten_rows:
        c = flatten_rows(c)
        t = TileShape(c.hints["m_axis"], c.hints["n_axis"], t.mr, t.nr, t.lanes, False, t.channel_block,
                      dot_edge=t.dot_edge, l2_bytes=t.l2_bytes, chains=t.chains)
    red = next(e for e in walk(c.body) if isinstance(e, Reduce))
    m_v, n_v = c.axes[t.m_axis], c.axes[t.n_axis]
    M, N = c.extents[t.m_axis], c.extents[t.n_axis]
    mo, no, mi, ni = Var(f"{m_v.name}o"), Var(f"{n_v.name}o"), Var(f"{m_v.name}i"), Var(f"{n_v.name}i")
    others = [(v, e) for i, (v, e) in enumerate(zip(c.axes, c.extents)) if i not in (t.m_axis, t.n_axis)]
    dynamic = is_symbolic(M) or is_symbolic(N) or any(is_symbolic(e) for _, e in others)
    # A packed into MR-row panels (pack.py): with constant extents, by the knob `pack` (a run-time M reads A in place)
    packed = pack_rows(k, c, red, t, mo, mi, tag, dec, threads > 1) if schedule_plain is not None else None
    pre, swap = packed or ([], {})
    red_body = substitute(red.body, swap) if swap else red.body
    # a symbolic M or N (kernel/dynamic.py): the tile counts are run-time expressions, every edge is handled
    n_mo, n_no = _ceil_div(M, t.mr), _ceil_div(N, t.nr)
    # one parallel loop over (others…, no, mo): mo fastest, so consecutive tiles share the n-panel — unless the
    # reduction is short (1×1 convs with Ci ≤ 128): then the tile is mostly its stores, and no fastest keeps
    # the MR rows it writes (and the residual it reads) a few sequential streams instead of M interleaved
    # ones (resnet50's Ci=64 → 256 convs on 56×56: 1.50 → 1.38 ms, mobilenetv2's 16 → 96 on 112×112: 1.3 → 0.9)
    red_size = int(np.prod([hint(e) for _, e in red.axes]))
    # the knob `order`: which tile index runs fastest ("m": down the rows of one panel, "n": across panels)
    fast = dec.knob("order", "n" if red_size <= 128 and "nr" not in c.hints else "m", ("m", "n"))
    order = [mo, no] if fast == "n" else [no, mo]
    extents = [e for _, e in others] + ([n_no, n_mo] if order[0] is no else [n_mo, n_no])
    outer: list[Var] = []
    panel_outer: Expr | None = None  # run time: the panel index outermost (else the batch entries, as static)
    if dynamic and fast == "m" and others:
        # run-time extents over several row blocks (a batch × a sequence in their max layout: rows that are not one
        # affine axis): the panel index outermost, so a weight panel serves every row tile of every batch entry
        # while it is in cache, instead of the whole weight matrix streaming again per batch entry — while the rows
        # of all batch entries fit in L2. Past that, a panel pass streams them all from L3 again for every panel
        # (bert's FFN GEMMs at 4 × 384 tokens: 1.8× the static build's time); then, at run time, the batch entries
        # outermost, as the static build orders them: one entry's rows stay in L2 while its panels pass.
        # The knob `panel_outer_l2`: the rows' bytes, in eighths of L2, up to which the panel index is outermost
        eighths = int(dec.knob("panel_outer_l2", 4, (0, 2, 4, 8, 16, 1 << 20)))
        rows_bytes: Expr = as_extent(M) * Const(red_size * 4, "int64")  # (fp32 rows: bf16 ones are half)
        for _, e in others:
            rows_bytes = rows_bytes * as_extent(e)
        panel_outer = cmp("<=", rows_bytes, Const(min(1 << 62, t.l2_bytes * eighths // 8), "int64"))
        # Weights that fit in L2 are read again from there by each batch entry at little cost: then the panel index
        # is outermost only while each entry has few rows (the knob `panel_outer_rows`), where a decode step's
        # entries share each panel pass (gpt_decoder 4×1 0.70×, 4×3 0.92× batch-outer's time); with more rows each
        # thread keeps to its own batch entries' rows, as the kernels before it wrote them (gpt_decoder 4×4 0.92×,
        # 4×16 0.89×, 4×77 0.89× the panel-outer order's time in one run — the vCPUs' host state not probed —, the
        # same within 1% in three runs with both on one L3). bert_base's weights (2.4–9.4 MB) stream from L3:
        # there panel-outer at 4×4 takes 0.78× batch-outer's time. (Zen 5, interleaved A/B runs)
        if red_size * hint(N) * 4 <= t.l2_bytes:
            few = int(dec.knob("panel_outer_rows", 3, (0, 1, 3, 7, 1 << 20)))
            panel_outer = Bin("and", panel_outer, cmp("<=", as_extent(M), Const(few, "int64")))
        outer, extents, order = [no], [n_no] + extents[:-2] + [n_mo], [mo]
    names = outer + [v for v, _ in others] + order
    # a static N whose last panel needs fewer vectors than NR (N = 257 in 32-wide panels: one useful column):
    # that panel runs its own tile (the knob `narrow`, below), instead of masking off the rest of an NR tile whose
    # FMAs would all still run (gemm_odd: 288 lanes computed per row → 272 in a one-vector tile)
    rem = 0 if is_symbolic(N) else N % t.nr
    # the knob `narrow`: how that tile computes. "dot" (the default where it applies): its columns as dot products
    # vectorized along the reduction, every lane useful (dot_edge.py; gemm_odd 0.240 → 0.229 ms at AVX-512, 0.242 →
    # 0.235 at AVX2 on Zen 4). Or a vector width: fewer lanes than the target's compute fewer dead lanes (one
    # column in 4 lanes, not 16), and where the core runs a 512-bit FMA as two 256-bit halves (Zen 4) a ymm or xmm
    # FMA costs half of a zmm one (0.240 → 0.234 ms); elsewhere the same as the full width.
    # The dot edge's MR·rem partials must fit the main tile's MR·NR/L accumulators: rem ≤ NR/L.
    w: int | str = t.lanes
    dot = dot_edge_operands(red, m_v, n_v) if t.dot_edge and packed is None and not dynamic and not t.channel_block \
        and not c.hints.get("in_block") and 0 < rem <= t.nr // t.lanes else None
    if 0 < rem < t.lanes:
        fits: list[int | str] = [v for v in powers_of_two(4, t.lanes) if v >= rem]
        w = dec.knob("narrow", "dot" if dot is not None else fits[0], (["dot"] if dot is not None else []) + fits)
    narrow = -(-rem // w) * w if isinstance(w, int) else 0
    narrow_last = 0 < rem and narrow < t.nr
    # the knob `split_rows`: each thread takes its own part of every panel's row tiles, instead of a contiguous
    # run of the (panel, row tile) loop — equal shares when the panels cost unequal amounts (a narrow last panel)
    # and a run of the loop would leave it all to one thread; the default where that is the case
    by_rows = None
    if parts and threads > 1 and not dynamic and not c.hints.get("rows_outer") and "spatial" not in c.hints \
            and isinstance(n_mo, int) and n_mo % threads == 0 and n_mo >= 2 * threads and fast == "m":
        by_rows = mo if dec.knob("split_rows", narrow_last, (False, True)) else None
    names, extents, parted = image_thread_parts(c, names, extents, mo, threads if parts else 1, dynamic, by_rows)
    # the knob `block`: tiles of the fastest index per cache block — the slower index then sweeps each block
    # (block < extent: a block of rows stays in L2 while every panel passes, or a block of panels while every
    # row tile does); the default is one block (no blocking)
    n_fast = extents[-1]
    if dynamic:  # blocks of run-time-many tiles: not yet (one block)
        block = n_fast
        total: Expr | int = as_extent(extents[0])
        for e in extents[1:]:
            total = total * e
    else:
        block = int(dec.knob("block", n_fast, [b for b in powers_of_two(1, n_fast) if b < n_fast] + [n_fast]))
        total = int(np.prod(extents))
    flat = Var(f"tile{tag}")
    decode: dict[Expr, Expr] = {}
    stride = 1
    if not dynamic and block < n_fast:  # (others…, fast block, slow, fast in block); the last block may be partial
        slow_v, fast_v = names[-2], names[-1]
        n_slow = extents[-2]
        per_block = block * n_slow
        stride = n_fast * n_slow
        for v, e in reversed(list(zip(names[:-2], extents[:-2]))):
            decode[v] = (flat // stride) % e
            stride *= e
        within = flat % (n_fast * n_slow)
        fb = within // per_block
        rest = within % per_block
        # a partial last block holds `n_fast % block` fast tiles per slow index
        last = n_fast % block
        size = minimum(Const(block, "int64"), Const(n_fast, "int64") - fb * block) if last else Const(block, "int64")
        decode[slow_v] = rest // size
        decode[fast_v] = fb * block + rest % size
    else:
        strides = _strides(names, extents)
        if panel_outer is not None:
            # the same tiles with the batch entries outermost, chosen at run time: the same decode with the strides
            # of either order — a select of the symbolic dims alone, computed once per call — instead of a select
            # between two decodes in every index of the tile (gpt_decoder's dynamic GEMMs: 10% less LLVM time)
            theirs = _strides(names[1:-1] + [names[0], names[-1]], extents[1:-1] + [extents[0], extents[-1]])
            strides = {v: s if s == theirs[v] else Select(panel_outer, as_extent(s), as_extent(theirs[v]))
                       for v, s in strides.items()}
        decode = decode_flat(flat, names, extents, strides)
    decode = rejoin_parts(decode, parted)
    m_expr = mo * t.mr + mi
    n_expr = no * t.nr + ni
    n_ext = minimum(Const(t.nr, "int64"), as_extent(N) - no * t.nr) if is_symbolic(N) or N % t.nr \
        else Const(t.nr, "int64")

    red_axes = red.axes
    split: dict[Expr, Expr] = {}
    unroll_last = 0
    if c.hints.get("in_block"):
        # a blocked input's channels (the innermost reduction axis) unrolled, in runs of at most UNROLL_FMAS: each
        # step's pixels are then constant offsets from one address per tile row (AVX2, 1×1 conv, Ci=1024 on 14×14:
        # 163 → 185 GFLOP/s; unrolling the taps too measured slower). Longer unrolled runs let LLVM's scheduler
        # hoist loads until vectors spill (AVX-512 14×32 tiles, 16 channels unrolled: ~1.4 spills per FMA in the
        # compiled code; 8: none)
        (rc, ci) = red.axes[-1]
        fmas = t.mr * max(1, t.nr // t.lanes)
        unroll_last = max(d for d in range(1, min(ci, max(1, UNROLL_FMAS // fmas)) + 1) if ci % d == 0)
        unroll_last = int(dec.knob("unroll", unroll_last, divisors(ci)))
        if unroll_last < ci:
            rco, rci = Var(f"{rc.name}o"), Var(f"{rc.name}u")
            split = {rc: rco * unroll_last + rci}
            red_axes = red.axes[:-1] + ((rco, ci // unroll_last), (rci, unroll_last))
    if t.channel_block:  # for rc_o, taps…, rc_i < CB: a block's pixels and weights stay in L1
        (rc, ci), taps = red.axes[0], red.axes[1:]
        cb = t.channel_block
        rco, rci = Var(f"{rc.name}o"), Var(f"{rc.name}i")
        split = {rc: rco * cb + rci}
        red_axes = ((rco, ci // cb),) + taps + ((rci, cb),)

    def tile_term(edge: bool) -> Expr:
        m_read = minimum(m_expr, as_extent(M) - 1) if edge else m_expr
        term = simplify_panels(substitute(red_body, {m_v: m_read, n_v: n_expr}), ni, t.nr)
        return substitute(term, split) if split else term

    # the knob `prefetch`: the streamed operand prefetched this many reduction steps ahead (0: none; prefetch.py),
    # a knob only where the tile has a streamed operand
    # (a packed weight panel's tile took the knob `prefetch` in _packed_tile, default one page ahead: t.prefetch)
    packed_panel = dec.prefix + "prefetch" in dec.values
    whole_term = tile_term(False)
    streams = [] if packed_panel else streamed_loads(whole_term, red_axes[-1][0], ni, mi)
    distance = int(dec.knob("prefetch", 0, PREFETCH_DISTANCES)) if streams else 0
    # the knob `prefetch_block`: with two or more reduction axes, the innermost unrolled, the streamed operand's lines
    # at the next step of the outermost (prefetch.py: prefetch_next_block), issued in the loop around the unrolled
    # steps (`block_at` levels up) — interleaved with them, LLVM's skylake-avx512 and haswell scheduling models spilled
    # a conv tile's accumulators (tests/test_register_pressure.py). Default on where that operand is larger than L2 —
    # each block's rows then come from L3 or memory, a few pages the hardware prefetcher enters late (resnet18's last
    # two stages' products 0.28 → 0.24 and 0.53 → 0.49 ms on Zen 5) — and the vectors are wider than 128 bits (SSE's
    # 16-register tiles spill with them)
    outer_streams = streamed_loads(whole_term, red_axes[0][0], ni, mi) \
        if prefetch_blocks and not packed_panel and not dynamic and len(red_axes) > 1 and unroll_last \
        and isinstance(red_axes[-1][1], int) else []
    heavy = any(operand_bytes(k, ld.buf) > t.l2_bytes for ld in outer_streams) and t.lanes * 4 > 16
    block_at = 1 if outer_streams and dec.knob("prefetch_block", heavy, (False, True)) else -1

    def tile(edge: bool, term: Expr, width: int = t.nr, n_ext: Expr = n_ext, rows: int = t.mr) -> Loop:
        """The `rows`×`width` tile (MR rows but in a static M's last row block); `edge` rows past M read row M−1
        (clamped) and are not stored."""
        acc = f"acc{tag}"
        rv, rext = red_axes[-1]
        # (from the full panel's vectors, not a narrow last panel's: every column of a row sums in the same order —
        # equal weight columns give equal outputs, as onnxruntime's do)
        split = reduction_split(rows * -(-t.nr // t.lanes), t.chains, rext) if len(red_axes) == 1 else 1
        reduce: list[Stmt]
        if split > 1:
            # too few accumulators to hide the FMA latency (a 1-row tile: nvec chains): the reduction's steps dealt
            # round-robin to `split` accumulators per row, summed after the loop
            #   for r < K: acc[mi] += A·B(r)  ⇒  for rs < K/split, ru < split: acc[ru·rows + mi] += A·B(rs·split + ru)
            rs, ru = Var(f"{rv.name}s"), Var(f"{rv.name}u")
            at = {rv: rs * split + ru}
            slot = ru * rows + mi
            ahead = rename_tile(prefetch_panel(term, rv, ni, t.prefetch, t.nr) if packed_panel else
                                prefetch_ahead(term, rv, ni, mi, t.nr, distance), at)
            step = Loop(mi, Const(rows, "int64"),
                        [Assign(acc, combine("sum", LocalRef(acc, red.dtype, slot), substitute(term, at)), slot)],
                        "unroll")
            partials = LocalRef(acc, red.dtype, mi)
            for u in range(1, split):
                partials = combine("sum", partials, LocalRef(acc, red.dtype, mi + Const(u * rows, "int64")))
            reduce = [Loop(rs, Const(hint(rext) // split, "int64"),
                           [Loop(ru, Const(split, "int64"), [*ahead, step], "unroll")], "serial"),
                      Loop(mi, Const(rows, "int64"), [Assign(acc, partials, mi)], "unroll")]
        else:
            update: Stmt = Loop(mi, Const(rows, "int64"),
                                [Assign(acc, combine("sum", LocalRef(acc, red.dtype, mi), term), mi)], "unroll")
            for i, (v, e) in enumerate(reversed(red_axes)):
                ahead = (prefetch_panel(term, v, ni, t.prefetch, t.nr) if packed_panel else
                         prefetch_ahead(term, v, ni, mi, t.nr, distance)) if i == 0 else []
                if i == block_at:  # above the unrolled innermost steps, one per step's line (prefetch.py)
                    ahead = ahead + [p for j in range(int(red_axes[-1][1])) for p in prefetch_next_block(
                        substitute(term, {red_axes[-1][0]: Const(j, "int64")}), red_axes[0][0], ni, mi, t.nr)]
                update = Loop(v, as_extent(e), [*ahead, update], "unroll" if i == 0 and unroll_last else "serial")
            reduce = [update]
        whole = isinstance(n_ext, Const) and int(n_ext.value) % width == 0
        stores = row_stores(LocalRef(acc, red.dtype, mi), rows, edge or (packed is not None and M % t.mr))
        return Loop(ni, n_ext, [Local(acc, red.dtype, init_value("sum", red.dtype), rows * split), *reduce, stores],
                    "vector", width, masked=not whole)

    def row_stores(total: Expr, rows: int, guarded: bool) -> Stmt:
        """for mi < rows (unrolled): out[m, n] = epilogue(total); `guarded`: rows past M not stored."""
        store: Stmt = Store(c.out, substitute_all(c.store_index, {m_v: m_expr, n_v: n_expr}),
                            substitute(c.body, {red: total, m_v: m_expr, n_v: n_expr}))
        if guarded:
            store = If(cmp("<", m_expr, as_extent(M)), [store])
        return Loop(mi, Const(rows, "int64"), [store], "unroll")

    def called_epilogue(ct: str, rows: int) -> Stmt:
        """The epilogue of called tails (tail_calls.py), from their C tile; rows past M not stored."""
        whole = isinstance(n_ext, Const) and int(n_ext.value) % t.nr == 0
        return Loop(ni, n_ext, [row_stores(Load(ct, (mi, ni), red.dtype), rows, True)], "vector", t.nr,
                    masked=not whole)

    def tiles_of(width: int, n_ext: Expr, tails: tuple[int, ...] = tails) -> list[Stmt]:
        # full row blocks run a tile without clamps or guards: its MR rows are one base + constant offsets; a tile
        # that reads only inside a padded input runs without the padding's masks (guards.py)
        inner = None if dynamic else split_interior(tile_term(False), {mi: t.mr, ni: width, **dict(red_axes)})
        body_tiles: list[Stmt] = [tile(False, tile_term(False), width, n_ext)]
        if inner is not None:
            body_tiles = [If(inner[1], [tile(False, inner[0], width, n_ext)], body_tiles)]
        if is_symbolic(M) and packed is None:
            # run-time rows: every full tile is the clamped, guarded one (the clamp and the guards cost a few
            # instructions per tile, not per step: the clamped row addresses stay in registers, no spills, and a
            # run-time-rows GEMM measured the same with full tiles unclamped; an unclamped copy for the interior
            # would double the tile's code and compile time)
            stmt: Stmt = tile(True, tile_term(True), width, n_ext)
            # the last, partial row block (M − mo·MR rows left) on the smallest `tails` tile that covers it; the full
            # tile on the common side (`If.body`), each side weighed by its share of the row blocks (`If.share`)
            left = as_extent(M) - mo * t.mr
            # consecutive called tails share one C tile and one epilogue: groups of heights, taller first
            called = calls.kernels if calls is not None and width == t.nr else {}
            groups: list[list[int]] = []
            for rows in sorted(tails, reverse=True):
                if groups and rows in called and groups[-1][0] in called:
                    groups[-1].append(rows)
                else:
                    groups.append([rows])
            for group, fewer in zip(groups, [*(g[0] for g in groups[1:]), 0]):
                rows = group[0]
                tail = calls.stmts(group, left, mo * t.mr, no * t.nr, tag, called_epilogue) if rows in called \
                    else [tile(True, tile_term(True), width, n_ext, rows)]
                stmt = If(cmp(">", left, Const(rows, "int64")), [stmt], tail, tail_share(M, t.mr, fewer, rows))
            return [stmt]
        if M % t.mr and packed is None:
            # a static M's last row block computes only its M % MR rows (gemm_odd at AVX2: 3 rows, not 6 clamped)
            full = cmp("<=", mo * t.mr + t.mr, as_extent(M))
            return [If(full, body_tiles, [tile(False, tile_term(False), width, n_ext, M % t.mr)])]
        return body_tiles

    if narrow_last:  # the last panel's narrow tile; the full panels need no masks
        last = cmp("==", no, Const(n_no - 1, "int64"))
        if w == "dot":
            copy, dot_tile = dot_edge(k, c, red, dot, m_v, n_v, mo, t.mr, t.nr, n_no - 1, rem, t.lanes, tag,
                                      lambda e, j: simplify_panels(e, j, t.nr))
            pre += copy
            edge = dot_tile(t.mr) if M % t.mr == 0 else \
                [If(cmp("<=", mo * t.mr + t.mr, as_extent(M)), dot_tile(t.mr), dot_tile(M % t.mr))]
        else:
            # over run-time rows, where the narrow panel is at most an eighth of the columns, only the smallest
            # tail: a small share of the work, but a whole second set of tail tiles of the code (gpt_decoder's
            # 1000-column head: 16% of its LLVM time; 1×1 … 4×3 tokens within 1–2% either way, Zen 5 A/B)
            edge = tiles_of(narrow, Const(rem, "int64"), tuple(sorted(tails))[:1] if 8 * rem <= N else tails)
        tiles = [If(last, edge, tiles_of(t.nr, Const(t.nr, "int64")))]
    else:
        tiles = tiles_of(t.nr, n_ext)
    body = rename_tile(tiles, decode)
    kind = "parallel" if threads > 1 and hint(total) > 1 else "serial"
    return pre + [Loop(flat, as_extent(total), body, kind)]


def reduction_split(accumulators: int, chains: int, k: Expr | int) -> int:
    """Accumulators per row for a tile of `accumulators` vector accumulators (rows × vectors) over a reduction of `k`
    steps: enough for `chains` independent FMA chains (latency × pipes), a power of two dividing a constant k of at
    least 16 steps per accumulator; 1 where the tile has enough (or k is a run-time extent). A 1-row tile's 2 chains
    left a decode step's GEMMs latency-bound: 4 batch entries × 1 token ran 2.5–3.3× one entry's time. Split (Zen 5,
    one interleaved A/B run): gpt_decoder 4×1 0.77×, 4×3 0.92×, 2×9 0.93×, bert_base_dynamic 4×1 0.86×, 4×3 0.93×,
    the rest within noise (a static model's 1-row classifier too); the dynamic build's LLVM time +4%."""
    if chains <= accumulators or not isinstance(k, (int, Const)):
        return 1
    k = hint(k)
    split = 1
    while split * accumulators < chains and k % (2 * split) == 0 and k // (2 * split) >= 16:
        split *= 2
    return split


def tail_share(M: Expr, mr: int, fewer: int, rows: int) -> tuple[Expr, Expr]:
    """The `If.share` of a tail tile of `rows` rows, reached by row blocks of more than `fewer` rows left: per
    panel, ⌈M/MR⌉ row blocks, the last holding rem = M − (⌈M/MR⌉ − 1)·MR rows; it takes the tail when
    fewer < rem ≤ rows. With [rem ≤ x] = (x + MR − rem) // MR for 0 ≤ x < MR: ([rem ≤ rows] − [rem ≤ fewer],
    ⌈M/MR⌉ − [rem ≤ fewer])."""
    blocks = (as_extent(M) + Const(mr - 1, "int64")) // Const(mr, "int64")
    rem = as_extent(M) - (blocks - Const(1, "int64")) * Const(mr, "int64")

    def at_most(x: int) -> Expr:
        return (Const(x + mr, "int64") - rem) // Const(mr, "int64")
    return at_most(rows) - at_most(fewer), blocks - at_most(fewer)


def image_thread_parts(c: Compute, names: list[Var], extents: list, mo: Var, threads: int, dynamic: bool,
                       by: Var | None = None) -> tuple[list[Var], list, tuple[Var, Var, Var, int] | None]:
    """Split the image's rows into one part per thread, outermost in the parallel loop (a conv: its output rows;
    a conv whose rows flatten_rows merged into pixels, hint `pixel_rows`: its pixel tiles — before, such 1×1 convs
    split by output-channel blocks, and mobilenetv2's next depthwise conv read half its rows from the other core:
    2.38 → 2.29 ms when the host puts the vCPUs on two L3s, one L3 unchanged, 1.005; Winograd's products: the row
    tiles, which are the image's tiles, hint `rows_outer`). The pool hands each thread
    a contiguous segment of the loop first (runtime/threadpool.py), so a thread computes the same part of the image in
    every layer and reads what it wrote itself. Before, thread 0 took the first output-channel blocks of every row:
    each layer read half its input from the other core's cache, which costs little when the two cores share an L3
    and a lot when the host puts them on two (resnet18: 12.4 ms, or 17.9 with cross-L3 cache-line transfers of
    ~330 ns instead of ~60). Within a part the order is unchanged. `loop = part · per + within`. Switch
    `thread_parts` (`benchmarks/option_by_host_state.py resnet18 --off thread_parts`, seventh session): worth 10% on
    two L3s (7.09 → 6.43 ms), 0.3% on one."""
    if threads <= 1 or dynamic:
        return names, extents, None
    if by is not None:
        v = by
    elif c.hints.get("rows_outer") or c.hints.get("pixel_rows"):
        v = mo
    elif "spatial" in c.hints:
        v = c.axes[c.hints["spatial"][0] % len(c.axes)]
    else:
        return names, extents, None
    if v not in names:
        return names, extents, None
    i = names.index(v)
    if extents[i] % threads or extents[i] < 2 * threads:
        return names, extents, None
    per = extents[i] // threads
    part, within = Var(f"{v.name}_part"), Var(f"{v.name}_in")
    return ([part] + names[:i] + [within] + names[i + 1:], [threads] + extents[:i] + [per] + extents[i + 1:],
            (v, part, within, per))


def _strides(names: list[Var], extents: list) -> dict[Var, Expr | int]:
    """The stride of each index of a flattened loop over `names` (the last fastest)."""
    out: dict[Var, Expr | int] = {}
    stride: Expr | int = 1
    for v, e in reversed(list(zip(names, extents))):
        out[v] = stride
        stride = stride * e
    return out


def rejoin_parts(decode: dict, parted: tuple[Var, Var, Var, int] | None) -> dict:
    """`decode` with the index image_thread_parts split put back together: v = part · per + within."""
    if parted is not None:
        v, part, within, per = parted
        decode[v] = decode.pop(part) * per + decode.pop(within)
    return decode


def decode_flat(flat: Var, names: list[Var], extents: list,
                strides: dict[Var, Expr | int] | None = None) -> dict[Var, Expr]:
    """Each index of a flattened loop over `names` (the last fastest) from the flat index (with `strides`: those,
    not the loop's own)."""
    strides = strides or _strides(names, extents)
    return {v: (flat // strides[v]) % e if is_symbolic(strides[v]) or strides[v] > 1 else flat % e
            for v, e in zip(names, extents)}


def _ceil_div(n: Expr | int, d: int) -> Expr | int:
    return (n + (d - 1)) // d if is_symbolic(n) else -(-n // d)


def substitute_all(index: tuple[Expr, ...], mapping: dict[Expr, Expr]) -> tuple[Expr, ...]:
    return tuple(substitute(i, mapping) for i in index)


def rename_tile(stmts: list[Stmt], mapping: dict[Expr, Expr]) -> list[Stmt]:
    from kiln.schedule.primitives import rename
    return rename(stmts, mapping)
