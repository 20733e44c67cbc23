"""SME outer-product GEMM tiles (target `aarch64-sme`): the register tile of kiln/schedule/tile.py accumulated
in the ZA array with `fmopa` instead of in vector registers with `fmla`.

The tile loop tile.py emits (and scalable.py would strip-mine over n)

    for ni in 0..n_ext vector<NR>:
      local $acc[MR] = 0
      for r…: for mi in 0..MR unroll: $acc[mi] += f(mi, r) * g(ni, r)     # f: A column, g: B row
      for mi in 0..MR unroll: epilogue($acc[mi])

becomes, in an outlined function that runs in streaming mode and owns ZA (`aarch64_pstate_sm_body`,
`aarch64_new_za`: LLVM emits smstart/smstop around it; the caller passes pointers and loop indices in a context
array),

    for (i = lo; i < hi; i += evl) {                           // evl ≤ SVL/32 columns per strip
      zero ZA
      for r…:
        zm = g(i + stepvector, r)                              // one B row strip (vp.load)
        colbuf[0..MR) = f(0..MR, r)                           // the A column, MR scalar loads
        for group q in 0..⌈MR/4⌉: fmopa ZA_q += colbuf[q·SVL_s ..] ⊗ zm   (row and column predicates)
      $acc[mi] = row mi of ZA (read.horiz from the tile holding it)     // then the ordinary epilogue
    }

Rows of a group past MR are predicated off, so the same code runs at any streaming vector length (qemu: SVL
128–2048); ZA.S has 4 tiles of SVL_s rows, so MR ≤ 16 (at the 128-bit minimum a tile is 4×4). Tiles whose
factors need a gather (illegal in streaming mode) or whose body is not a product of an n-free and an m-free
factor stay on the SVE path. The A column goes through a small stack buffer because it is strided in A
(a packed A would allow one contiguous load: not done)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from llvmlite import ir

from kiln.codegen.access import F32, I1, I32, I64, PTR
from kiln.codegen.loops import NestEmitter
from kiln.codegen.scalable import ScalableCtx, ScalableExprEmitter, ScalableVectorType, _retyping, strip_mined
from kiln.kernel.analysis import coef, flat_index
from kiln.kernel.ir import Assign, Bin, Const, Expr, Load, Local, LocalRef, Loop, Stmt, Store, Var, walk

if TYPE_CHECKING:
    from kiln.target import Target

ZA_TILES_S = 4     # ZA0.S–ZA3.S
MIN_ROWS = 4       # rows of one ZA.S tile at the minimum streaming vector length (128 bits)
SM_ATTRS = ('"aarch64_pstate_sm_body"', '"aarch64_new_za"')


def has_sme(target: Target) -> bool:
    return target.arch == "aarch64" and "+sme" in target.features.split(",")


@dataclass
class SmeTile:
    local: Local
    reduction: list[Loop]  # the reduction loops around the update, outermost first
    mi: Var
    column: Expr           # f(mi, r): varies with mi, not with ni
    row: Expr              # g(ni, r): varies with ni, not with mi
    epilogue: list[Stmt]


def _vars(e: Expr) -> set[Var]:
    return {x for x in walk(e) if isinstance(x, Var)}


def _unit_or_uniform(e: Expr, v: Var, shape_of) -> bool:  # noqa: ANN001
    """Every load in e reads contiguously (or uniformly) along v: no gather, which streaming mode lacks."""
    for x in walk(e):
        if isinstance(x, Load) and coef(flat_index(x.index, shape_of(x.buf)), v) not in (0, 1):
            return False
    return True


def match_sme_tile(s: Loop, shape_of) -> SmeTile | None:  # noqa: ANN001
    """The register-tile pattern of the module docstring, or None. `shape_of(buf)` gives a buffer's shape."""
    if s.kind != "vector" or len(s.body) != 3:
        return None
    local, update, epilogue = s.body
    if not isinstance(local, Local) or local.dtype != "float32" or local.init != Const(0.0, "float32") \
            or not 1 < local.count <= ZA_TILES_S * MIN_ROWS or not isinstance(update, Loop):
        return None
    chain, cur = [], update
    while isinstance(cur, Loop) and cur.kind == "serial" and len(cur.body) == 1:
        chain.append(cur)
        cur = cur.body[0]
    if not (isinstance(cur, Loop) and cur.kind == "unroll" and cur.extent == Const(local.count, "int64")
            and len(cur.body) == 1 and isinstance(cur.body[0], Assign)):
        return None
    mi, upd = cur.var, cur.body[0]
    if upd.name != local.name or upd.slot != mi or not isinstance(upd.value, Bin) or upd.value.op != "+" \
            or upd.value.a != LocalRef(local.name, "float32", mi) or not isinstance(upd.value.b, Bin) \
            or upd.value.b.op != "*":
        return None
    a, b = upd.value.b.a, upd.value.b.b
    ni = s.var
    for col, row in ((a, b), (b, a)):
        if ni not in _vars(col) and mi not in _vars(row):
            break
    else:
        return None
    if not _unit_or_uniform(row, ni, shape_of) or any(isinstance(x, LocalRef) for x in walk(col) + walk(row)):
        return None
    for st in _stores(epilogue):
        if coef(flat_index(st.index, shape_of(st.buf)), ni) not in (1,) or not _unit_or_uniform(st.value, ni, shape_of):
            return None
    if not isinstance(epilogue, Loop) or epilogue.var != mi:
        return None
    return SmeTile(local, chain, mi, col, row, [epilogue])


