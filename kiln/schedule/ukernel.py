"""The `ukernel` strategy: the compiler packs, tiles and parallelizes; the MR×NR tile is a hand-written
microkernel (kiln/ukernels: `kiln_ukr_<isa>_f32_<MR>x<NR>(A, B, C, ldc, K, accumulate)`).

Applies to packed anchors (hints nr / n_axis / m_axis from kiln/kernel/lower_packed.py, NR equal to the
kernel's NR): PackedMatMul out[.., m, n] = Σ_k A[.., m, k] · Bp[n // NR, k, n % NR] and PackedConv
out[b, co, oh, ow] = Σ_{ci,kh,kw} X[b, ci, oh·s + kh, ow·s + kw] · Wp[co // NR, ci, kh, kw, co % NR], with
`epilogue(·)` (bias, folded BN, ReLU, residual add) around the sum. In general terms: one reduction over axes
r (K = Π extents, in the order of the weight panel), an n axis whose operand is a weight panel, an m axis, and
any other output axes (batch; conv output rows). The A operand — whatever expression multiplies the panel
(a plain load, an implicit im2col of the conv input, a fused prologue) — is packed by evaluating it.

Loop nest (TVM-style; mt = row tile, blk = block of MB row tiles, j = panel, kc = K block):

    before:  for others, m, n:  out[others, m, n] = epilogue(Σ_r A(others, m, r) · Bp[n // NR, r, n % NR])
    after:
    parallel for (o, mt) in others × ⌈M/MR⌉:                  # 1. pack every row tile once; rows past M repeat M−1
      call kiln_pack_<isa>_f32_<MR>(&A[o, mt·MR, 0], lda, rows, K, &Ap[o, mt, 0, 0])   # plain row-major A
      — or, for any other A (a conv's implicit im2col), compiler-generated:
      for r…: for mi in 0..MR vector: Ap[o, mt, k(r), mi] = A(o, m = mt·MR + mi, r)   # rows contiguous in A
      for r…: for r_last vector: for mi in 0..MR unroll: (the same)       # else: MR rows transposed in registers
                                                              #    a tile inside one output row reads its
                                                              #    pixels affinely (no per-lane // and %)
                                                              #    Ap: kernel scratch (arena), 64-byte aligned
    parallel for (blk, j) in ⌈T/MB⌉ × ⌈N/NR⌉:                # 2. j fastest: a chunk keeps its A block hot;
      alloc Ct[MR, NR]                                        #    T = others·⌈M/MR⌉ row tiles, numbered (o, mt)
      for t in blk·MB ..< min((blk+1)·MB, T):                 #    the panel (K×NR) serves the block's MB tiles
        (o, mt) = (t // ⌈M/MR⌉, t % ⌈M/MR⌉)                   #    (A block ≤ L1 size, ≥ 1 tile)
        for kc in 0..⌈K/KC⌉:                                  #    one call unless K·(MR+NR)·4 > L2/2
          call ukr(&Ap[o, mt, kc·KC, 0], &Bp[j, kc·KC, 0], &Ct, NR, min(KC, K − kc·KC), kc > 0)
        for ni in 0..min(NR, N − j·NR) vector<NR> masked:     # 3. the epilogue on the hot tile
          for mi in 0..MR unroll:
            if m < M: out[o, m, n] = epilogue(Ct[mi, ni])     #    (m = mt·MR + mi, n = j·NR + ni)

When the output is contiguous along m instead of n (an NCHW conv: rows are pixels, columns channels) step 3
first transposes Ct into CtT[NR, MR] with the family's packing kernel (registers), then runs
`for ni: for mi vector<MR> masked to M: out[..] = epilogue(CtT[ni, mi])` — contiguous loads and stores. When the
last panel holds at most one vector of valid columns, it runs the narrow edge kernel (kiln/ukernels).

Why two parallel loops: the pool hands out ≈ 4 chunks per thread; one loop over A blocks (a handful for
gemm_1024) splits unevenly over 2 threads (measured 3–8% idle), while (blk, j) gives hundreds of equal
iterations and A is still packed only once. Edges: M edges clamp the packed rows and guard (or mask) the
stores, N edges mask the epilogue's lanes (the panels are zero-padded to NR, so the kernel always computes a
full tile); nothing else is padded. MR is the family's main MR, or a narrower kernel of the same family when
M is small (M = 1 for GEMV-like layers, 7 for 7×7 conv rows), chosen like the direct tile's rows (pick_mr).

Epilogue placement vs direct emission (kiln/schedule/tile.py, where the epilogue runs on the accumulators
still in registers): here the kernel stores MR·NR/W vectors to Ct and the epilogue reloads them from L1 — one
extra store + load per accumulator per tile, plus (NCHW conv) the transpose. Measured (1 thread, CPU time,
interleaved, ukernel vs the same nest with step 3 removed, before the transpose): gemm_1024 1.3%,
conv_r50_3x3 1.7%, resnet18 ≈ 8% (its 112×112 and 56×56 layers have K = 147 / 576, so few FMAs per stored
tile); the in-register transpose then took resnet18 from 89.4 to 94.8 GFLOP/s (direct: 100.7).
`benchmarks/ukernel_vs_direct.py` compares whole models.

Returns None — the compute is then emitted directly, and Kernel.strategies says "direct" — for: anchors that
are not packed (a MatMul whose B is not a constant has no panels; grouped / depthwise convs), reductions that
are not an f32 sum of (A expression) × (weight panel) (int dtypes), and targets without a microkernel family
(only x86 AVX-512 / AVX2 so far)."""
from __future__ import annotations

