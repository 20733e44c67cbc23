"""Transposed access groups: an unrolled loop of R stores (and the loads they read) inside a fixed-width vector
loop over v, where consecutive unrolled iterations touch consecutive elements and consecutive lanes are S ≥ R
elements apart:

    for v in 0..n vector<n>:                 # lanes: v, lane stride S
      for r in 0..R unroll:                  # address stride 1
        dst[… + v·S + r] = f(src[… + v·S' + r], …)

Lane by lane that is a scatter (and a gather per such load). Across the R iterations each lane owns R
contiguous elements, so the R vectors are transposed in registers instead (log2 W butterfly stages of
two-source shuffles per block of W lanes): then
  * S = R (the row-tile pack of a GEMM, Ap[k, r] = A[r, k]): the block is contiguous — R full-width stores;
  * S > R (an NCHW conv whose tile is R pixels of a row × n output channels): lane c's R elements are one
    short contiguous run — one store (masked to R elements) per lane, and the loads likewise.
LLVM's own interleaved-access vectorization does the first for small factors; measured here the gather-based
pack of gemm_1024 cost 1.0 ms at 1 thread, the transposed one 0.18."""
from __future__ import annotations

from llvmlite import ir

from kiln.codegen.access import I32, I64, MEMORY, PTR, elem_bytes, prefix_store
from kiln.codegen.exprs import ExprEmitter
from kiln.codegen.int8 import join_lanes, lane_slice
from kiln.kernel.analysis import coef, flat_index
from kiln.kernel.ir import Bin, Const, Expr, If, Load, Loop, Store, uses_var, walk
from kiln.target import features_on

I1 = ir.IntType(1)
BLOCK = 16  # lanes per transposed block: one AVX-512 register of f32


def butterfly(b: ir.IRBuilder, rows: list[ir.Value], w: int) -> list[ir.Value]:
    """Transpose a w×w block given as ≤ w row vectors of w lanes (missing rows are poison): each stage swaps the
    off-diagonal d×d blocks of every 2d×2d block, d = w/2 … 1. Returns w rows; row c = the old column c."""
    vt = rows[0].type
    poison = ir.Constant(vt, ir.Undefined)
    rows = list(rows) + [poison] * (w - len(rows))
    d = w // 2
    while d >= 1:
        lo = ir.Constant(ir.VectorType(I32, w), [k if not k & d else w + k - d for k in range(w)])
        hi = ir.Constant(ir.VectorType(I32, w), [k + d if not k & d else w + k for k in range(w)])
        nxt = list(rows)
        for i in range(w):
            if not i & d and not (rows[i] is poison and rows[i + d] is poison):
                nxt[i] = b.shuffle_vector(rows[i], rows[i + d], lo)
                nxt[i + d] = b.shuffle_vector(rows[i], rows[i + d], hi)
        rows, d = nxt, d // 2
    return rows


def interleave(b: ir.IRBuilder, vals: list[ir.Value], n: int) -> list[ir.Value]:
    """R ≤ n vectors of n lanes (n a power of two) → the R·n elements out[j·R + r] = vals[r][j], as R vectors of
    n lanes: the R×n block is transposed, then each output vector takes its lanes from the (at most ⌈n/R⌉ + 1)
    columns it spans, one two-source shuffle per column."""
    R = len(vals)
    poison = ir.Constant(vals[0].type, ir.Undefined)
    if R > n:  # more rows than lanes (SSE's 4 lanes under a 5-row tile): each output lane straight from its row
        return [_gather_lanes(b, vals, [divmod(q * n + e, R) for e in range(n)], n) for q in range(R)]
    cols = butterfly(b, vals, n)
    outs = []
    for q in range(R):
        src = [divmod(q * n + e, R) for e in range(n)]  # (column, lane) of each output lane
        need = sorted({c for c, _ in src})
        acc = b.shuffle_vector(cols[need[0]], poison, ir.Constant(ir.VectorType(I32, n), [
            ln if c == need[0] else 0 for c, ln in src]))
        for col in need[1:]:
            acc = b.shuffle_vector(acc, cols[col], ir.Constant(ir.VectorType(I32, n), [
                n + ln if c == col else e for e, (c, ln) in enumerate(src)]))
        outs.append(acc)
    return outs


