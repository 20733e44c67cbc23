"""AMX schedules for bf16 anchors (precision="bf16", graph/passes/precision.py) and integer anchors (QPackedMatMul,
dense QPackedConv: schedule/int8.py): the anchor's reduction on AMX tile kernels (kiln/ukernels/amx.py: tdpbf16ps,
or tdpbusd / tdpbssd on 8-bit operands into int32), the epilogue on the C block in the existing fused form.
Everything below is written for bf16 (pairs, KB = 32 values = one 64-byte tile row); the integer anchors take it with
`Operands` for 8-bit quads: VNNI panels of 4 (graph/quant_pack.py), steps of 64, 32 or 16 bytes (a 32-channel block
read in place takes 32), packed rows u8/s8, C int32.

Applies to the packed anchors with bf16 operands — PackedMatMul out[.., m, n] = Σ_k A[.., m, k] · Bv[n // NR, k // 2,
n % NR, k % 2] and PackedConv (blocked output, dense) — on a host whose process may use AMX (kiln/runtime/amx.py),
with the `amx` switch on. The output channel (GEMM column) axis n is cut into NR-wide panels (NR = 32: two B tiles
of 16 columns; 16: one); the rows (GEMM rows, conv output pixels) into tiles of MR ≤ 16; two row tiles and the two
B tiles of a panel make one 2×2 block: 4 accumulator tiles, 2 A tiles, 2 B tiles per K step of 32 (KB) values.

Where A comes from (`_rows`):
  * in place — A is one bf16 load, contiguous along the innermost reduction axis (a GEMM's K, a blocked input's
    channel block) with K steps at constant strides: the tile kernel reads its A tiles straight from the activation.
    A conv's pixels: with stride 1 the input pixel of output (oh, ow) at tap (kh, kw) is q + kh·Wp + kw, q = oh·Wp + ow,
    Wp the (padded) input row — so rows run over q in [0, (OH−1)·Wp + OW) (oneDNN's brgemm trick): an MR-row tile
    crosses output-row ends, and its Wp − OW rows per output row that are no output (ow ≥ OW) are computed and
    dropped (56×56: 2 of 58, 7×7: 2 of 9), instead of tiles cut to the row length (7 rows of 16).
  * packed — otherwise (strided convs, an NCHW input's implicit im2col, K not a multiple of 32): the compiler packs
    A into Ap[o, tile, MR, Kp] bf16 rows (Kp = K rounded up to 32, zero-filled; rows past M repeat row M−1), and the
    tile kernel reads those (lda = 2·Kp, one K axis of Kp/32 steps).

Where B comes from:
  * weights — PackedMatMul / PackedConv panels, rounded and put in VNNI order at compile time
    (graph/passes/precision.py), read where they are;
  * activations — a plain MatMul of two bf16 activations (attention's Q·Kᵀ and P·V, a MatMul too narrow for
    pack_weights): `_pack_b` packs B into the same VNNI panels at run time, Bv[o·P + j, Kp/2, NR, 2] per batch
    point o, in a parallel stage before the tile kernels (as `_pack` packs A). It copies bf16 values (the Cast to
    bf16 stays fused in B's producer), |B| elements against the M·|B| multiply-adds that read them.

Loop nest (o: other output axes, e.g. batch; j: panel; blocks of MT·MR rows):

    [pack:  parallel for (o, t): for mi < MR: Ap[o, t, mi, k] = A(o, m = t·MR + mi, k);  Ap[o, t, mi, K..Kp] = 0]
    [pack B (activations): parallel for (o, j): Bv[o·P + j, kk, ni, h] = B(o, 2·kk + h, j·NR + ni), 0 outside]
    parallel for part < PARTS:                                         # ≈ 4 per thread
      call kiln_amx_config_bf16_m<MR>_k<KB>()                          # ldtilecfg once per part, not per call
      for w in part's share of the (o, block, j) work items:           # j fastest if all of B fits half of L2
        alloc Ct[MT·MR, NR] f32                                        #   (the block's A reused), else blocks fastest
        call kiln_amx_bf16_<MT>x<NT>_m<MR>_k<KB>(A0, A1, lda, &Bv[panel j], Ct, 4·NR, steps…, 0)
        for ni < min(NR, N − j·NR) vector<NR> masked:                  # the epilogue on the hot C block
          for r < MT·MR unroll: if row(r) is an output: out[o, row(r), j·NR + ni] = epilogue(Ct[r, ni])
      call kiln_amx_release()
    [edge rows (fewer than a block): the same with MT = 1 kernels of their own row counts, each its own config]

When B streams from memory (more than half of L2: the 7×7 and 14×14 convs' 1–5 MB of weights) and there are edge
rows, that would be one pass over B per nest; instead one nest of work items (o, j), each one panel with all its
rows — the blocks under their configuration, then each edge tile under its own — so B is read once.

Returns None (the anchor is then emitted directly: vdpbf16ps or the emulation) for anything else: depthwise convs
(they stay fp32), NCHW outputs (the C block would be stored transposed), or a reduction the layouts above do not
describe."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from kiln.kernel.analysis import coef, flat_index, simplify_panels
from kiln.kernel.ir import (
    Addr,
    Alloc,
    Bin,
    Buffer,
    Call,
    Cast,
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
from kiln.runtime.amx import usable
from kiln.schedule.config import Decisions
from kiln.schedule.primitives import rename
from kiln.schedule.tile import flatten_rows
from kiln.schedule.ukernel import _eval_index, merge_channel_blocks
from kiln.target import Target
from kiln.ukernels.amx import PREFETCH_BYTES, RELEASE, amx_kernel, config_ir, config_name, release_ir

KB = 32            # bf16 K values per step: one 64-byte A tile row
MAX_MR = 16
PARTS_PER_THREAD = 4


def _i(v: int) -> Const:
    return Const(int(v), "int64")


@dataclass
class Rows:
    """How the nest walks the rows of A (and of the output): q in [0, M) per other-axes point o.

    `decode` maps the compute's row axes to expressions of q; `valid(q)` says whether row q is an output (virtual
    rows past an output row's end are not); `a_base(o, q0)` is the flat A index of row q0's first K element (in
    place) — or None when A is packed."""
    axes: tuple[Var, ...]          # the compute's row axes (oh, ow) or (m,)
    M: int                         # rows per o (virtual rows included)
    decode: dict[Expr, Expr]       # row axis → expression of q
    valid: Expr | None             # extra condition on q for the stores (None: every row is one)
    lda: int                       # bytes between A rows
    steps: list[tuple[int, int]]   # the K steps: (count, A stride in bytes), outermost first, at most 3
    a_flat: Expr                   # flat A index of row q's first K element (the step axes at 0)
    a_buf: str = ""                # the buffer A is read from ("" = the anchor's own A operand)


@dataclass(frozen=True)
class Operands:
    """What the tile kernels multiply (kiln/ukernels/amx.py DTYPES): bf16 pairs into float32, or 8-bit quads into
    int32 (an integer anchor, graph/quant_pack.py's VNNI panels)."""
    dtype: str     # the kernels' element kind: bf16 | u8s8 | s8s8
    elem: str      # A's element type: bfloat16 | uint8 | int8
    size: int      # bytes per A element
    group: int     # K values per VNNI group of B
    kb: int        # K values per kernel step (one A tile row: KB·size ≤ 64 bytes)
    acc: str       # C's element type


BF16 = Operands("bf16", "bfloat16", 2, 2, KB, "float32")


def _int8_operands(a: Load, e_last: int, kp: int, K: int) -> Operands | None:
    """The 8-bit operands with the widest step (64, 32 or 16 bytes per A row) that the rows can be read with: in
    place (the innermost reduction axis a multiple of it: a blocked conv's 32-channel block takes 32), else packed
    (the panel's padded K a multiple of it)."""
    kb = next((x for x in (64, 32, 16) if e_last % x == 0 and kp == K), 0) or \
        next((x for x in (64, 32, 16) if kp % x == 0), 0)
    dtype = "u8s8" if a.dtype == "uint8" else "s8s8"
    return Operands(dtype, a.dtype, 1, 4, kb, "int32") if kb else None


def _factors(prod: Expr, n_v: Var) -> tuple[Load, Load, bool] | None:
    """(A, B, integer) of the product A · B (B the factor that moves with the column n), or None: two bf16 loads, or
    two 8-bit loads widened to int32 (u8/s8 A, s8 B)."""
    if not (isinstance(prod, Bin) and prod.op == "*"):
        return None
    x, y = prod.a, prod.b
    integer = all(isinstance(f, Cast) and f.dtype == "int32" for f in (x, y))
    if integer:
        x, y = x.a, y.a
    b, a = (y, x) if uses_var(y, n_v) else (x, y)
    if not (isinstance(a, Load) and isinstance(b, Load)) or uses_var(a, n_v):
        return None
    if integer:
        return (a, b, True) if a.dtype in ("uint8", "int8") and b.dtype == "int8" else None
    return (a, b, False) if a.dtype == b.dtype == "bfloat16" else None


def schedule_amx(k: Kernel, c: Compute, tag: str, target: Target, threads: int,
                 options: dict[str, bool], dec: Decisions | None = None) -> list[Stmt] | None:
    """The AMX nest of a bf16 anchor or of an integer one (schedule/int8.py), or None where it does not apply.
    Knobs (schedule/config.py; every point computes the same C blocks, each whole in one kernel call): `amx_order`
    — panels fastest (the block's A tiles serve every panel) or row blocks fastest (each panel's B read once), by
    default panels where all of B fits half of L2 —, `amx_parts` — parallel parts per thread (4) —, and
    `amx_prefetch` — how far ahead in B the tile kernel prefetches (ukernels/amx.py; 0: not)."""
    if not options.get("amx", True) or target.arch != "x86_64" or not usable(target.features):
        return None
    if c.hints.get("depthwise") or (c.store is not None and len(c.store) != 1):  # (one flat index: stored as the axes)
        return None
    activation_b = "nr" not in c.hints  # a MatMul of two activations (attention's Q·Kᵀ, P·V): B packed here
    if activation_b:
        c = _activation_matmul(c)
        if c is None:
            return None
    if "nr" not in c.hints or "m_axis" not in c.hints:
        return None
    nr = int(c.hints["nr"])
    if nr not in (16, 32) or (c.hints.get("n_axis", -1) % len(c.axes)) != len(c.axes) - 1 and \
            not c.hints.get("out_block"):
        return None  # an NCHW output: its C block would be stored transposed (left to direct emission)
    spatial = tuple(c.axes[a % len(c.axes)] for a in c.hints.get("spatial", ()))
    if c.hints.get("out_block"):
        c = merge_channel_blocks(c)
    reds = [e for e in walk(c.body) if isinstance(e, Reduce)]
    if len(reds) != 1 or reds[0].op != "sum":
        return None
    red = reds[0]
    n_v, N = c.axes[-1], c.extents[-1]
    factors = _factors(red.body, n_v)
    if factors is None:
        return None
    a, b, integer = factors
    if (integer and activation_b) or (not integer and k.buffer(c.out).dtype not in ("float32", "bfloat16")):
        return None
    K = int(np.prod([e for _, e in red.axes]))
    pre: list[Stmt] = []
    if activation_b:
        kp = -(-K // KB) * KB
        b, b_base, pack_b = _pack_b(k, c, b, red, nr, kp, tag, threads)
        pre.append(pack_b)
    else:
        panels = vnni_panels(k, b, red, n_v, nr, K, group=4 if integer else 2)
        if panels is None:
            return None
        b_base, kp = panels
    ops = _int8_operands(a, red.axes[-1][1], kp, K) if integer else BF16
    if ops is None:
        return None
    row_axes = spatial if spatial else (c.axes[c.hints["m_axis"] % len(c.axes)],)
    if any(v not in c.axes for v in row_axes):
        return None
    rows = in_place(k, c, a, red, row_axes, ops.size, ops.kb) if kp == K else None
    if rows is None:
        packed = _pack(k, c, a, red, row_axes, tag, threads, kp, ops)
        if packed is None:
            return None
        c, a, rows, pack_a = packed
        pre += pack_a
        red = next(e for e in walk(c.body) if isinstance(e, Reduce))
    nest = _nest(k, c, red, b, b_base, rows, nr, N, kp, tag, target, threads if options.get("parallel", True) else 1,
                 ops, dec if dec is not None else Decisions())
    return pre + nest


def _activation_matmul(c: Compute) -> Compute | None:
    """A plain MatMul out[.., m, n] = Σ_k A[.., m, k] · B[.., k, n] of two bf16 activations (kernel/lower.py: no
    packed panels, so no hints), with the hints the AMX nest reads: m the second-to-last axis, n the last, panels
    of NR = 32 columns (16 when N ≤ 16); None for any other compute."""
    if len(c.axes) < 2:
        return None
    reds = [e for e in walk(c.body) if isinstance(e, Reduce)]
    if len(reds) != 1 or len(reds[0].axes) != 1 or not (isinstance(reds[0].body, Bin) and reds[0].body.op == "*"):
        return None
    m_v, n_v = c.axes[-2], c.axes[-1]
    x, y = reds[0].body.a, reds[0].body.b
    b, a = (y, x) if uses_var(y, n_v) else (x, y)
    if not (isinstance(a, Load) and isinstance(b, Load)) or uses_var(a, n_v) or uses_var(b, m_v) \
            or not uses_var(a, m_v) or not uses_var(b, n_v):
        return None
    return Compute(c.out, c.axes, c.extents, c.body, c.store,
                   {**c.hints, "nr": 32 if c.extents[-1] > 16 else 16, "m_axis": -2, "n_axis": -1})


def _pack_b(k: Kernel, c: Compute, b: Load, red: Reduce, nr: int, kp: int, tag: str,
            threads: int) -> tuple[Load, Expr, Stmt]:
    """An activation B[.., k, n] (bf16) packed at run time into the VNNI panels the tile kernels read, one set per
    point o of the batch axes: Bv[o·P + j, kk, ni, h] = B[o, k = 2·kk + h, n = j·NR + ni], zero past K and N
    (P = ⌈N/NR⌉ panels, Kp = K rounded up to a step). The loop nest:

        parallel for pj < n_o·P:                 # o = pj // P, j = pj % P
          for kk < Kp/2:
            for ni < NR vector<NR>:  for h < 2 unroll:  Bv[pj, kk, ni, h] = B(o, 2·kk + h, j·NR + ni)

    Per (o, j, kk): two vectors of NR values, rows 2·kk and 2·kk + 1 of B (contiguous when n is B's innermost
    axis), stored interleaved — a transposed store group (codegen/transpose.py, S = R = 2): two shuffles and two
    full-width stores, no scatter. Returns the Load standing for B (the buffer), the flat index of point o's first
    panel, and the nest (run before the tile kernels)."""
    (rk, K), n_v, N = red.axes[0], c.axes[-1], c.extents[-1]
    others = list(zip(c.axes[:-2], c.extents[:-2]))
    n_o = int(np.prod([e for _, e in others])) if others else 1
    P = -(-N // nr)
    bv = f"Bv{tag}"
    k.scratch.append(Buffer(bv, "bfloat16", (n_o * P, kp // 2, nr, 2)))
    pj, kk, ni, h = Var(f"bvp{tag}"), Var(f"bvk{tag}"), Var(f"bvn{tag}"), Var(f"bvh{tag}")
    k_at, n_at = kk * 2 + h, (pj % P) * nr + ni
    conds = ([cmp("<", k_at, _i(K))] if kp > K else []) + ([cmp("<", n_at, _i(N))] if N % nr else [])
    value: Expr = substitute(b, {rk: minimum(k_at, _i(K - 1)) if kp > K else k_at,
                                 n_v: minimum(n_at, _i(N - 1)) if N % nr else n_at, **decode_flat(others, pj // P)})
    if conds:
        value = Select(conds[0] if len(conds) == 1 else Bin("and", conds[0], conds[1]), value,
                       Const(0.0, "bfloat16"))
    body: Stmt = Loop(ni, _i(nr), [Loop(h, _i(2), [Store(bv, (pj, kk, ni, h), value)], "unroll")], "vector", nr)
    nest = Loop(pj, _i(n_o * P), [Loop(kk, _i(kp // 2), [body])],
                "parallel" if threads > 1 and n_o * P > 1 else "serial")
    return Load(bv, (_i(0),), "bfloat16"), _flat_of(others) * (P * kp * nr) if others else _i(0), nest


def vnni_panels(k: Kernel, b: Load, red: Reduce, n_v: Var, nr: int, K: int, group: int = 2) -> tuple[Expr, int] | None:
    """The flat index of panel 0's first element, if B is read as VNNI panels of the steps in the reduction's order:
    flat(n = j·NR + ni, k) = base + j·Kp·NR + (k − k % G)·NR + G·ni + k % G (G = `group`: 2 bf16, 4 int8; k the
    row-major position over the reduction axes, Kp ≥ K the panel's padded K); None otherwise. Checked at random
    points (all affine)."""
    shape = k.buffer(b.buf).shape
    if shape[-1] != group or shape[-2] != nr:
        return None
    kp = group * int(np.prod(shape[-3:-2])) if len(shape) == 4 else K  # PackedMatMul, NCHW conv: [P, Kp/G, NR, G]
    j, ni = Var("_panel"), Var("_lane")
    flat = simplify_panels(substitute(flat_index(b.index, shape), {n_v: j * nr + ni}), ni, nr)
    zero = _i(0)
    base = substitute(flat, {j: zero, ni: zero, **{v: zero for v, _ in red.axes}})
    if uses_var(base, j) or uses_var(base, ni) or any(uses_var(base, v) for v, _ in red.axes):
        return None
    rng = np.random.default_rng(0)
    panels = max(1, int(np.prod(shape)) // (kp * nr))
    for _ in range(8):
        env = {j.name: int(rng.integers(panels)), ni.name: int(rng.integers(nr))}
        kflat = 0
        for v, n in red.axes:
            env[v.name] = int(rng.integers(n))
            kflat = kflat * n + env[v.name]
        for v in walk(base):
            if isinstance(v, Var) and v.name not in env:
                env[v.name] = 0
        at_base = _eval_index(base, env)
        want = (env[j.name] * kp + kflat - kflat % group) * nr + group * env[ni.name] + kflat % group
        if at_base is None or _eval_index(flat, env) != at_base + want:
            return None
    return base, kp


def in_place(k: Kernel, c: Compute, a: Load, red: Reduce, row_axes: tuple[Var, ...], size: int = 2,
             kb: int = KB) -> Rows | None:
    """Rows read in place (module docstring), or None. `size`: bytes per A element; `kb`: the innermost axis's
    elements per K step (its extent a multiple of it: one kernel step each; the int8 microkernels take the whole
    axis per step, kiln/schedule/dot_ukernel.py)."""
    fa = flat_index(a.index, k.buffer(a.buf).shape)
    (r_last, e_last) = red.axes[-1]
    if coef(fa, r_last) != 1 or e_last % kb:
        return None
    steps: list[tuple[int, int]] = []
    for v, n in red.axes[:-1]:
        s = coef(fa, v)
        if s is None:
            return None
        steps.append((n, size * s))
    if e_last > kb:
        steps.append((e_last // kb, size * kb))
    steps = [s for s in steps if s[0] > 1] or [(1, 0)]
    if len(steps) > 3:
        return None
    extents = dict(zip(c.axes, c.extents))
    q = Var("q")
    zero = _i(0)
    if len(row_axes) == 1:
        (m,) = row_axes
        cm = coef(fa, m)
        if cm is None or cm < 0 or (cm == 0 and extents[m] > 1):  # one row (a batch-1 classifier) may not move A
            return None
        a_flat = substitute(fa, {m: zero, **{v: zero for v, _ in red.axes}}) + q * cm
        return Rows(row_axes, extents[m], {m: q}, None, size * cm, steps, a_flat, a.buf)
    oh, ow = row_axes
    c_oh, c_ow = coef(fa, oh), coef(fa, ow)
    if not c_oh or not c_ow or c_oh % c_ow or c_ow < 0:
        return None
    wv, OH, OW = c_oh // c_ow, extents[oh], extents[ow]
    if wv < OW:
        return None
    a_flat = substitute(fa, {oh: zero, ow: zero, **{v: zero for v, _ in red.axes}}) + q * c_ow
    valid = cmp("<", q % wv, _i(OW)) if wv > OW else None
    return Rows(row_axes, (OH - 1) * wv + OW, {oh: q // wv, ow: q % wv}, valid, size * c_ow, steps, a_flat,
                a.buf)


def _pack(k: Kernel, c: Compute, a: Load, red: Reduce, row_axes: tuple[Var, ...], tag: str,
          threads: int, Kp: int, ops: Operands = BF16) -> tuple[Compute, Load, Rows, list[Stmt]] | None:
    """A packed into row tiles Ap[o, t, MR, Kp] of its own type (im2col for a conv), and the Rows that read it."""
    if len(row_axes) == 2:
        hints = dict(c.hints)
        hints["spatial"] = tuple(c.axes.index(v) - len(c.axes) for v in row_axes)
        hints["m_axis"] = hints["spatial"][1]
        hints["n_axis"] = -1
        c = flatten_rows(Compute(c.out, c.axes, c.extents, c.body, c.store, hints))
        red = next(e for e in walk(c.body) if isinstance(e, Reduce))
        factors = _factors(red.body, c.axes[-1])
        if factors is None:
            return None
        a = factors[0]
    m_v = c.axes[c.hints["m_axis"] % len(c.axes)]
    M = c.extents[c.axes.index(m_v)]
    K = int(np.prod([e for _, e in red.axes]))
    if Kp % ops.kb or Kp < K:
        return None  # the panels must hold whole steps (graph/passes/precision.py pads them)
    mr = MAX_MR  # rows are contiguous in Ap (Kp apart): the tile kernels cut them as they like
    n_tiles = -(-M // mr)
    others = [(v, e) for v, e in zip(c.axes[:-1], c.extents[:-1]) if v != m_v]
    n_o = int(np.prod([e for _, e in others])) if others else 1
    ap = f"Ap{tag}"
    k.scratch.append(Buffer(ap, ops.elem, (n_o, n_tiles, mr, Kp)))
    o, t, mi = Var(f"apo{tag}"), Var(f"apt{tag}"), Var(f"api{tag}")
    kflat: Expr = _i(0)
    for v, n in red.axes:
        kflat = kflat * n + v if not (isinstance(kflat, Const) and kflat.value == 0) else v
    row = minimum(t * mr + mi, _i(M - 1)) if M % mr else t * mr + mi
    value = substitute(a, {m_v: row})
    st: Stmt = Store(ap, (o, t, mi, kflat), value)
    r_last, _ = red.axes[-1]
    for v, n in reversed(red.axes):
        st = Loop(v, _i(n), [st], *(("vector", 16, True) if v == r_last else ()))
    body: list[Stmt] = [st]
    if Kp > K:
        kz = Var(f"apz{tag}")
        zero = Const(0.0 if ops.elem == "bfloat16" else 0, ops.elem)
        body.append(Loop(kz, _i(Kp - K), [Store(ap, (o, t, mi, kz + K), zero)], "vector", 16, True))
    pf = Var(f"appack{tag}")
    decode = decode_flat(others, pf // n_tiles)
    nest = Loop(pf, _i(n_o * n_tiles), rename([Loop(mi, _i(mr), body)], {o: pf // n_tiles, t: pf % n_tiles, **decode}),
                "parallel" if threads > 1 and n_o * n_tiles > 1 else "serial")
    q = Var("q")
    o_flat = _flat_of(others)
    a_flat = (o_flat * n_tiles * mr * Kp if others else _i(0)) + q * Kp
    rows = Rows((m_v,), n_tiles * mr, {m_v: q}, cmp("<", q, _i(M)) if M % mr else None, ops.size * Kp,
                [(Kp // ops.kb, ops.size * ops.kb)], a_flat, ap)
    ap_load = Load(ap, (_i(0),), ops.elem)
    return c, ap_load, rows, [nest]


def block_epilogue(c: Compute, red: Reduce, ct: str, acc_dtype: str, rows: Rows, q0: Expr, n_rows: int,
                   o_of: dict[Expr, Expr], j: Expr, nr: int, tag: str, m_end: int | None = None,
                   tail: Callable[[dict[Expr, Expr]], Expr] | None = None) -> Stmt:
    """The compute's fused epilogue over a C block a tile kernel left in Ct[n_rows, NR] (rows q0 …, panel j):

        for ni < min(NR, N − j·NR) vector<NR> masked:
          for r < n_rows unroll:  [if row q0 + r is an output:]  out[o, row(q0 + r), j·NR + ni] = epilogue(Ct[r, ni])

    `m_end`: rows from it on are none (a partial last block); `tail(mapping)`: products the kernel left out (the
    int8 microkernels' K % 4 values), added to Ct before the epilogue."""
    q = Var("q")
    ni, r = Var(f"ani{tag}"), Var(f"ar{tag}")
    qr = q0 + r
    mapping = {**o_of, **{ax: substitute(d, {q: qr}) for ax, d in rows.decode.items()}, c.axes[-1]: j * nr + ni}
    acc: Expr = Load(ct, (r, ni), acc_dtype)
    if tail is not None:
        acc = acc + tail(mapping)
    value = simplify_panels(substitute(c.body, {red: acc, **mapping}), ni, nr)
    out_idx = tuple(simplify_panels(substitute(i, mapping), ni, nr) for i in c.store_index)
    store: Stmt = Store(c.out, out_idx, value)
    conds = ([substitute(rows.valid, {q: qr})] if rows.valid is not None else []) + \
        ([cmp("<", qr, _i(m_end))] if m_end is not None else [])
    if conds:
        store = If(conds[0] if len(conds) == 1 else Bin("and", conds[0], conds[1]), [store])
    N = c.extents[-1]
    n_ext: Expr = minimum(_i(nr), _i(N) - j * nr) if N % nr else _i(nr)
    return Loop(ni, n_ext, [Loop(r, _i(n_rows), [store], "unroll")], "vector", nr, masked=True)


def _flat_of(others: list[tuple[Var, int]]) -> Expr:
    flat: Expr = _i(0)
    for v, e in others:
        flat = flat * e + v if not (isinstance(flat, Const) and flat.value == 0) else v
    return flat


def decode_flat(others: list[tuple[Var, int]], flat: Expr) -> dict[Expr, Expr]:
    """Each of `others` (row-major, the last fastest) at the merged index `flat`."""
    out: dict[Expr, Expr] = {}
    stride = 1
    for v, e in reversed(others):
        out[v] = (flat // stride) % e if stride > 1 else flat % e
        stride *= e
    return out


def _pick_mr(m: int) -> int:
    """Rows per tile for M rows: 16 where it divides, else the divisor in 8..16 wasting least, else 16 (+ edges)."""
    for r in range(MAX_MR, 7, -1):
        if m % r == 0:
            return r
    return min(MAX_MR, m)


def _nest(k: Kernel, c: Compute, red: Reduce, b: Load, b_base: Expr, rows: Rows, nr: int, N: int, K: int,
          tag: str, target: Target, threads: int, ops: Operands, dec: Decisions) -> list[Stmt]:
    """The AMX nest (module docstring); K is the B panel's (padded) reduction length."""
    dt, kb = ops.dtype, ops.kb
    nt = nr // 16
    others = [(v, e) for v, e in zip(c.axes[:-1], c.extents[:-1]) if v not in rows.axes]
    n_o = int(np.prod([e for _, e in others])) if others else 1
    M = rows.M
    mr = MAX_MR if M >= MAX_MR else M
    mt = 2 if M >= 2 * mr else 1
    block = mt * mr
    n_blocks = M // block
    P = -(-N // nr)
    a_buf = rows.a_buf
    q = Var("q")
    n2, n1, n0 = ([(1, 0)] * (3 - len(rows.steps)) + rows.steps)
    ct = f"Ct{tag}"
    step_args = (_i(n2[0]), _i(n2[1]), _i(n1[0]), _i(n1[1]), _i(n0[0]), _i(n0[1]))

    def segment(o_of: dict[Expr, Expr], q0: Expr, kern_mt: int, kern_mr: int, j: Expr) -> list[Stmt]:
        """One kernel call on rows q0 .. q0 + MT·MR and panel j, then the epilogue."""
        kern = amx_kernel(dt, kern_mt, nt, kern_mr, kb, prefetch)
        k.extern_ir[kern.name] = kern.ir_text
        a0 = Addr(a_buf, (substitute(rows.a_flat, {q: q0, **o_of}),))
        a1 = Addr(a_buf, (substitute(rows.a_flat, {q: q0 + kern_mr, **o_of}),)) if kern_mt == 2 else a0
        b_at = Addr(b.buf, (substitute(b_base, o_of) + j * (K * nr),))  # B packed per batch point: base depends on o
        call = Call(kern.name, (a0, a1, _i(rows.lda), b_at, Addr(ct, (_i(0),)), _i(4 * nr)) + step_args
                    + (Const(0, "int32"),))
        return [call, block_epilogue(c, red, ct, ops.acc, rows, q0, kern_mt * kern_mr, o_of, j, nr, tag)]

    def nest(n_items: int, item: Callable[[Expr], list[Stmt]], cfg_mr: int) -> Loop:
        """parallel parts over n_items work items, the tile configuration loaded once per part."""
        k.extern_ir[config_name(dt, cfg_mr, kb)] = config_ir(dt, cfg_mr, kb)
        k.extern_ir[RELEASE] = release_ir()
        parts = max(1, min(n_items, threads * parts_per_thread)) if threads > 1 else 1
        per = -(-n_items // parts)
        parts = -(-n_items // per)
        part, w = Var(f"apart{tag}"), Var(f"aw{tag}")
        count: Expr = minimum(_i(per), _i(n_items) - part * per) if n_items % per else _i(per)
        body = [Call(config_name(dt, cfg_mr, kb), ()), Alloc(ct, ops.acc, (block, nr)),
                Loop(w, count, item(part * per + w)), Call(RELEASE, ())]
        return Loop(part, _i(parts), body, "parallel" if parts > 1 else "serial")

    # j fastest when every panel fits half of L2 beside the A block (the block's A tiles then serve all panels)
    b_bytes = P * K * nr * ops.size
    panel_fastest = dec.knob("amx_order", "panels" if b_bytes <= target.l2_bytes // 2 else "blocks",
                             ("panels", "blocks")) == "panels"
    parts_per_thread = dec.knob("amx_parts", PARTS_PER_THREAD, (1, 2, 4, 8)) if threads > 1 else PARTS_PER_THREAD
    prefetch = dec.knob("amx_prefetch", PREFETCH_BYTES, (0, 2048, 4096, 6144, 8192, 12288))  # B bytes ahead
    edges: list[tuple[int, int]] = []   # (first row, rows): tiles of at most MR rows past the whole blocks
    q_edge = n_blocks * block
    while q_edge < M:
        edges.append((q_edge, min(mr, M - q_edge)))
        q_edge += edges[-1][1]
    if edges and not panel_fastest and n_o * P >= 2 * threads:
        # B streams from memory (a 7×7 or 14×14 conv's 1–5 MB of weights): one pass over it, each work item one
        # panel with all its rows — the blocks, then the edge tiles, each with its own tile configuration —
        # instead of a pass per edge nest (3 passes over B, measured ≈ 3× the time of these layers)
        k.extern_ir[RELEASE] = release_ir()
        for cfg_mr in {mr} | {rh for _, rh in edges}:
            k.extern_ir[config_name(dt, cfg_mr, kb)] = config_ir(dt, cfg_mr, kb)
        w, bl = Var(f"aw{tag}"), Var(f"abl{tag}")
        o_of = decode_flat(others, w // P)
        body: list[Stmt] = [Alloc(ct, ops.acc, (block, nr))]
        if n_blocks:
            body += [Call(config_name(dt, mr, kb), ()),
                     Loop(bl, _i(n_blocks), segment(o_of, bl * block, mt, mr, w % P))]
        for q0, rh in edges:
            body += [Call(config_name(dt, rh, kb), ())] + segment(o_of, _i(q0), 1, rh, w % P)
        return [Loop(w, _i(n_o * P), body + [Call(RELEASE, ())], "parallel" if threads > 1 else "serial")]
    out: list[Stmt] = []
    if n_blocks:
        def main_item(wi: Expr) -> list[Stmt]:
            if panel_fastest:
                j, ob = wi % P, wi // P
            else:
                j, ob = wi // (n_o * n_blocks), wi % (n_o * n_blocks)
            o_of = decode_flat(others, ob // n_blocks)
            return segment(o_of, (ob % n_blocks) * block, mt, mr, j)
        out.append(nest(n_o * n_blocks * P, main_item, mr))
    # edge rows: tiles of at most MR rows with MT = 1, each row count its own configuration
    for q0, rh in edges:
        def edge_item(wi: Expr, q0: int = q0, rh: int = rh) -> list[Stmt]:
            return segment(decode_flat(others, wi // P), _i(q0), 1, rh, wi % P)
        out.append(nest(n_o * P, edge_item, rh))
    return out
