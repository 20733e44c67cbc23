"""Emit `Mmla` and `MmlaRow` (kiln/kernel/dot.py): AArch64's 2×2-block matrix multiply-accumulates in a vector loop.

In a vector loop of n lanes over output columns (NEON: n/4 q-registers per accumulator), one Mmla is n/4
instructions on the n/2 columns from lane `lane0`:

    A   = [row 0's 8 bytes | row 1's 8 bytes]       two 64-bit loads (fewer bytes, zero-extended: an odd last group)
    X   = load <n/2 x i32> at B(group q)            lane i: column lane0 + i's G values (one 32-bit group)
    Y   = load <n/2 x i32> at B(group q + 1)        (zero without b1)
    column pair j:  Bj = [X[2j], Y[2j], X[2j+1], Y[2j+1]]      (zip1 / zip2: each column's 8 bytes contiguous)
                    acc[4j..4j+4] = smmla(acc[4j..4j+4], A, Bj)          (bfmmla: 4 bf16 per row and column)

The accumulator lanes are [r0·c, r0·c+1, r1·c, r1·c+1] per block; `MmlaRow` puts one row back in column order for
the epilogue (a shuffle of the two accumulators, once per tile). On an edge iteration the loop's lane mask is spread
over each column's group; a bounds-checked build drops out-of-range bytes from the same masked loads.

`mmla_method(target, dtype)` says what a target has: "smmla" for int8 activations with i8mm, "bfmmla" for bf16 with
AArch64 BF16, else None — the register tile then uses Dot4 / Dot2 (SDOT / BFDOT). Always the 128-bit NEON forms: on
an SVE target the tile is a fixed-width loop (codegen/scalable.py: loop_is_scalable); SVE's own SMMLA is not used."""
from __future__ import annotations

from llvmlite import ir

from kiln.codegen.bf16 import BF16
from kiln.codegen.int8 import features, join_lanes, lane_slice
from kiln.kernel.analysis import coef
from kiln.kernel.dot import Mmla, MmlaRow
from kiln.kernel.ir import Load
from kiln.target import Target

I1, I8, I16, I32, I64 = ir.IntType(1), ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.IntType(64)
PTR, F32 = ir.PointerType(), ir.FloatType()
GROUP = {"int8": 4, "bfloat16": 2}   # values per 32-bit group of the weights' VNNI layout
ELEM = {"int8": I8, "bfloat16": I16}


def mmla_method(target: Target | None, dtype: str) -> str | None:
    """The block instruction `target` has for operands of `dtype` (the activations'), or None."""
    if target is None or target.arch != "aarch64":
        return None
    f = features(target)
    if dtype == "int8" and "i8mm" in f:
        return "smmla"
    if dtype == "bfloat16" and "bf16" in f:
        return "bfmmla"
    return None


