"""The register tile's shape for the direct-emission GEMM / convolution schedule (schedule/tile.py): which output
axis runs along the tile's rows (m) and which along its vectors (n), how many rows (MR) and vectors (NR / lanes),
whether a conv's rows run on over output-row ends, the input-channel block and the prefetch distance. Each is a knob
of `Decisions` (schedule/config.py) whose default is the heuristic below: the register budget of the target (with
or without FMA), the L1 / L2 sizes, the extents' lane fill. The tuner searches the knobs; the budgets keep the
defaults out of spills (tests/test_register_pressure.py)."""
from __future__ import annotations

from dataclasses import dataclass, replace

from kiln.kernel.analysis import coef
from kiln.kernel.ir import Compute, Kernel, Load, Reduce, Var, hint, is_symbolic, uses_var, walk
from kiln.schedule.config import Decisions, divisors
from kiln.schedule.prefetch import prefetch_knob
from kiln.target import Target


@dataclass(frozen=True)
class TileShape:
    m_axis: int
    n_axis: int
    mr: int
    nr: int
    lanes: int
    # a conv tile over output channels: its MR rows run on over the ends of output rows (see `flatten_rows`)
    flatten_rows: bool = False
    # > 0: the reduction's first axis (a conv's input channels) innermost, in blocks of this many channels (the
    # taps loop over each block): no broadcast is live across kernel taps
    channel_block: int = 0
    # > 0: prefetch the packed weight panel this many reduction steps ahead (schedule/prefetch.py)
    prefetch: int = 0
    # a last panel of a column or two may run as dot products (dot_edge.py): fixed-width targets (SVE/RVV emit a
    # vector_reduce of one update only as scalable code)
    dot_edge: bool = False
    l2_bytes: int = 1 << 20  # the target's L2 (the tile order over run-time row blocks plans for it)
    chains: int = 0  # the target's fma_chains: a tile with fewer accumulators splits its reduction (reduction_split)


def choose_tile(k: Kernel, c: Compute, target: Target, dec: Decisions | None = None) -> TileShape | None:
    """The register tile of a reduction with a shared vector operand, or None. Its rows (mr), its width in vectors
    (unpacked operands: the packed ones have their panel width), the flattening of conv rows and the input-channel
    block are knobs of `dec` (schedule/config.py), the heuristics below their defaults."""
    shape = _choose_tile(k, c, target, dec if dec is not None else Decisions())
    return replace(shape, l2_bytes=target.l2_bytes, chains=target.fma_chains) if shape is not None else None