import numpy as np

from kiln.kernel.analysis import coef, flat_index, simplify_panels
from kiln.kernel.ir import (
    Addr,
    Alloc,
    Bin,
    Buffer,
    Call,
    Compute,
    Const,
    Expr,
    If,
    Kernel,
    Load,
    Loop,
    Reduce,
    Select,
    Stmt,
    Store,
    Var,
    cmp,
    minimum,
    substitute,
    uses_var,
    walk,
)
from kiln.schedule.config import Decisions, powers_of_two
from kiln.schedule.primitives import rename
from kiln.schedule.tile import flatten_rows
from kiln.schedule.tile_shape import pick_mr
from kiln.target import Target
from kiln.ukernels import UKernel, narrow_cols, pack_kernel_for, ukernel_for


def _i(v: int) -> Const:
    return Const(int(v), "int64")


def _eval_index(e: Expr, env: dict[str, int]) -> int | None:
    """Evaluate an integer index expression (Const/Var/+ − * // % min max); None if it has anything else."""
    if isinstance(e, Const):
        return int(e.value)
    if isinstance(e, Var):
        return env.get(e.name)
    if isinstance(e, Bin):
        a, b = _eval_index(e.a, env), _eval_index(e.b, env)
        if a is None or b is None:
            return None
        ops = {"+": lambda: a + b, "-": lambda: a - b, "*": lambda: a * b, "//": lambda: a // b,
               "%": lambda: a % b, "min": lambda: min(a, b), "max": lambda: max(a, b)}
        return ops[e.op]() if e.op in ops else None
    return None