def emit_mmla(em, e: Mmla) -> tuple[ir.Value, bool]:  # noqa: ANN001  (em: codegen.exprs.ExprEmitter)
    vec = em.vec
    method = mmla_method(getattr(em, "target", None), e.a0.dtype)
    if vec is None or getattr(em, "strip", None) is not None or method is None or vec.lanes % 4:
        raise AssertionError(f"mmla outside a vector loop of 4k lanes or on a target without it: {e!r}")
    B, n = em.b, vec.lanes
    acc, acc_vec = em.ev(e.acc)
    if not acc_vec:
        acc = em.splat(acc)
    words = [_row_word(em, a, e.count) for a in (e.a0, e.a1)]
    a = B.insert_element(B.insert_element(ir.Constant(ir.VectorType(I64, 2), None), words[0], ir.Constant(I32, 0)),
                         words[1], ir.Constant(I32, 1))
    x = _groups(em, e.b0, e.lane0)
    y = _groups(em, e.b1, e.lane0) if e.b1 is not None else ir.Constant(x.type, None)
    if method == "smmla":
        vt, ot = ir.VectorType(I32, 4), ir.VectorType(I8, 16)
        fn = em._decl("llvm.aarch64.neon.smmla.v4i32.v16i8", vt, [vt, ot, ot])
    else:
        vt, ot = ir.VectorType(F32, 4), ir.VectorType(BF16, 8)
        fn = em._decl("llvm.aarch64.neon.bfmmla", vt, [vt, ot, ot])
    a = B.bitcast(a, ot)
    half = n // 2
    blocks = []
    for j in range(n // 4):  # column pair j: each column's two groups side by side
        bj = B.shuffle_vector(x, y, ir.Constant(ir.VectorType(I32, 4), [2 * j, half + 2 * j, 2 * j + 1,
                                                                          half + 2 * j + 1]))
        blocks.append(B.call(fn, [lane_slice(em, acc, 4 * j, 4), a, B.bitcast(bj, ot)]))
    return join_lanes(em, blocks), True


def emit_mmla_row(em, e: MmlaRow) -> tuple[ir.Value, bool]:  # noqa: ANN001
    lo, lo_vec = em.ev(e.lo)
    hi, hi_vec = em.ev(e.hi)
    assert lo_vec and hi_vec, "MmlaRow reads two vector accumulators"
    n = lo.type.count
    half = n // 2
    idx = [(n if j >= half else 0) + (j % half) // 2 * 4 + 2 * e.row + j % 2 for j in range(n)]
    return em.b.shuffle_vector(lo, hi, ir.Constant(ir.VectorType(I32, n), idx)), True


def _row_word(em, a: Load, count: int) -> ir.Value:  # noqa: ANN001
    """`count` values of one A row from a's element on, zero-extended to 64 bits (a uniform read)."""
    ptr, dtype, flat = em.address(a.buf, a.index)
    if coef(flat, em.vec.var) != 0:
        raise AssertionError(f"an mmla row read varies across the lanes: {a!r}")
    mt = ELEM[dtype]
    bits = count * mt.width
    p = em.element_ptr(ptr, flat, mt)
    if em.bounds:  # each value checked: a masked load of `count` values
        mask = em.bounds.lanes(ptr, em.bounds.progression(em._at_base(flat), 1, count), None)
        word = em.b.bitcast(_load(em, p, ir.VectorType(mt, count), mask), ir.IntType(bits))
    else:
        word = em.b.load(p, typ=ir.IntType(bits), align=mt.width // 8)
    return word if bits == 64 else em.b.zext(word, I64)


def _groups(em, b: Load, lane0: int) -> ir.Value:  # noqa: ANN001
    """<n/2 x i32>: lane i the 32-bit group of column lane0 + i (b is lane lane0's group; masked on an edge)."""
    vec = em.vec
    ptr, dtype, flat = em.address(b.buf, b.index)
    g = GROUP.get(dtype)
    if g is None or coef(flat, vec.var) != g:
        raise AssertionError(f"an mmla weight read is not one {dtype} group per lane: {b!r}")
    mt, half = ELEM[dtype], vec.lanes // 2
    count = half * g
    vt = ir.VectorType(mt, count)
    p = em.element_ptr(ptr, flat, mt)
    mask = None
    if vec.mask is not None:
        mask = em.b.shuffle_vector(vec.mask, vec.mask, ir.Constant(ir.VectorType(I32, count),
                                                                   [lane0 + i // g for i in range(count)]))
    if em.bounds:
        mask = em.bounds.lanes(ptr, em.bounds.progression(em._at_base(flat), 1, count), mask)
    return em.b.bitcast(_load(em, p, vt, mask), ir.VectorType(I32, half))


def _load(em, p: ir.Value, vt: ir.VectorType, mask: ir.Value | None) -> ir.Value:  # noqa: ANN001
    """A vector of integer elements at p: one load, or a masked one (masked-off elements zero)."""
    align = vt.element.width // 8
    if mask is None:
        return em.b.load(p, typ=vt, align=align)
    n, bits = vt.count, vt.element.width
    fn = em._decl(f"llvm.masked.load.v{n}i{bits}.p0", vt, [PTR, I32, ir.VectorType(I1, n), vt])
    return em.b.call(fn, [p, ir.Constant(I32, align), mask, ir.Constant(vt, None)])