def _choose_tile(k: Kernel, c: Compute, target: Target, dec: Decisions) -> TileShape | None:
    reds = [e for e in walk(c.body) if isinstance(e, Reduce)]
    # an explicit store: one flat index, or the axes with the last two merged into one row-major index over run-time
    # rows (kernel/compact.py), still unit-stride along n
    if len(reds) != 1 or reds[0].op != "sum" or len(c.axes) < 2 or \
            (c.store is not None and len(c.store) != 1 and not c.hints.get("compact_store")):
        return None
    red = reds[0]
    # and an int8 depthwise conv's int32 sums (u8·s8 products: vpdpwssd where it had converted each tap to float —
    # mobilenetv2 int8 1.156 → 1.115 ms, one interleaved A/B, outputs identical)
    if red.dtype != "float32" and not (red.dtype == "int32" and c.hints.get("depthwise")):
        return None
    lanes, regs = target.lanes(32), target.vector_registers
    if "nr" in c.hints:  # packed weights: the panel width is the tile width, the lowering names the axes
        return _packed_tile(c, red, target, dec)
    if c.hints.get("depthwise"):
        return _depthwise_rows_tile(c, target, dec)
    n_axis = len(c.axes) - 1
    nv, n_ext = c.axes[n_axis], hint(c.extents[n_axis])
    if n_ext < 4:
        return None
    loads = [e for e in walk(red.body) if isinstance(e, Load)]
    best: tuple[int, int] | None = None
    for ai, (v, ext) in enumerate(zip(c.axes[:-1], map(hint, c.extents[:-1]))):
        if ext < 2:
            continue
        shared = any(uses_var(ld, nv) and not uses_var(ld, v) for ld in loads)
        bcast = any(uses_var(ld, v) and not uses_var(ld, nv) for ld in loads)
        if shared and bcast and (best is None or ext > best[1]):
            best = (ai, ext)
    if best is None:
        return None
    # NR: 1–3 vectors, whichever wastes the fewest lanes on n's edge (ties → wider); MR fills the registers
    options = []
    for nvec in (2, 1, 3):
        nr = nvec * lanes
        eff = n_ext / (-(-n_ext // nr) * nr)
        options.append((round(eff, 2), nvec == 2, nr, nvec))
    _, _, nr, nvec = max(options)
    nvec = int(dec.knob("nvec", nvec, (1, 2, 3, 4)))
    nr = nvec * lanes
    # rows: leave 2·nvec + 4 registers beside the accumulators — 13×2 tiles spilled (1×1 conv 256 → 128 on
    # 56×56: 2.33 ms at MR=13, 1.85 at MR=10; 64 → 256: 1.06 → 0.96; 512 → 256 on 28×28 equal)
    mr = pick_mr(best[1], (regs - 2 * nvec - 4) // nvec)
    if is_symbolic(c.extents[best[0]]):
        mr = min(mr, RUN_TIME_PRODUCT_MR)
    return TileShape(best[0], n_axis, int(dec.knob("mr", mr, mr_domain(best[1], regs, nvec))), nr, lanes,
                     dot_edge=not target.scalable)


# the full tile's rows of an activation × activation product (attention's) over run-time rows: 8, not the 12 the
# registers allow — a 2–4-token step runs its full tile clamped (schedule/default.py: PRODUCT_TAIL_ROWS), wasting
# fewer rows, and the smaller tile compiles faster: gpt_decoder 1×3 0.98×, 4×3 0.98×, 1×16 … 4×512 0.99–1.00× the
# 12-row tile's time, the dynamic compile 0.424 → 0.415 s (one interleaved run; 6 rows: no faster)
RUN_TIME_PRODUCT_MR = 8


# the full tile's rows over run-time rows, where the registers allow more: 8 rows × nvec vectors are 8·nvec
# independent FMA chains and 8 + nvec loads per 8·nvec FMAs, enough to keep two FMA units busy; 14 rows (AVX-512's
# most) ran 2–4% slower per row than 8 at 77–512 tokens of gpt_decoder on Zen 5, where the 14-row tile also wastes
# up to 5 clamped rows per row block. The knob `mr` keeps its whole domain: the tuner measures the others
RUN_TIME_MR = 8


def mr_domain(m: int, regs: int, nvec: int) -> range:
    """Legal tile rows: at least one, at most the extent, 16, and what leaves one register beside the MR·nvec
    accumulators and the nvec shared vectors (more spills on every step)."""
    return range(1, max(1, min(m, 16, (regs - nvec - 1) // nvec)) + 1)


def _packed_tile(c: Compute, red: Reduce, target: Target, dec: Decisions) -> TileShape:
    """The tile of a packed anchor: NR = the panel width; MR from the registers left beside the MR·nvec
    accumulators (see each case); rows that cross output-row ends where the rows are too short for MR."""
    lanes, nr = target.lanes(32), c.hints["nr"]
    n_axis, m_axis = c.hints.get("n_axis", -1) % len(c.axes), c.hints["m_axis"] % len(c.axes)
    nvec = max(1, nr // lanes)
    # without FMA (SSE) each step is a multiply into a temporary and an add, and SSE's two-operand multiply
    # overwrites its input: nvec products and a broadcast copy more live at once. The budgets below then left
    # 12 accumulators in 16 registers and LLVM spilled 26–42 per loop trip (tests/test_register_pressure.py);
    # 8 spill none and ran 0.99–1.05× as fast on five convs (one interleaved run, Zen 5)
    regs = target.vector_registers if target.has_fma else target.vector_registers - nvec - 2
    nchw_out = n_axis != len(c.axes) - 1  # vectors over an NCHW output's channels (stored transposed)
    taps = 1 if c.hints.get("in_block") or c.hints.get("depthwise") else _taps_along(c, red, c.axes[m_axis])
    # row i at tap t reads the pixel row i+1 reads at tap t−1: LLVM keeps the MR+taps−1 broadcasts live across
    # the unrolled taps, beside MR·nvec accumulators and taps·nvec weight vectors
    shared_taps = (regs - nvec * taps - taps - 2) // (nvec + 1)
    channels_innermost = taps > 1 and shared_taps * nvec < target.fma_chains
    cb = input_channel_block(red.axes[0][1], taps, nr, target.l1_bytes) if channels_innermost else 0
    if taps > 1:  # 0: channels outermost, the taps innermost (broadcasts shared across taps)
        ci = red.axes[0][1]
        cb = int(dec.knob("channel_block", cb, [0] + [d for d in divisors(ci) if d * taps * nr * 4 <= target.l2_bytes]))
        channels_innermost = cb > 0
    if c.hints.get("depthwise"):
        # per tap: nvec weight vectors shared by the MR rows, and each row's input vectors (loads, not
        # broadcasts) — at least nvec registers beside the accumulators and the weights
        most = (regs - 2 * nvec - 1) // nvec
    elif taps > 1 and not channels_innermost:
        # Measured (AVX-512, 3×3 convs, NR=32): MR=14 spills (1.6× slower than MR=7), MR=8 is 10% slower than 7
        # (at least 7 rows: fewer leave the FMA latency exposed; the 7×7/2 stem measured flat over MR 5–14)
        most = max(7, shared_taps)
    elif nchw_out and regs >= 32:
        # vectors over a conv's channels: 14×2 accumulators spill here (1×1, Ci=1024 on 14×14: 1.28 ms at MR=14,
        # 1.00 at MR ≤ 12), though not in the GEMM panel tile (gemm_1024 equal at 12 and 14)
        most = (regs - 2 * nvec - 4) // nvec
    else:
        # the classic register tile: each reduction step loads nvec weight vectors and broadcasts MR pixels one
        # at a time (AVX2 6×16). With too few registers to share broadcasts across taps (AVX2: 16) an NCHW
        # input's channels go innermost, in blocks (input_channel_block): 3×3 convs 155 → 165 GFLOP/s over 4×16
        # with the taps shared
        most = (regs - nvec - 2) // nvec
    most = max(1, most)
    rows = hint(c.extents[m_axis])
    # run-time rows (a symbolic M) end in a tail tile of fewer rows (schedule/default.py, TAIL_ROWS): no tile height
    # divides every M, and the shorter full tile wastes fewer rows where M % MR exceeds the tails
    mr = min(most, RUN_TIME_MR) if is_symbolic(c.extents[m_axis]) else pick_mr(rows, most)
    # an output row too short for the tile the registers allow (AVX2's 6 rows on 14-, 28- or 56-pixel rows
    # leave edge tiles, so pick_mr takes 4): let tiles run on over row ends instead (flatten_rows)
    # (not a depthwise tile: its interior tiles, which need a row's affine addresses, run without padding masks)
    spatial = tuple(a % len(c.axes) for a in c.hints.get("spatial", ()))
    flat = False
    if spatial and m_axis == spatial[1] and not any(is_symbolic(c.extents[a]) for a in spatial) \
            and c.extents[spatial[0]] > 1 and not c.hints.get("depthwise"):
        flat_rows = c.extents[spatial[0]] * c.extents[spatial[1]]  # spatial dims are static (kernel/dynamic.py)
        flat_mr = pick_mr(flat_rows, most)
        flat = bool(dec.knob("flatten_rows", flat_mr > mr, (False, True)))
        if flat:
            mr, rows = flat_mr, flat_rows
    # the knob's domain counts every register: the tuner may still measure a tile that spills
    mr = int(dec.knob("mr", mr, mr_domain(rows, target.vector_registers, nvec)))
    pf = prefetch_knob(dec, nr, red.axes[0][1], target) if len(red.axes) == 1 and "spatial" not in c.hints else 0
    return TileShape(m_axis, n_axis, mr, nr, lanes, flat, cb, pf, not target.scalable)


def _depthwise_rows_tile(c: Compute, target: Target, dec: Decisions) -> TileShape | None:
    """An NCHW depthwise conv: MR output rows × NR pixels along the row (vectors), the taps unrolled. Rows r and
    r + 1 read the same input row at taps kh and kh − 1, so the MR rows load MR + kh − 1 input rows per kw
    shift instead of MR·kh; the weights are per-channel scalars."""
    lanes = target.lanes(32)
    m_axis, n_axis = c.hints["m_axis"] % len(c.axes), c.hints["n_axis"] % len(c.axes)
    w = hint(c.extents[n_axis])
    if w < lanes // 2:
        return None
    nvec = int(dec.knob("nvec", 2 if lane_fill_of(w, 2 * lanes) > lane_fill_of(w, lanes) else 1, (1, 2)))
    # half the registers beside the accumulators for the input rows in flight (conv_dw, AVX2: MR 2 / 4 / 6 / 8
    # → 0.185 / 0.128 / 0.126 / 0.204 ms)
    most = max(1, (target.vector_registers - 4) // (2 * nvec))
    mr = pick_mr(hint(c.extents[m_axis]), most)
    mr = int(dec.knob("mr", mr, mr_domain(hint(c.extents[m_axis]), target.vector_registers, nvec)))
    return TileShape(m_axis, n_axis, mr, nvec * lanes, lanes)


def lane_fill_of(n: int, width: int) -> float:
    return n / (-(-n // width) * width)


def _taps_along(c: Compute, red: Reduce, m_v: Var) -> int:
    """Extent of the reduction axes (a conv's kw) that move the broadcast operand's address by no more than a
    step of m does: their reads overlap those of neighbouring tile rows."""
    taps = 1
    for ld in walk(red.body):
        if not isinstance(ld, Load) or not uses_var(ld, m_v):
            continue
        flat = ld.index[-1]  # m is the innermost spatial axis: compare strides along the last index
        cm = coef(flat, m_v)
        if not cm:
            continue
        for v, e in red.axes:
            cv = coef(flat, v)
            if cv and 0 < abs(cv) <= abs(cm):
                taps = max(taps, e)
    return taps


def input_channel_block(ci: int, taps: int, nr: int, l1_bytes: int) -> int:
    """Input channels per block when they run innermost: the block's weights (CB·taps·NR floats) fill at most
    half of L1, beside the pixels, while the taps loop over them; a 3×3 conv sweeping all of Ci per tap would
    stream both from L2 nine times (7×7 plane, Ci=512: 107 GFLOP/s). The largest divisor of Ci that fits:
    AVX2 3×3, NR=16, 32 KiB L1 → 16 (measured at 7×7: CB 8 / 16 / 64 → 130 / 146 / 140 GFLOP/s)."""
    most = max(1, l1_bytes // 2 // (taps * nr * 4))
    return next(cb for cb in range(min(most, ci), 0, -1) if ci % cb == 0)


def pick_mr(m: int, most: int) -> int:
    """Rows per tile: as many as the registers allow, but not so many that the last row block is mostly
    empty (M=64 with 14 rows wastes 6 of 70; 8 rows waste none)."""
    most = max(1, min(most, 16, m))
    for r in range(most, max(1, most // 2) - 1, -1):
        if -(-m // r) * r <= m * 1.03:  # at most 3% of the tile rows wasted
            return r
    return min(range(max(1, most // 2), most + 1), key=lambda r: (-(-m // r) * r, -r))