def _pow2_rows(R: int) -> int:
    """R rows padded to a power of two (poison rows: join_lanes concatenates pairwise)."""
    return 1 << (R - 1).bit_length()


def interleave_in_one_register(em: ExprEmitter, vals: list[ir.Value], n: int) -> list[ir.Value]:
    """`interleave` where the R·n elements fit one register (the 4-byte pixels of an int8 stem's blocked input: four
    <16 x i8>): the vectors concatenated, one permute, split back — where the butterfly's log2(n) stages took ~40
    shuffles per 64 bytes (mobilenetv2 int8's input quantize)."""
    R = len(vals)
    poison = ir.Constant(vals[0].type, ir.Undefined)
    whole = join_lanes(em, list(vals) + [poison] * (_pow2_rows(R) - R))
    whole = em.b.shuffle_vector(whole, ir.Constant(whole.type, ir.Undefined), ir.Constant(
        ir.VectorType(I32, R * n), [(e % R) * n + e // R for e in range(R * n)]))
    return [lane_slice(em, whole, q * n, n) for q in range(R)]


# the two-source permute of a whole AVX-512 register, by element bytes: vpermt2d, vpermt2w, vpermt2b
TWO_SOURCE_PERMUTE = {4: "avx512f", 2: "avx512bw", 1: "avx512vbmi"}


def fits_two_registers(em: ExprEmitter, R: int, n: int, elem: int) -> bool:
    """Do R rows of n elements of `elem` bytes, padded to a power-of-two row count, fill exactly two registers of a
    target with a two-source permute for that element size?"""
    t = em.target
    if t is None or t.arch != "x86_64" or R < 2 or elem not in TWO_SOURCE_PERMUTE:
        return False
    return _pow2_rows(R) * n * elem * 8 == 2 * t.vector_bits and TWO_SOURCE_PERMUTE[elem] in features_on(t.features)


def interleave_in_two_registers(em: ExprEmitter, vals: list[ir.Value], n: int) -> list[ir.Value]:
    """`interleave` where the rows fill two registers (an RGB stem's bf16 blocked input: 16 pixels × 4 channels × 2
    bytes): the first half of the rows concatenated into one register, the second half into the other, and each
    output register one two-source permute of them (vpermt2w) — the butterfly took ~40 shuffles and a spill per 16
    pixels there. Returned as R vectors of n lanes, slices of the output registers."""
    R = len(vals)
    rows = list(vals) + [ir.Constant(vals[0].type, ir.Undefined)] * (_pow2_rows(R) - R)
    half = len(rows) // 2
    lo, hi = join_lanes(em, rows[:half]), join_lanes(em, rows[half:])
    m = half * n  # lanes per register
    regs = []
    for k in range(-(-R * n // m)):
        idx = [(t % R) * n + t // R if t < R * n else 0 for t in range(k * m, (k + 1) * m)]
        regs.append(em.b.shuffle_vector(lo, hi, ir.Constant(ir.VectorType(I32, m), idx)))
    return [lane_slice(em, regs[q * n // m], q * n % m, n) for q in range(R)]


def _gather_lanes(b: ir.IRBuilder, vals: list[ir.Value], src: list[tuple[int, int]], n: int) -> ir.Value:
    """One n-lane vector whose lane e is lane src[e][0] of vals[src[e][1]]: a chain of two-source shuffles, one per
    distinct source vector."""
    poison = ir.Constant(vals[0].type, ir.Undefined)
    rows = sorted({r for _, r in src})
    acc = b.shuffle_vector(vals[rows[0]], poison, ir.Constant(ir.VectorType(I32, n), [
        j if r == rows[0] else 0 for j, r in src]))
    for row in rows[1:]:
        acc = b.shuffle_vector(acc, vals[row], ir.Constant(ir.VectorType(I32, n), [
            n + j if r == row else e for e, (j, r) in enumerate(src)]))
    return acc


def _split(b: ir.IRBuilder, v: ir.Value, n: int, w: int) -> list[ir.Value]:
    if n == w:
        return [v]
    poison = ir.Constant(v.type, ir.Undefined)
    return [b.shuffle_vector(v, poison, ir.Constant(ir.VectorType(I32, w), list(range(h * w, (h + 1) * w))))
            for h in range(n // w)]


def _concat(b: ir.IRBuilder, parts: list[ir.Value]) -> ir.Value:
    w = parts[0].type.count
    while len(parts) > 1:
        parts = [b.shuffle_vector(parts[i], parts[i + 1], ir.Constant(ir.VectorType(I32, 2 * w), list(range(2 * w))))
                 for i in range(0, len(parts), 2)]
        w *= 2
    return parts[0]


def _lane_active(b: ir.IRBuilder, em: ExprEmitter, c: int, run: ir.Constant) -> ir.Value:
    """The mask of lane c's run: the R-element prefix, off entirely when lane c is off (a remainder)."""
    if em.vec.mask is None:
        return run
    on = b.extract_element(em.vec.mask, ir.Constant(I32, c))
    return b.and_(run, b.shuffle_vector(b.insert_element(ir.Constant(run.type, ir.Undefined), on,
                                                         ir.Constant(I32, 0)),
                                        ir.Constant(run.type, ir.Undefined),
                                        ir.Constant(ir.VectorType(I32, run.type.count), [0] * run.type.count)))


def _run_mask(b: ir.IRBuilder, em: ExprEmitter, R: int, w: int, guard: tuple[Expr, int] | None) -> ir.Value:
    """Which of a lane's w run elements are written: the first R — and of those, with a row guard
    `if m(r) < M` (m affine in r with step 1), the first M − m(0)."""
    prefix = ir.Constant(ir.VectorType(I1, w), [1 if i < R else 0 for i in range(w)])
    if guard is None:
        return prefix
    m0, _ = em.ev(guard[0])
    rows = b.sub(ir.Constant(I64, guard[1]), m0)
    idx = ir.Constant(ir.VectorType(I64, w), list(range(w)))
    return b.and_(prefix, b.icmp_signed("<", idx, em.splat(rows, w)))


def _transposed_load(b: ir.IRBuilder, em: ExprEmitter, ld: Load, r_name: str, R: int, S: int,
                     run: ir.Value) -> list[ir.Value]:
    """The R row vectors (n lanes) of a load whose lane c reads R contiguous elements at base + c·S."""
    ptr, dtype, shape = em.buffers[ld.buf]
    mt = MEMORY[dtype]
    n, w = em.vec.lanes, min(em.vec.lanes, BLOCK)
    em.env[r_name] = ir.Constant(I64, 0)
    base = em._at_base(flat_index(ld.index, shape))
    vt = ir.VectorType(mt, w)
    fn = em._decl(f"llvm.masked.load.v{w}{em._tname(mt)}.p0", vt, [PTR, I32, ir.VectorType(I1, w), vt])
    blocks = []
    for h in range(n // w):
        cols = []
        for c in range(h * w, (h + 1) * w):
            p = b.gep(ptr, [b.add(base, ir.Constant(I64, c * S))], source_etype=mt)
            cols.append(b.call(fn, [p, ir.Constant(I32, elem_bytes(mt)), _lane_active(b, em, c, run),
                                    ir.Constant(vt, None)]))
        blocks.append(butterfly(b, cols, w)[:R])
    return [em._from_memory(_concat(b, [blk[r] for blk in blocks]), dtype) for r in range(R)]


def _row_guard(s: Loop) -> tuple[Store, tuple[Expr, int] | None] | None:
    """The loop's one store, and its row guard (m, M) when it is `if m < M: store` with m = m0 + r."""
    if len(s.body) != 1:
        return None
    st = s.body[0]
    if isinstance(st, Store):
        return st, None
    if isinstance(st, If) and not st.orelse and len(st.body) == 1 and isinstance(st.body[0], Store) \
            and isinstance(st.cond, Bin) and st.cond.op == "<" and isinstance(st.cond.b, Const) \
            and coef(st.cond.a, s.var) == 1:
        return st.body[0], (st.cond.a, int(st.cond.b.value))
    return None


def transposed_store_group(b: ir.IRBuilder, em: ExprEmitter, s: Loop) -> bool:
    """Emit `s` (an unrolled loop of one Store, or of one row-guarded Store — a tile's edge rows) as a transposed
    group if it has that form; False otherwise."""
    R = int(s.extent.value)
    found = _row_guard(s)
    if em.vec is None or em.bounds or found is None or not 2 <= R <= BLOCK:
        return False
    st, guard = found
    ptr, dtype, shape = em.buffers[st.buf]
    flat = flat_index(st.index, shape)
    n = em.vec.lanes
    S = coef(flat, em.vec.var)
    if dtype == "bool" or S is None or S < R or coef(flat, s.var) != 1 or (R > n and S != R) or n & (n - 1):
        return False
    w = min(n, BLOCK)
    if (S > R and n % w) or (S == R and guard is not None):
        return False
    # loads of the same form are read transposed too, once for all R iterations (rows past a guard not at all)
    same_form: dict[Load, int] = {}
    loads = {e for e in walk(st.value) if isinstance(e, Load)}
    if S > R:
        for ld in loads:
            f = flat_index(ld.index, em.buffers[ld.buf][2])
            s_ld = coef(f, em.vec.var)
            if em.buffers[ld.buf][1] != "bool" and coef(f, s.var) == 1 and s_ld is not None and s_ld >= R:
                same_form[ld] = s_ld
    if guard is not None and any(uses_var(ld, s.var) for ld in loads - set(same_form)):
        return False  # a guarded row's other loads could read out of bounds
    em.env[s.var.name] = ir.Constant(I64, 0)
    run = _run_mask(b, em, R, w, guard)
    pre = {ld: _transposed_load(b, em, ld, s.var.name, R, s_ld, run) for ld, s_ld in same_form.items()}
    vals = []
    for it in range(R):
        em.env[s.var.name] = ir.Constant(I64, it)
        em.preloaded = {ld: (rows[it], True) for ld, rows in pre.items()}
        try:
            v, is_vec = em.ev(st.value)
        finally:
            em.preloaded = {}
        vals.append(em.to_memory(v if is_vec else em.splat(v), dtype))
    em.env[s.var.name] = ir.Constant(I64, 0)
    base = em._at_base(flat)
    mt = MEMORY[dtype]
    align = elem_bytes(mt)
    if S == R:  # one contiguous block of R·n elements
        vt = ir.VectorType(mt, n)
        wide = [j for j in range(n) for _ in range(R)]
        bits = R * n * elem_bytes(mt) * 8
        one = em.target is not None and em.target.arch == "x86_64" and bits <= em.target.vector_bits and R > 1
        outs = interleave_in_one_register(em, vals, n) if one else \
            interleave_in_two_registers(em, vals, n) if fits_two_registers(em, R, n, elem_bytes(mt)) else \
            interleave(b, vals, n)
        for q, out in enumerate(outs):
            p = b.gep(ptr, [b.add(base, ir.Constant(I64, q * n))], source_etype=mt)
            if em.vec.mask is None:
                b.store(out, p, align=align)
                continue
            if em.vec.prefix:  # a known tail of `prefix` lanes: the first prefix·R elements, as plain stores
                count = max(0, min(n, em.vec.prefix * R - q * n))
                if count:
                    prefix_store(b, out, p, count, mt, align)
                continue
            m = b.shuffle_vector(em.vec.mask, ir.Constant(em.vec.mask.type, ir.Undefined),
                                 ir.Constant(ir.VectorType(I32, n), wide[q * n:(q + 1) * n]))
            b.call(em._decl(f"llvm.masked.store.v{n}{em._tname(mt)}.p0", ir.VoidType(),
                            [vt, PTR, I32, ir.VectorType(I1, n)]), [out, p, ir.Constant(I32, align), m])
        return True
    # S > R: lane c's R results are one contiguous run at base + c·S
    vt = ir.VectorType(mt, w)
    store = em._decl(f"llvm.masked.store.v{w}{em._tname(mt)}.p0", ir.VoidType(), [vt, PTR, I32, ir.VectorType(I1, w)])
    halves = [_split(b, v, n, w) for v in vals]
    for h in range(n // w):
        cols = butterfly(b, [parts[h] for parts in halves], w)
        for i, col in enumerate(cols):
            c = h * w + i
            p = b.gep(ptr, [b.add(base, ir.Constant(I64, c * S))], source_etype=mt)
            if guard is None and em.vec.mask is None:  # a constant R-element run: plain stores (no vmaskmov)
                prefix_store(b, col, p, R, mt, align)
            else:
                b.call(store, [col, p, ir.Constant(I32, align), _lane_active(b, em, c, run)])
    return True


def transposed_load_group(b: ir.IRBuilder, em: ExprEmitter, s: Loop) -> bool:
    """Emit `s` — an unrolled loop of one Store that is contiguous along the lanes, reading loads whose lanes are
    S ≥ R apart and whose R iterations are consecutive (a blocked layout read back into NCHW planes) — as R
    transposed loads (one masked run per lane + butterflies) and R plain vector stores; False otherwise."""
    R = int(s.extent.value)
    if em.vec is None or em.bounds or len(s.body) != 1 or not isinstance(s.body[0], Store) or not 2 <= R <= BLOCK:
        return False
    st = s.body[0]
    ptr, dtype, shape = em.buffers[st.buf]
    flat = flat_index(st.index, shape)
    n = em.vec.lanes
    step = coef(flat, s.var)
    if dtype == "bool" or coef(flat, em.vec.var) != 1 or step is None or R > n or n & (n - 1) or n % min(n, BLOCK):
        return False
    same_form: dict[Load, int] = {}
    for ld in {e for e in walk(st.value) if isinstance(e, Load)}:
        f = flat_index(ld.index, em.buffers[ld.buf][2])
        s_ld = coef(f, em.vec.var)
        if em.buffers[ld.buf][1] != "bool" and coef(f, s.var) == 1 and s_ld is not None and s_ld >= R:
            same_form[ld] = s_ld
    if not same_form:
        return False
    em.env[s.var.name] = ir.Constant(I64, 0)
    run = _run_mask(b, em, R, min(n, BLOCK), None)
    pre = {ld: _transposed_load(b, em, ld, s.var.name, R, s_ld, run) for ld, s_ld in same_form.items()}
    em.env[s.var.name] = ir.Constant(I64, 0)
    base = em._at_base(flat)
    mt = MEMORY[dtype]
    vt = ir.VectorType(mt, n)
    for it in range(R):
        em.env[s.var.name] = ir.Constant(I64, it)
        em.preloaded = {ld: (rows[it], True) for ld, rows in pre.items()}
        try:
            v, is_vec = em.ev(st.value)
        finally:
            em.preloaded = {}
        v = em.to_memory(v if is_vec else em.splat(v), dtype)
        p = b.gep(ptr, [b.add(base, ir.Constant(I64, it * step))], source_etype=mt)
        if em.vec.mask is None:
            b.store(v, p, align=elem_bytes(mt))
        else:
            fn = em._decl(f"llvm.masked.store.v{n}{em._tname(mt)}.p0", ir.VoidType(),
                          [vt, PTR, I32, ir.VectorType(I1, n)])
            b.call(fn, [v, p, ir.Constant(I32, elem_bytes(mt)), em.vec.mask])
        em.forget_loads()  # the next row's loads may read what this one stored
    em.env[s.var.name] = ir.Constant(I64, 0)
    return True