def _stores(s: Stmt) -> list[Store]:
    if isinstance(s, Store):
        return [s]
    out: list[Store] = []
    for attr in ("body", "orelse"):
        for x in getattr(s, attr, None) or []:
            out += _stores(x)
    return out


def emit_sme_tile(ke: NestEmitter, b: ir.IRBuilder, em: ScalableExprEmitter, s: Loop, tile: SmeTile,
                  lo: ir.Value, hi: ir.Value) -> None:
    """Outline the tile loop into a streaming, ZA-owning function and call it with a context array."""

    names = list(em.buffers)
    env = [k for k, v in em.env.items() if isinstance(v.type, ir.IntType) and v.type.width == 64]
    fn = ir.Function(ke.m, ir.FunctionType(ir.VoidType(), [PTR]), f"{ke.name}.sme{ke.n_par}")
    ke.n_par += 1
    fn.linkage = "internal"
    fn.attributes.add("noinline")
    for attr in SM_ATTRS:
        set.add(fn.attributes, attr)  # string attributes llvmlite does not know: bypass its name check
    # caller: [buffers…, env…, lo, hi] as i64
    n_ctx = len(names) + len(env) + 2
    arr = ke.entry_alloca(b, ir.ArrayType(I64, n_ctx))
    vals = [b.ptrtoint(em.buffers[n][0], I64) for n in names] + [em.env[k] for k in env] + [lo, hi]
    for k, v in enumerate(vals):
        b.store(v, b.gep(arr, [ir.Constant(I32, 0), ir.Constant(I32, k)]))
    b.call(fn, [arr])

    fb = ir.IRBuilder(fn.append_basic_block("entry"))
    ctx = fn.args[0]

    def ctx_at(k: int) -> ir.Value:
        return fb.load(fb.gep(ctx, [ir.Constant(I32, 0), ir.Constant(I32, k)], source_etype=ir.ArrayType(I64, n_ctx)),
                       typ=I64)
    buffers = {n: (fb.inttoptr(ctx_at(k), PTR), em.buffers[n][1], em.buffers[n][2]) for k, n in enumerate(names)}
    sem = ScalableExprEmitter(fb, ke.m, buffers, {})
    sem.env = {k: ctx_at(len(names) + j) for j, k in enumerate(env)}
    _emit_body(ke, fb, sem, s, tile, ctx_at(n_ctx - 2), ctx_at(n_ctx - 1))
    fb.ret_void()


