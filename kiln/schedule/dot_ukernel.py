"""The `ukernel` strategy of the integer and bf16 anchors: the reduction on a hand-written dot-product microkernel
(kiln/ukernels/dot.py: vpdpbusd, vpmaddwd, SDOT or SMMLA for 8-bit operands; vdpbf16ps or BFMMLA for bf16 — chosen
by the target), the epilogue (requantization, bias, activation) on the int32 / float32 C tile it leaves, in the
anchor's fused form.

Applies to QPackedMatMul and dense QPackedConv (kernel/lower_quant.py: weights in VNNI panels [.., K/4, NR, 4], or
int16 pairs [.., K/2, NR, 2] on x86 without VNNI), and
to bf16 PackedMatMul / blocked PackedConv (graph/passes/precision.py: pairs, [.., K/2, NR, 2]), whose A operand can
be read in place — contiguous along the innermost reduction axis, the other reduction axes at constant strides
(schedule/amx.py `in_place`: a GEMM's rows; a blocked conv's pixels, whose taps and channel blocks become the
kernel's steps). No A packing: the activations are read where they are, as the direct tile reads them.
Rows (schedule/amx.py `Rows`): a GEMM's m; a stride-1 conv's pixels q = oh·Wp + ow over the padded input row Wp
(the Wp − OW virtual pixels per output row computed and dropped) when that wastes ≤ 1/8 of the rows, else the
output row's ow alone (oh then an outer axis).

    before (schedule/int8.py, direct):  the MR×NR register tile of vpdpbusd, the epilogue on its accumulators
    after:
      parallel for w < n_o · ⌈M/MR⌉ · P:               # panels fastest when all of B fits half of L2 (A tile reused)
        (o, t, j) = decode(w)
        alloc Ct[MR, NR] int32
        call kiln_ukr_<method>_<ab>_<MR>x<NR>(&A[o, row t·MR], lda, min(MR, M − t·MR), &Bp[panel j], Ct, NR,
                                             n2, sa2, n1, sa1, n0, sa0, K4)      # the whole reduction, one call
        for ni < min(NR, N − j·NR) vector<NR> masked:
          for r < MR unroll:  if t·MR + r < M [and row is an output]:  out[o, row, j·NR + ni] = epi(Ct[r, ni] [+ tail])

A GEMM whose K is not a multiple of the group (4 bytes, a bf16 pair) gives the kernel the whole groups and adds the
last products in the epilogue (`tail`). Where none of this applies — no microkernel for the target
(kiln/ukernels/dot.py `method_for`), an A that is not a plain load contiguous along K, more than three outer
reduction axes — `plan` says why, and the anchor is emitted directly (exe.meta["strategies"]
records "direct (…why…)")."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from kiln.kernel.ir import (
    Addr,
    Alloc,
    Call,
    Cast,
    Compute,
    Const,
    Expr,
    Kernel,
    Load,
    Loop,
    Reduce,
    Stmt,
    Var,
    minimum,
    substitute,
    walk,
)
from kiln.schedule.amx import Rows, block_epilogue, decode_flat, in_place, vnni_panels
from kiln.schedule.config import Decisions
from kiln.schedule.dot_form import DotForm
from kiln.schedule.tile_shape import pick_mr
from kiln.schedule.ukernel import merge_channel_blocks
from kiln.target import Target
from kiln.ukernels.dot import BLOCKS, METHODS, dot_ukernel, method_for, operands_of

MAX_VIRTUAL_ROWS = 1 / 8  # the share of computed-and-dropped pixels a conv's q rows may have (else rows = ow)


def _i(v: int) -> Const:
    return Const(int(v), "int64")


@dataclass(frozen=True)
class Plan:
    c: Compute        # the compute as the nest sees it (a blocked output's channel blocks merged)
    red: Reduce
    rows: Rows
    method: str
    ab: str           # u8s8 | s8s8 | u8s16 | s8s16 (int16 weights) | bf16
    nr: int
    b: Load
    b_base: Expr
    kp: int           # the panel's padded K
    k4: int           # 4-byte groups per kernel step
    tail: int         # K % group values left to the epilogue (a one-axis GEMM)
    acc: str          # the C tile's type: int32 | float32


def plan(k: Kernel, c: Compute, form: DotForm | None, target: Target) -> tuple[Plan | None, str]:
    """(what the microkernel nest needs, "") or (None, why it does not apply), for the compute whose dot-product form
    (schedule/dot_form.py: int8_form, bf16_form) is `form`. No side effects."""
    # (an explicit store of one flat index — a batched GEMM's rows merged, analysis.fuse_row_axes — is stored
    # through c.store_index like the axes)
    if form is None or (c.store is not None and len(c.store) != 1) or "nr" not in c.hints:
        return None, "not a dot-product anchor with weight panels"
    nr, g = int(c.hints["nr"]), form.group
    method, why = method_for(target, form.a.dtype, nr)
    if method is None:
        return None, why
    spatial = tuple(c.axes[a % len(c.axes)] for a in c.hints.get("spatial", ()))
    if c.hints.get("out_block"):
        c = merge_channel_blocks(c)
    elif (c.hints.get("n_axis", -1) % len(c.axes)) != len(c.axes) - 1:
        return None, "the output is not contiguous along the panel's columns"
    red = next(e for e in walk(c.body) if isinstance(e, Reduce))
    x, y = red.body.a, red.body.b
    a, b = (x.a, y.a) if isinstance(x, Cast) else (x, y)  # i32(A) · i32(B) (8-bit), or A · B (bf16)
    K = int(np.prod([e for _, e in red.axes]))
    panels = vnni_panels(k, b, red, c.axes[-1], nr, K, group=g)
    if panels is None:
        return None, "the weights are not in VNNI panels in the reduction's order"
    (r_last, e_last) = red.axes[-1]
    tail = e_last % g if len(red.axes) == 1 else 0
    if e_last % g and not tail or e_last < g:
        return None, f"a reduction of {e_last} values per step (the kernel takes groups of {g})"
    bf16 = a.dtype == "bfloat16"
    rows = _rows(k, c, a, Reduce(red.op, red.axes[:-1] + ((r_last, e_last - tail),), red.body), spatial,
                 2 if bf16 else 1)
    if rows is None or len(rows.steps) > 3:
        return None, "A is not read in place (not contiguous along K, or more than three outer reduction axes)"
    ab = "bf16" if bf16 else ("u8" if a.dtype == "uint8" else "s8") + ("s8" if b.dtype == "int8" else "s16")
    if ab not in operands_of(method):
        return None, f"no {method} microkernel for {ab} operands"
    return Plan(c, red, rows, method, ab, nr, b, panels[0], panels[1], (e_last - tail) // g, tail,
                "float32" if bf16 else "int32"), ""


def chosen_dot_ukernel(k: Kernel, c: Compute, form: DotForm | None, strategy: str, tag: str, target: Target,
                       threads: int, dec: Decisions | None = None) -> tuple[list[Stmt] | None, str]:
    """An integer or bf16 anchor's microkernel nest under `ukernel` — and under `direct` where the tuner's knob
    `strategy` picks it —, else (None, why a requested microkernel does not apply, or "")."""
    if strategy not in ("direct", "ukernel"):
        return None, ""
    ukr, why = plan(k, c, form, target)
    if ukr is not None and strategy == "direct":
        strategy = str((dec if dec is not None else Decisions()).knob("strategy", "direct", ("direct", "ukernel")))
    if ukr is not None and strategy == "ukernel":
        return schedule_dot_ukernel(k, ukr, tag, target, threads, dec), ""
    return None, why if strategy == "ukernel" else ""


def schedule_dot_ukernel(k: Kernel, p: Plan, tag: str, target: Target, threads: int,
                         dec: Decisions | None = None) -> list[Stmt]:
    """The microkernel nest of an integer or bf16 anchor from its plan (`plan`). Knob: `ukr_mr`, the kernel's rows
    (even for SMMLA's / BFMMLA's row pairs)."""
    dec = dec if dec is not None else Decisions()
    main_mr = METHODS[p.method][1]
    mr = int(dec.knob("ukr_mr", pick_mr(p.rows.M, main_mr), range(1, min(p.rows.M, main_mr) + 1)))
    if p.method in BLOCKS and mr % 2:
        mr = mr + 1 if mr < main_mr else mr - 1
    uk = dot_ukernel(p.method, p.ab, mr, p.nr)
    k.extern_ir[uk.name] = uk.ir_text
    return _nest(k, p, uk.name, mr, tag, target, threads)


def _rows(k: Kernel, c: Compute, a: Load, red: Reduce, spatial: tuple[Var, ...], size: int) -> Rows | None:
    e_last = red.axes[-1][1]
    if spatial and all(v in c.axes for v in spatial):
        oh, ow = spatial
        rows = in_place(k, c, a, red, spatial, size=size, kb=e_last)
        pixels = c.extents[c.axes.index(oh)] * c.extents[c.axes.index(ow)]
        if rows is not None and rows.M <= pixels * (1 + MAX_VIRTUAL_ROWS):
            return rows
        return in_place(k, c, a, red, (ow,), size=size, kb=e_last)
    m_v = c.axes[c.hints["m_axis"] % len(c.axes)]
    return in_place(k, c, a, red, (m_v,), size=size, kb=e_last)


def _tail(p: Plan) -> Callable[[dict[Expr, Expr]], Expr] | None:
    """The last K % 4 products of a one-axis GEMM at the epilogue's row and column (mapping)."""
    if not p.tail:
        return None
    r_last, e_last = p.red.axes[-1]

    def tail(mapping: dict[Expr, Expr]) -> Expr:
        terms = [substitute(p.red.body, {r_last: _i(e_last - p.tail + q), **mapping}) for q in range(p.tail)]
        out = terms[0]
        for t in terms[1:]:
            out = out + t
        return out
    return tail