def _panel_operand(red: Reduce, n_v: Var, nr: int, shape_of, others: list[tuple[Var, int]]  # noqa: ANN001
                   ) -> tuple[Load, Expr, Expr] | None:
    """Split the reduction body into (B panel load, A expression, panel base): body = A · Bp with Bp's flat index
    equal to base(others) + (n // NR)·K·NR + k(r)·NR + n % NR, k(r) the row-major position of r over the reduction
    axes, and base a function of the other output axes only (0 for one weight; Winograd's per-(r, c) weights:
    graph/passes/winograd.py)."""
    body = red.body
    if not (isinstance(body, Bin) and body.op == "*"):
        return None
    for b, a in ((body.b, body.a), (body.a, body.b)):
        if isinstance(b, Load) and uses_var(b, n_v) and not uses_var(a, n_v):
            break
    else:
        return None
    shape = shape_of(b.buf)
    ks = [n for _, n in red.axes]
    K = int(np.prod(ks))
    if b.dtype != "float32" or shape[-1] != nr or int(np.prod(shape)) % (K * nr):
        return None
    j, ni = Var("_panel"), Var("_lane")
    flat = simplify_panels(substitute(flat_index(b.index, shape), {n_v: j * nr + ni}), ni, nr)
    if coef(flat, ni) != 1:
        return None
    zero = Const(0, "int64")
    base = substitute(flat, {j: zero, ni: zero, **{v: zero for v, _ in red.axes}})
    rng = np.random.default_rng(0)
    for _ in range(6):  # the layout check: a few random points (all index arithmetic here is affine)
        env = {j.name: int(rng.integers(0, max(1, int(np.prod(shape)) // (K * nr)))), ni.name: int(rng.integers(nr))}
        env.update({v.name: int(rng.integers(n)) for v, n in others})
        kflat = 0
        for (v, n) in red.axes:
            env[v.name] = int(rng.integers(n))
            kflat = kflat * n + env[v.name]
        at_base = _eval_index(base, env)
        if at_base is None or _eval_index(flat, env) != at_base + (env[j.name] * K + kflat) * nr + env[ni.name]:
            return None
    return b, a, base


def _max_stride(k: Kernel, e: Expr, v: Var) -> int | None:
    """The largest |stride| along v of the loads in e (None if some load is not affine in v)."""
    out = 0
    for ld in walk(e):
        if isinstance(ld, Load):
            c = coef(flat_index(ld.index, k.buffer(ld.buf).shape), v)
            if c is None:
                return None
            out = max(out, abs(c))
    return out


def _row_of_pixels(a_expr: Expr, m_v: Var, row0: Expr, mi: Var, mr: int) -> tuple[Expr, Expr] | None:
    """A after flatten_rows reads pixel m = row0 + mi as (m // W, m % W): per lane a gather. For a tile that
    lies inside one output row ((row0 % W) + MR ≤ W) those are (row0 // W, row0 % W + mi), affine in mi — a
    contiguous (or stride-s, shuffled) vector load per reduction step. Returns (A for such tiles, that test),
    or None when A does not read m only as (m // W, m % W)."""
    ws = {e.b.value for e in walk(a_expr) if isinstance(e, Bin) and e.op in ("//", "%") and e.a == m_v
          and isinstance(e.b, Const)}
    if len(ws) != 1:
        return None
    w = _i(ws.pop())
    a_row = substitute(a_expr, {Bin("//", m_v, w): row0 // w, Bin("%", m_v, w): row0 % w + mi})
    if any(e == m_v for e in walk(a_row)):
        return None
    return a_row, cmp("<=", row0 % w + mr, w)


def _full_tile_in_row(test: Expr, row0: Expr, mr: int, m: int) -> Expr:
    """The in-row test and, when MR does not divide M, that the tile ends by M (the partial last tile keeps the
    clamped path: with M not a multiple of W its rows could lie "inside" a row past the end)."""
    return test if m % mr == 0 else Bin("and", test, cmp("<=", row0 + mr, _i(m)))


def _pack_call(k: Kernel, target: Target, a_expr: Expr, red: Reduce, m_v: Var, MR: int, M: int, K: int,
               row0: Expr, dst: Addr) -> list[Stmt] | None:
    """A row tile packed by the family's packing kernel (an in-register transpose) when A is a plain row-major
    matrix: one load with unit stride along the (single) reduction axis and a constant row stride."""
    if not isinstance(a_expr, Load) or a_expr.dtype != "float32" or len(red.axes) != 1:
        return None
    pk = pack_kernel_for(target, MR)
    r = red.axes[0][0]
    flat = flat_index(a_expr.index, k.buffer(a_expr.buf).shape)
    lda = coef(flat, m_v)
    if pk is None or coef(flat, r) != 1 or lda is None or lda < 1:
        return None
    k.extern_ir[pk.name] = pk.ir_text
    rows: Expr = minimum(_i(MR), _i(M) - row0) if M % MR else _i(MR)
    src = Addr(a_expr.buf, tuple(substitute(i, {m_v: row0, r: _i(0)}) for i in a_expr.index))
    return [Call(pk.name, (src, _i(lda), rows, _i(K), dst))]


def choose_blocks(n_tiles: int, K: int, mr: int, nr: int, target: Target) -> tuple[int, int]:
    """(MB row tiles per A block, KC). The A block (MB·K·MR floats) is at most the L1 size (at least one tile):
    a block sized for L2 next to its panel measured slower — gemm_1024 at 2 threads, MB = 1, 2, 4, 6, 11 (¾ of
    L2): 10.70, 10.86, 11.08, 11.27, 11.33 ms — the panels stream from L3 well, while two large working sets
    in L2 evict each other; conv_r50_3x3, resnet18 and bert_base were flat in MB. K is cut into KC blocks (the
    kernel's accumulate flag) only when one tile's A and B slices, K·(MR+NR)·4 bytes, would not fit half of L2."""
    mb = max(1, min(n_tiles, target.l1_bytes // (K * mr * 4)))
    kc = K
    if K * (mr + nr) * 4 > target.l2_bytes // 2:
        kc = max(64, target.l2_bytes // 2 // ((mr + nr) * 4) // 64 * 64)
    return mb, kc


def _plan(k: Kernel, c: Compute, target: Target) -> tuple | None:
    """What the microkernel nest needs — (the compute as the nest sees it, main kernel, panel width, reduction,
    B panel load, A expression, panel base, (m axis, n axis), K) — or None where the strategy does not apply."""
    main = ukernel_for(target)
    one_vector = narrow_cols(target) if target.arch == "x86_64" else None  # one-vector blocks' panels (x86)
    # (off x86 there is no narrow-column kernel, one_vector None: a compute without panels — an NCHW depthwise
    # conv's row tile — matched `None in (main.nr, None)` and failed on hints["nr"]: mobilenetv2 on Arm and RVV)
    if main is None or "nr" not in c.hints or c.hints["nr"] not in (main.nr, one_vector) or "m_axis" not in c.hints:
        return None
    panel = int(c.hints["nr"])
    spatial = [a % len(c.axes) for a in c.hints.get("spatial", ())]
    if spatial and c.hints["m_axis"] % len(c.axes) == spatial[1] and c.extents[spatial[0]] > 1:
        c = flatten_rows(c)  # as the direct tile does: row tiles of MR pixels that run on over row ends
    if c.hints.get("out_block"):
        c = merge_channel_blocks(c)
    reds = [e for e in walk(c.body) if isinstance(e, Reduce)]
    if len(reds) != 1 or reds[0].op != "sum" or reds[0].dtype != "float32" or k.buffer(c.out).dtype != "float32":
        return None
    red = reds[0]
    nax = len(c.axes)
    m_axis, n_axis = c.hints["m_axis"] % nax, c.hints.get("n_axis", -1) % nax
    if m_axis == n_axis:
        return None
    n_v = c.axes[n_axis]
    others = [(v, e) for i, (v, e) in enumerate(zip(c.axes, c.extents)) if i not in (m_axis, n_axis)]
    split = _panel_operand(red, n_v, panel, lambda name: k.buffer(name).shape, others)
    if split is None:
        return None
    K = int(np.prod([n for _, n in red.axes]))
    return (c, main, panel, red, *split, (m_axis, n_axis), K)


def ukernel_applies(k: Kernel, c: Compute, target: Target) -> bool:
    """Can this compute be built on the target's microkernel (the tuner's strategy knob)?"""
    return _plan(k, c, target) is not None


def schedule_ukernel(k: Kernel, c: Compute, tag: str, target: Target, threads: int,
                     options: dict[str, bool], dec: Decisions | None = None) -> list[Stmt] | None:
    """The loop nest of a packed anchor around the target's microkernel, or None where it does not apply. Knobs
    (schedule/config.py): the kernel's rows `ukr_mr`, the A block `mb`, the K block `kc`, the block order."""
    dec = dec if dec is not None else Decisions()
    plan = _plan(k, c, target)
    if plan is None:
        return None
    c, main, panel, red, bload, a_expr, b_base, (m_axis, n_axis), K = plan
    M = c.extents[m_axis]
    mr = int(dec.knob("ukr_mr", pick_mr(M, main.mr), range(1, min(M, main.mr) + 1)))
    uk = ukernel_for(target, mr, panel=panel)
    assert uk is not None
    k.extern_ir[uk.name] = uk.ir_text
    # a last panel with at most one vector of valid columns runs the narrow edge kernel (half the FMAs)
    w, rem = narrow_cols(target), c.extents[n_axis] % uk.nr
    narrow = ukernel_for(target, uk.mr, w) if w and w < uk.nr and 0 < rem <= w else None
    if narrow is not None:
        k.extern_ir[narrow.name] = narrow.ir_text
    return _nest(k, c, tag, target, threads if options.get("parallel", True) else 1, uk, narrow, red, bload,
                 b_base, a_expr, (m_axis, n_axis), K, dec)


def merge_channel_blocks(c: Compute) -> Compute:
    """A blocked conv output (graph/passes/block_layout.py) seen as one channel axis, the nest's n axis:

        for b, cob, oh, ow, coi:  out[b, cob, oh, ow, coi] = f(co = cob·NR + coi)
      ⇒ for b, oh, ow, co < Co:   out[b, co // NR, oh, ow, co % NR] = f(co)

    so the panel index j of the generic nest is the channel block (co = j·NR + ni folds back: simplify_panels)."""
    # (b, cob, oh, ow, coi), rows flattened (b, cob, p, coi), or Winograd's product (b, r, c, cob, t, coi)
    cob_axis, nr = c.hints.get("block_axis", 1) % len(c.axes), c.extents[-1]
    cob, coi = c.axes[cob_axis], c.axes[-1]
    co = Var(f"{cob.name}{coi.name}")
    m: dict[Expr, Expr] = {cob: co // nr, coi: co % nr}
    keep = [i for i in range(len(c.axes)) if i not in (cob_axis, len(c.axes) - 1)]
    m_axis = c.hints["m_axis"] % len(c.axes)
    hints = {**c.hints, "m_axis": keep.index(m_axis), "n_axis": -1, "out_block": 0}
    hints.pop("spatial", None)
    return Compute(c.out, tuple(c.axes[i] for i in keep) + (co,), tuple(c.extents[i] for i in keep) +
                   (c.extents[cob_axis] * nr,), substitute(c.body, m),
                   tuple(substitute(i, m) for i in c.store_index), hints)


def _nest(k: Kernel, c: Compute, tag: str, target: Target, threads: int, uk: UKernel, narrow: UKernel | None,
          red: Reduce, bload: Load, b_base: Expr, a_expr: Expr, mn: tuple[int, int], K: int,
          dec: Decisions) -> list[Stmt]:
    m_axis, n_axis = mn
    m_v, n_v = c.axes[m_axis], c.axes[n_axis]
    M, N = c.extents[m_axis], c.extents[n_axis]
    MR, NR = uk.mr, uk.nr
    others = [(v, e) for i, (v, e) in enumerate(zip(c.axes, c.extents)) if i not in mn]
    n_tiles, n_panels = -(-M // MR), -(-N // NR)
    n_others = int(np.prod([e for _, e in others])) if others else 1
    all_tiles = n_others * n_tiles
    MB, KC = choose_blocks(all_tiles, K, MR, NR, target)
    MB = int(dec.knob("mb", MB, [b for b in powers_of_two(1, all_tiles) if b < all_tiles] + [all_tiles]))
    KC = int(dec.knob("kc", KC, [kc for kc in powers_of_two(64, K) if kc < K] + [K]))
    n_blocks = -(-all_tiles // MB)
    o = Var(f"uother{tag}")  # the other output axes, flattened
    mt, j, ni, mi = (Var(f"{x}{tag}") for x in ("utile", "upanel", "ulane", "urow"))
    ap, ct = f"Ap{tag}", f"Ct{tag}"
    k.scratch.append(Buffer(ap, "float32", (n_others, n_tiles, K, MR)))
    kind = "parallel" if threads > 1 else "serial"

    def decode_others(flat: Expr) -> dict[Expr, Expr]:
        out: dict[Expr, Expr] = {}
        stride = 1
        for v, e in reversed(others):
            out[v] = (flat // stride) % e if stride > 1 else flat % e
            stride *= e
        return out

    # 1. pack every row tile once: Ap[o, mt, k(r), mi] = A(m = mt·MR + mi, r); full row tiles read unclamped
    #    (contiguous loads along mi for conv rows), the last partial one repeats row M−1 for its missing rows
    kflat: Expr = _i(0)
    for v, n in red.axes:
        kflat = kflat * n + v if not (isinstance(kflat, Const) and kflat.value == 0) else v
    lanes = min(target.lanes(32), 1 << (MR - 1).bit_length())
    row0 = mt * MR
    r_last, r_len = red.axes[-1]
    by_rows = _max_stride(k, substitute(a_expr, {m_v: row0 + mi}), mi) in (1, 2, 3, 4) or r_len < 8 or \
        _max_stride(k, a_expr, r_last) != 1

    def pack_rows(value: Expr, by_rows: bool) -> list[Stmt]:
        """The compiler-generated pack of `value` (A at row m = row0 + mi), for an A that is not a plain matrix
        (a conv's implicit im2col). by_rows: vectors along the tile's rows (conv rows: contiguous input pixels);
        else each row's contiguous k run is one vector load (rows K floats apart: gathering across them would
        thrash one L1 set when K·4 is a multiple of 4 KiB), the MR rows unrolled inside that vector loop over
        r_last — codegen's transposed store group (codegen/transpose.py) interleaves the MR row vectors in
        registers into MR contiguous stores instead of MR scatters of stride MR (on a scalable target, which has
        no such group, the rows stay outside: one strided vp.scatter per row and step)."""
        st: Stmt = Store(ap, (o, mt, kflat, mi), value)
        rows_inside = by_rows or not target.scalable
        if rows_inside:
            st = Loop(mi, _i(MR), [st], *(("vector", lanes, True) if by_rows else ("unroll",)))
        for v, n in reversed(red.axes):
            st = Loop(v, _i(n), [st], *(("vector", target.lanes(32), True) if v == r_last and not by_rows else ()))
        return [st] if rows_inside else [Loop(mi, _i(MR), [st])]

    pack_body = _pack_call(k, target, a_expr, red, m_v, MR, M, K, row0, Addr(ap, (o, mt, _i(0), _i(0))))
    if pack_body is None:
        unclamped = pack_rows(substitute(a_expr, {m_v: row0 + mi}), by_rows)
        pack_body = unclamped if M % MR == 0 else [If(cmp("<=", row0 + MR, _i(M)), unclamped, pack_rows(
            substitute(a_expr, {m_v: minimum(row0 + mi, _i(M - 1))}), by_rows))]
        in_row = _row_of_pixels(a_expr, m_v, row0, mi, MR) if by_rows else None
        # a tile inside one output row: affine rows, one (strided) vector load per step — where its rows are
        # near (an NCHW input); a blocked input's rows are a channel block apart and stay transposed (no gather)
        if in_row is not None and _max_stride(k, in_row[0], mi) in (1, 2, 3, 4):
            a_row, test = in_row
            pack_body = [If(_full_tile_in_row(test, row0, MR, M), pack_rows(a_row, True), pack_body)]
    pf = Var(f"upack{tag}")
    pack = Loop(pf, _i(n_others * n_tiles), rename(pack_body, {o: pf // n_tiles, mt: pf % n_tiles,
                                                               **decode_others(pf // n_tiles)}),
                kind if n_others * n_tiles > 1 else "serial")

    # 2. the microkernel calls, one per K block (accumulating after the first); B panel j starts at element
    #    j·K·NR (the layout _panel_operand checked), K block kc at + kc·KC·NR
    a_at = (o * n_tiles + mt) * (K * MR)
    n_kc = -(-K // KC)
    kc = Var(f"ukc{tag}")

    def calls_of(fn: str) -> list[Stmt]:
        if n_kc == 1:
            return [Call(fn, (Addr(ap, (a_at,)), Addr(bload.buf, (b_base + j * (K * NR),)), Addr(ct, (_i(0),)), _i(NR),
                              _i(K), Const(0, "int32")))]
        kext: Expr = minimum(_i(KC), _i(K) - kc * KC) if K % KC else _i(KC)
        flag = Select(cmp(">", kc, _i(0)), Const(1, "int32"), Const(0, "int32"))
        return [Loop(kc, _i(n_kc), [Call(fn, (
            Addr(ap, (a_at + kc * (KC * MR),)), Addr(bload.buf, (b_base + j * (K * NR) + kc * (KC * NR),)),
            Addr(ct, (_i(0),)), _i(NR), kext, flag))])]
    calls = calls_of(uk.name)
    if narrow is not None:  # the last panel, ≤ one vector of valid columns: the narrow edge kernel
        calls = [If(cmp("==", j, _i(n_panels - 1)), calls_of(narrow.name), calls)]

    # 3. the epilogue on the hot tile
    m_expr, n_expr = row0 + mi, j * NR + ni
    value = simplify_panels(substitute(c.body, {red: Load(ct, (mi, ni), "float32"), m_v: m_expr, n_v: n_expr}),
                            ni, NR)
    out_idx = tuple(simplify_panels(substitute(i, {m_v: m_expr, n_v: n_expr}), ni, NR) for i in c.store_index)
    store: Stmt = Store(c.out, out_idx, value)
    n_ext: Expr = minimum(_i(NR), _i(N) - j * NR) if N % NR else _i(NR)
    out_flat = flat_index(out_idx, k.buffer(c.out).shape)
    transposed: list[Stmt] = []
    allocs: list[Stmt] = [Alloc(ct, "float32", (MR, NR))]
    if coef(out_flat, mi) == 1 and coef(out_flat, ni) != 1:
        # the output is contiguous along the tile's rows (NCHW conv: rows = pixels, columns = channels): the
        # family's packing kernel transposes Ct into CtT[NR, MR] in registers, then one vector per column is
        # read contiguously and stored contiguously; rows past M masked off
        m_ext: Expr = minimum(_i(MR), _i(M) - row0) if M % MR else _i(MR)
        pk = pack_kernel_for(target, MR)
        if pk is not None:
            k.extern_ir[pk.name] = pk.ir_text
            ctt = f"CtT{tag}"
            allocs.append(Alloc(ctt, "float32", (NR, MR)))
            transposed = [Call(pk.name, (Addr(ct, (_i(0),)), _i(NR), _i(MR), _i(NR), Addr(ctt, (_i(0),))))]
            store = Store(c.out, out_idx, substitute(c.body, {red: Load(ctt, (ni, mi), "float32"), m_v: m_expr,
                                                              n_v: n_expr}))
        epilogue = Loop(ni, n_ext, [Loop(mi, m_ext, [store], "vector", lanes, masked=True)])
    else:
        if M % MR:
            store = If(cmp("<", m_expr, _i(M)), [store])
        epilogue = Loop(ni, n_ext, [Loop(mi, _i(MR), [store], "unroll")], "vector", NR, masked=True)

    # one parallel loop over (block of MB row tiles, j), j fastest: consecutive iterations share the A block,
    # and each iteration's panel serves the MB tiles of the block. Tiles are numbered across the other
    # axes too (T = o·⌈M/MR⌉ + mt, the order of Ap), so a conv whose rows are single tiles still shares panels.
    # (the knob `ukr_order` "block": blocks fastest instead — each panel passes once, every A block under it)
    flat, t = Var(f"ublock{tag}"), Var(f"ut{tag}")
    panel_fastest = dec.knob("ukr_order", "panel", ("panel", "block")) == "panel"
    blk = flat // n_panels if panel_fastest else flat % n_blocks
    j_of = flat % n_panels if panel_fastest else flat // n_blocks
    tiles_here: Expr = minimum(_i(MB), _i(all_tiles) - blk * MB) if all_tiles % MB else _i(MB)
    tile = blk * MB + t
    tile_loop = Loop(t, tiles_here, rename(calls + transposed + [epilogue], {
        j: j_of, mt: tile % n_tiles, o: tile // n_tiles, **decode_others(tile // n_tiles)}))
    total = n_blocks * n_panels
    compute = Loop(flat, _i(total), allocs + [tile_loop], kind if total > 1 else "serial")
    return [pack, compute]