def _emit_body(ke: NestEmitter, b: ir.IRBuilder, em: ScalableExprEmitter, s: Loop, tile: SmeTile,
               lo: ir.Value, hi: ir.Value) -> None:

    n, mr = 4, tile.local.count  # <vscale x 4 x float>: one streaming vector (SVL/32 lanes)
    vt, mt = ScalableVectorType(F32, n), ScalableVectorType(I1, n)
    groups = -(-mr // MIN_ROWS)
    decl = em._decl
    lane_mask = decl("llvm.get.active.lane.mask.nxv4i1.i64", mt, [I64, I64])
    zero_za = decl("llvm.aarch64.sme.zero", ir.VoidType(), [I32])
    mopa = decl("llvm.aarch64.sme.mopa.nxv4f32", ir.VoidType(), [I32, mt, mt, vt, vt])
    read = decl("llvm.aarch64.sme.read.horiz.nxv4f32", vt, [vt, mt, I32, I32])
    mload = decl("llvm.masked.load.nxv4f32.p0", vt, [PTR, I32, mt, vt])
    colbuf = ke.entry_alloca(b, ir.ArrayType(F32, mr))
    svl = b.mul(b.call(decl("llvm.vscale.i64", I64, []), []), ir.Constant(I64, n))  # rows of one ZA.S tile
    accs = [ke.entry_alloca(b, vt) for _ in range(mr)]

    def strip_body(i: ir.Value, evl: ir.Value) -> None:
        cols = b.call(lane_mask, [ir.Constant(I64, 0), b.zext(evl, I64)])
        b.call(zero_za, [ir.Constant(I32, 255)])
        strip = ScalableCtx(s.var, n, i, evl=evl)

        def step() -> None:
            """One rank-1 update of every ZA tile in use."""
            with _retyping(b):
                em.vec = strip
                zm, is_vec = em.ev(tile.row)
                zm = zm if is_vec else em.splat(zm)
                em.vec = None
            for m in range(mr):
                em.env[tile.mi.name] = ir.Constant(I64, m)
                b.store(em.ev(tile.column)[0], b.gep(colbuf, [ir.Constant(I32, 0), ir.Constant(I32, m)]))
            for q in range(groups):
                first = b.mul(svl, ir.Constant(I64, q))
                rows = b.call(lane_mask, [first, ir.Constant(I64, mr)])
                p = b.gep(colbuf, [ir.Constant(I32, 0), first])
                zn = b.call(mload, [p, ir.Constant(I32, 4), rows, ir.Constant(vt, None)])
                b.call(mopa, [ir.Constant(I32, q), rows, cols, zn, zm])

        def nest(loops: list[Loop]) -> None:
            if not loops:
                step()
                return
            lp = loops[0]

            def inner(v: ir.Value) -> None:
                em.env[lp.var.name] = v
                nest(loops[1:])
            ke.counted(b, ir.Constant(I64, 0), em.ev(lp.extent)[0], 1, inner)
        nest(tile.reduction)
        # rows of ZA into the accumulators: row m is in tile m // svl, slice m % svl (svl is only known at run time).
        # Tile 0's slice m is given as m + svl (slice numbers are taken mod svl): a constant slice 0–3 made LLVM 22
        # select the zero register as the slice base (`za0h.s[#0, 1]`, only w12–w15 encode; llvm-project #203295)
        # and its object emitter abort the process — every GEMM tile over run-time rows (gpt_decoder) did
        for m in range(mr):
            row = None
            for q in range(groups):
                first = b.mul(svl, ir.Constant(I64, q))
                sl = b.trunc(b.add(ir.Constant(I64, m), svl) if q == 0 else b.sub(ir.Constant(I64, m), first), I32)
                val = b.call(read, [ir.Constant(vt, None), cols, ir.Constant(I32, q), sl])
                row = val if row is None else b.select(b.icmp_signed(">=", ir.Constant(I64, m), first), val, row)
            b.store(row, accs[m])
        em.locals[tile.local.name] = (accs, True)
        with _retyping(b):
            em.vec = strip
            try:
                ke.stmts(b, em, tile.epilogue)
            finally:
                em.vec = None
    strip_mined(b, em, lo, hi, n, strip_body)
