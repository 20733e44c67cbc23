"""The integer anchors' register tile (direct emission): MR × NR int32 accumulators fed by 8-bit dot products.

For a QPackedMatMul / dense QPackedConv (kernel/lower_quant.py) whose reduction body is
i32(A(m, r)) · i32(B(n, r)) with B in the VNNI layout (its last reduction axis r_last split as r_last // 4 and
r_last % 4, graph/quant_pack.py), the nest is tile.py's register tile with the innermost reduction axis taken
4 at a time:

    before:  out[.., m, n] = epilogue(Σ_{r…, k} i32(A(m, r…, k)) · i32(Bp[.., k // 4, n, k % 4]))
    after:
      parallel for (others, no, mo):                     # mo fastest: consecutive tiles share the weight panel
        for ni in 0..NR vector<NR> masked:               # NR/16 zmm accumulators per row (AVX-512)
          local $acc[MR]: int32 = 0
          for r…: for k4 in 0..K/4 (unrolled when short: a blocked conv's channel block):
            for mi in 0..MR unroll:
              $acc[mi] = dot4($acc[mi], A(m = mo·MR + mi, k = 4·k4), Bp[.., k4, ni, 0])   # one vpdpbusd per zmm
          for q in 0..K % 4:  $acc[mi] += i32(A(m, 4·(K/4) + q)) · i32(Bp[.., K/4, ni, q])     # K not a multiple of 4
          for mi in 0..MR unroll: [if m < M:] out[.., m, n] = epilogue($acc[mi])         # requantize in registers

Rows (MR) and lanes (NR) as the float tile (tile_shape.pick_mr; tile.flatten_rows for convs with short rows);
edge rows clamp their reads and guard their stores; the epilogue (int32 → float, scale, bias, activation,
round, clamp, narrowing store) runs on the accumulators while they are in registers.

AMX: on a host whose process may use AMX (kiln/runtime/amx.py; switch `amx`), an integer anchor runs on the AMX
int8 tile kernels instead (schedule/amx.py: tdpbusd / tdpbssd, the epilogue on the int32 C block), whatever its
strategy, as bf16 anchors do; exe.meta["precision"] says "amx" for it.

Strategies: `ukernel` builds the anchor on the 8-bit microkernels instead (schedule/dot_ukernel.py: the same
reduction in a hand-written kernel, the epilogue on the int32 tile it stores); `library` builds a GEMM, and a conv
through im2col, on the library's integer GEMM where it has one (schedule/library.py; those anchors stay unpacked and
NCHW); under a library without one the anchor is built here and exe.meta["strategies"] says
"direct (<strategy> not available: why)". Under `direct` the tuner's knob `strategy` may pick the microkernel.
On an SVE/SME target the tile is the NEON one (a fixed-width loop of the scalable build: codegen/scalable.py
loop_is_scalable); on RVV the anchors keep the plain integer loops. Returns None (the default schedule then runs the
plain integer loops) where the form does not match."""
from __future__ import annotations

from collections.abc import Callable

import numpy as np

from kiln.codegen.mmla import mmla_method
from kiln.kernel.analysis import simplify_panels
from kiln.kernel.ir import (
    Assign,
    Bin,
    Compute,
    Const,
    Expr,
    If,
    Kernel,
    Local,
    LocalRef,
    Loop,
    Stmt,
    Store,
    Var,
    cmp,
    minimum,
    substitute,
)
from kiln.schedule.amx import schedule_amx
from kiln.schedule.config import Decisions
from kiln.schedule.dot_form import DotForm, int8_form
from kiln.schedule.dot_ukernel import chosen_dot_ukernel
from kiln.schedule.mmla import mmla_rows, mmla_tile, most_mmla_rows
from kiln.schedule.tile import (
    decode_flat,
    flatten_rows,
    image_thread_parts,
    rejoin_parts,
    rename_tile,
    substitute_all,
)
from kiln.schedule.tile_shape import pick_mr
from kiln.target import Target

UNROLL_DOTS = 256  # a blocked conv's k-groups unrolled while the tile does at most this many dot products per step