def _nest(k: Kernel, p: Plan, kernel: str, mr: int, tag: str, target: Target, threads: int) -> list[Stmt]:
    c, rows, nr = p.c, p.rows, p.nr
    M, N = rows.M, c.extents[-1]
    others = [(v, e) for v, e in zip(c.axes[:-1], c.extents[:-1]) if v not in rows.axes]
    n_o = int(np.prod([e for _, e in others])) if others else 1
    n_tiles, P = -(-M // mr), -(-N // nr)
    items = n_o * n_tiles * P
    # panels fastest (the A tile stays in L1 for all of them) when every panel fits half of L2 beside it
    panel_fastest = P * p.kp * nr <= target.l2_bytes // 2
    w = Var(f"iw{tag}")
    if panel_fastest:
        j, ot = w % P, w // P
    else:
        j, ot = w // (n_o * n_tiles), w % (n_o * n_tiles)
    o, t = ot // n_tiles, ot % n_tiles
    o_of = decode_flat(others, o)
    q0 = t * mr
    n2, n1, n0 = [(1, 0)] * (3 - len(rows.steps)) + rows.steps
    ct = f"Ci{tag}"
    left: Expr = minimum(_i(mr), _i(M) - q0) if M % mr else _i(mr)
    a_at = Addr(rows.a_buf, (substitute(rows.a_flat, {Var("q"): q0, **o_of}),))
    b_at = Addr(p.b.buf, (substitute(p.b_base, o_of) + j * (p.kp * nr),))
    call = Call(kernel, (a_at, _i(rows.lda), left, b_at, Addr(ct, (_i(0),)), _i(nr), _i(n2[0]), _i(n2[1]),
                         _i(n1[0]), _i(n1[1]), _i(n0[0]), _i(n0[1]), _i(p.k4)))
    epi = block_epilogue(c, p.red, ct, p.acc, rows, q0, mr, o_of, j, nr, tag, M if M % mr else None, _tail(p))
    kind = "parallel" if threads > 1 and items > 1 else "serial"
    return [Loop(w, _i(items), [Alloc(ct, p.acc, (mr, nr)), call, epi], kind)]