def choose_dot_tile(c: Compute, target: Target, dec: Decisions | None = None, pairs: bool = False
                    ) -> tuple[int, bool]:
    """(MR, flatten_rows): rows as the float tile's — the registers left beside MR·NR/lanes accumulators and the
    NR/lanes weight vectors of a step (AVX-512 NR = 32: 14 rows; AVX2 NR = 16: 6); with `pairs` (the 2×2-block
    tile, schedule/mmla.py) an even count, beside the row pairs and zipped column pairs. Knobs (schedule/config.py):
    `flat_rows` (a conv's output rows merged into one pixel axis, where it has several) and `mr` (1 … the most rows
    the registers hold; even ones with pairs); the heuristic picks the one of the two row counts that wastes least,
    default."""
    dec = dec if dec is not None else Decisions()
    lanes, regs = target.lanes(32), target.vector_registers
    nvec = max(1, c.hints["nr"] // lanes)
    most = most_mmla_rows(c.hints["nr"], lanes, regs) if pairs else max(1, (regs - nvec - 2) // nvec)
    pick = (lambda m, most_: mmla_rows(m, most_, pick_mr)) if pairs else pick_mr
    m_axis = c.hints["m_axis"] % len(c.axes)
    mr = pick(c.extents[m_axis], most)
    spatial = tuple(a % len(c.axes) for a in c.hints.get("spatial", ()))
    flat, rows = False, c.extents[m_axis]
    if spatial and m_axis == spatial[1] and c.extents[spatial[0]] > 1:
        pixels = c.extents[spatial[0]] * c.extents[spatial[1]]
        flat_mr = pick(pixels, most)
        flat = bool(dec.knob("flat_rows", flat_mr > mr, (False, True)))
        if flat:
            mr, rows = flat_mr, pixels
    first = 2 if pairs else 1
    mr = int(dec.knob("mr", mr, range(first, max(first, min(most, rows)) + 1, first)))
    return mr, flat


def schedule_int8(k: Kernel, c: Compute, tag: str, target: Target, threads: int,
                  options: dict[str, bool], dec: Decisions | None = None) -> list[Stmt] | None:
    """The loop nest of an integer anchor by its strategy, or None (the default schedule then builds it)."""
    form = int8_form(c)
    if form is None or not target.fixed_dot_tiles:  # (SVE: the NEON tile, a fixed-width loop)
        return None
    node = c.hints.get("node", c.out)
    if not (options.get("register_tile", True) and options.get("vectorize", True)):
        return None
    threads = threads if options.get("parallel", True) else 1
    strategy = str(c.hints.get("strategy", "direct"))
    why = ""
    if strategy.startswith("library"):  # (an anchor whose library has an integer GEMM never gets here)
        why = (f"no integer GEMM for {form.a.dtype} activations in {strategy} (library:onednn has u8 and "
               "s8, library:mkl u8)")
    # AMX tiles (tdpbusd) where the host has them — on weights in bytes (int16 pairs: a target without VNNI)
    nest = schedule_amx(k, c, tag, target, threads, options, dec) if form.group == 4 else None
    if nest is not None:
        k.precision[node] = "amx"
        k.strategies.setdefault(node, f"direct ({strategy} not available: {why})" if why else strategy)
        return nest
    if strategy in ("direct", "ukernel"):  # under direct the tuner may pick the microkernel
        nest, why = chosen_dot_ukernel(k, c, form, strategy, tag, target, threads, dec)
        if nest is not None:
            k.strategies[node] = "ukernel"
            return nest
    k.strategies[node] = f"direct ({strategy} not available: {why})" if why else "direct"
    nest, block = dot_tile(c, tag, target, threads, int8_form, dec, options.get("mmla", True),
                           options.get("thread_parts", True))
    if block:
        k.precision[node] = block
    return nest


def dot_tile(c: Compute, tag: str, target: Target, threads: int, form_of: Callable[[Compute], DotForm | None],
             dec: Decisions | None = None, mmla: bool = True, parts: bool = True) -> tuple[list[Stmt], str | None]:
    """The register tile of the module docstring, for any dot-product form (`form_of`: int8_form, bf16_form), and
    the block instruction it runs on ("smmla" / "bfmmla": schedule/mmla.py, where the target has one, the switch
    `mmla` is on and the tile has two rows) or None. Knobs: `mmla` (the block tile or the dot-product one), `flat_rows`
    and `mr` (choose_dot_tile); `tile_order` — "rows" (consecutive work items share a weight panel: the default) or
    "panels" (they share the A rows). `parts` (switch `thread_parts`): the image's rows split into one part per
    thread, outermost, as the float tile splits them (schedule/tile.py `image_thread_parts`), so that each thread reads
    the rows it wrote in the layer before — not every row, half of them from the other core's cache, as a split by
    output-channel blocks did: on a host that puts the two vCPUs on two L3s (Zen 4, README 17th session)
    mobilenetv2 int8 1.638 → 1.410 ms, resnet50 bf16 22.78 → 21.41; on one L3 unchanged."""
    dec = dec if dec is not None else Decisions()
    method = mmla_method(target, form_of(c).a.dtype) if mmla else None  # type: ignore[union-attr]
    rows_or_pixels = c.extents[c.hints["m_axis"] % len(c.axes)] * \
        int(np.prod([c.extents[a % len(c.axes)] for a in c.hints.get("spatial", ())[:1]]))
    pairs = method is not None and c.hints["nr"] % 4 == 0 and rows_or_pixels >= 2 and \
        bool(dec.knob("mmla", True, (False, True)))
    mr, flat = choose_dot_tile(c, target, dec, pairs)
    rows_fastest = dec.knob("tile_order", "rows", ("rows", "panels")) == "rows"
    if flat:
        c = flatten_rows(c)
    form = form_of(c)
    assert form is not None
    G = form.group
    acc_dtype = form.red.dtype
    nr = c.hints["nr"]
    m_axis, n_axis = c.hints["m_axis"] % len(c.axes), c.hints["n_axis"] % len(c.axes)
    m_v, n_v = c.axes[m_axis], c.axes[n_axis]
    M, N = c.extents[m_axis], c.extents[n_axis]
    mo, no, mi, ni = Var(f"{m_v.name}o"), Var(f"{n_v.name}o"), Var(f"{m_v.name}i"), Var(f"{n_v.name}i")
    k, K = form.k, form.k_ext
    k4 = Var(f"{k.name}{G}")
    K4, tail = K // G, K % G
    lanes = max(1, nr // target.lanes(32))
    others = [(v, e) for i, (v, e) in enumerate(zip(c.axes, c.extents)) if i not in (m_axis, n_axis)]
    n_mo, n_no = -(-M // mr), -(-N // nr)
    order = [(no, n_no), (mo, n_mo)] if rows_fastest else [(mo, n_mo), (no, n_no)]
    names, extents = [v for v, _ in others + order], [e for _, e in others + order]
    names, extents, parted = image_thread_parts(c, names, extents, mo, threads if parts else 1, False)
    total = int(np.prod(extents))
    flat_v = Var(f"tile{tag}")
    decode = rejoin_parts(decode_flat(flat_v, names, extents), parted)
    m_expr, n_expr = mo * mr + mi, no * nr + ni
    n_ext = minimum(Const(nr, "int64"), Const(N, "int64") - no * nr) if N % nr else Const(nr, "int64")
    acc = f"acc{tag}"
    four = Const(G, "int64")

    def at(e: Expr, kk: Expr, edge: bool) -> Expr:
        """e at row m, lane n, reduction index kk (the k-group arithmetic of B folded)."""
        m_read = minimum(m_expr, Const(M - 1, "int64")) if edge else m_expr
        grouped = {Bin("//", k, four): kk // G if not isinstance(kk, Bin) or kk.op != "*" else kk.a,
                   Bin("%", k, four): Const(0, "int64") if isinstance(kk, Bin) and kk.op == "*" else kk % G}
        e = substitute(e, grouped)
        return simplify_panels(substitute(e, {k: kk, m_v: m_read, n_v: n_expr}), ni, nr)

    def tile(edge: bool) -> Loop:
        ref = LocalRef(acc, acc_dtype, mi)
        dot = form.dot(ref, at(form.a, k4 * four, edge), at(form.b, k4 * four, edge))
        step: Stmt = Loop(mi, Const(mr, "int64"), [Assign(acc, dot, mi)], "unroll")
        unroll = K4 * mr * lanes <= UNROLL_DOTS and len(form.red.axes) > 1
        update: list[Stmt] = [Loop(k4, Const(K4, "int64"), [step], "unroll" if unroll else "serial")] if K4 else []
        for q in range(tail):  # K not a multiple of the group: the last group's products one at a time
            kk = Const(G * K4 + q, "int64")
            term = at(form.red.body, kk, edge)
            update.append(Loop(mi, Const(mr, "int64"), [Assign(acc, ref + term, mi)], "unroll"))
        for v, e in reversed(form.red.axes[:-1]):
            update = [Loop(v, Const(e, "int64"), update)]
        out_idx = substitute_all(c.store_index, {m_v: m_expr, n_v: n_expr})
        store: Stmt = Store(c.out, out_idx, substitute(c.body, {form.red: ref, m_v: m_expr, n_v: n_expr}))
        if edge:
            store = If(cmp("<", m_expr, Const(M, "int64")), [store])
        return Loop(ni, n_ext, [Local(acc, acc_dtype, Const(0, acc_dtype), mr), *update,
                                Loop(mi, Const(mr, "int64"), [store], "unroll")], "vector", nr, masked=True)

    def block_tile(edge: bool) -> Loop:
        """The 2×2-block tile (SMMLA / BFMMLA, schedule/mmla.py): the same loops around another step and epilogue."""
        unroll = K4 * mr * lanes <= UNROLL_DOTS and len(form.red.axes) > 1
        inner = mmla_tile(c, form, m_v, n_v, lambda r: mo * mr + r, n_expr, ni, M, mr, nr, acc, unroll, edge)
        return Loop(ni, n_ext, inner, "vector", nr, masked=True)

    if pairs:
        tile = block_tile
    body: list[Stmt] = [tile(False)]
    if M % mr:
        body = [If(cmp("<=", mo * mr + mr, Const(M, "int64")), body, [tile(True)])]
    kind = "parallel" if threads > 1 and total > 1 else "serial"
    return [Loop(flat_v, Const(total, "int64"), rename_tile(body, decode), kind)], method if pairs else None
