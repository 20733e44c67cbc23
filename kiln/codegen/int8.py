"""Emit `Dot4` (kiln/kernel/ir.py): four 8-bit products summed into each int32 lane, per ISA.

In a vector loop of n int32 lanes, with `a` uniform and `b` 4 bytes per lane (weights packed [K/4][N][4]):

    a4 = load i32 at &a; splat to <n x i32>, bitcast <4n x i8>     (LLVM folds it: vpdpbusd zmm, zmm, m32{1to16})
    b  = load <4n x i8> at &b                                     (masked per lane on an edge iteration)
    x86 AVX-512 VNNI:   vpdpbusd.512 on 16-lane pieces              (u8 × s8, no saturation)
    x86 AVX-VNNI / VL:  vpdpbusd.256 / .128 on 8 / 4-lane pieces     (target "avx2" on a VNNI host: {vex} form)
    x86 without VNNI:   pmaddwd on the widened pairs (a0,a1)·(b0,b1) + (a2,a3)·(b2,b3): u8 and s8 sign/zero-
                        extended to int16, exact (`vpmaddubsw` would saturate u8·s8 pairs at int16)
    AArch64 dotprod:    SDOT (s8 × s8, activations signed there: kiln.graph.quant_ops.activation_dtype); with i8mm
                        the register tile takes its rows in pairs and runs SMMLA instead (`Mmla`, codegen/mmla.py)
    anything else:      the plain widening arithmetic of `Dot4.expand` (LLVM picks the widening MACs)

Outside that pattern (scalar code, a varying `a`) it is emitted as `Dot4.expand()`.

`dot_method(target)` names what a target gets; `kiln.compile` records it in `exe.meta["int8"]`."""
from __future__ import annotations

from llvmlite import ir

from kiln.kernel.analysis import coef
from kiln.kernel.dot import Dot4
from kiln.target import Target, features_on

I1, I8, I16, I32 = ir.IntType(1), ir.IntType(8), ir.IntType(16), ir.IntType(32)
PTR = ir.PointerType()


def features(target: Target | None) -> frozenset[str]:
    return frozenset() if target is None else features_on(target.features)


def vnni_widths(target: Target | None) -> tuple[int, ...]:
    """The int32 lane counts of the x86 `vpdpbusd` forms `target` has, widest first."""
    f = features(target)
    if target is None or target.arch != "x86_64":
        return ()
    out: list[int] = []
    if "avx512vnni" in f and target.vector_bits >= 512:
        out.append(16)
    if ("avx512vnni" in f and "avx512vl" in f and target.vector_bits >= 256) or "avxvnni" in f:
        out += [8, 4]
    return tuple(out)


def dot_method(target: Target) -> str:
    """What an 8-bit dot product compiles to on `target` (recorded in exe.meta["int8"])."""
    w = vnni_widths(target)
    f = features(target)
    if w and w[0] == 16:
        return "vpdpbusd (AVX-512 VNNI, 512-bit)"
    if w:
        return "vpdpbusd (AVX-VNNI, 256-bit)" if "avxvnni" in f and target.vector_bits < 512 \
            else "vpdpbusd (AVX-512 VNNI + VL, 256-bit)"
    if target.arch == "x86_64":
        return ("no VNNI on this target: u8/s8 widened to int16 and multiplied with pmaddwd (exact, no "
                "saturation; about 18x the instructions per multiply-accumulate of vpdpbusd: python -m kiln.isa.int8)")
    neon = " in 128-bit NEON registers (the SVE target's packed GEMMs)" if target.scalable else ""
    if target.arch == "aarch64" and "i8mm" in f:
        return f"smmla (AArch64 i8mm: 2×2 blocks, schedule/mmla.py; sdot on one-row tiles){neon}"
    if target.arch == "aarch64" and "dotprod" in f:
        return f"sdot (AArch64 dotprod){neon}"
    return f"no 8-bit dot product on {target.name}: widening multiply-adds (LLVM's choice)"


def emit_dot4(em, e: Dot4) -> tuple[ir.Value, bool]:  # noqa: ANN001  (em: codegen.exprs.ExprEmitter)
    vec = em.vec
    if vec is None or getattr(em, "strip", None) is not None:  # scalar, or a scalable strip: plain arithmetic
        return em.ev(e.expand())
    _, _, a_flat = em.address(e.a.buf, e.a.index)
    b_ptr, b_dtype, b_flat = em.address(e.b.buf, e.b.index)
    if coef(a_flat, vec.var) != 0 or coef(b_flat, vec.var) != 4 or b_dtype != "int8" or e.a.dtype not in (
            "uint8", "int8") or em.bounds is not None:
        return em.ev(e.expand())
    n = vec.lanes
    acc, a8, b8 = dot_operands(em, e, a_flat, b_ptr, b_flat, 4, I8)
    target = getattr(em, "target", None)
    widths = [w for w in vnni_widths(target) if w <= n and n % w == 0] if e.a.dtype == "uint8" else []
    if widths:
        return pieces(em, acc, a8, b8, n, widths[0], _vnni), True
    if target is not None and target.arch == "x86_64":
        w = min(n, max(4, target.vector_bits // 32))
        return pieces(em, acc, a8, b8, n, w, lambda em_, c, x, y, w_: _pmaddwd(em_, c, x, y, w_, e.a.dtype)), True
    if target is not None and target.arch == "aarch64" and "dotprod" in features(target) and e.a.dtype == "int8":
        return pieces(em, acc, a8, b8, n, 4, _sdot), True
    return _widen(em, acc, a8, b8, n, e.a.dtype), True


def dot_operands(em, e, a_flat, b_ptr: ir.Value, b_flat, group: int, elem: ir.IntType  # noqa: ANN001
                 ) -> tuple[ir.Value, ir.Value, ir.Value]:
    """The operands of a `Dot4` / `Dot2` in a vector loop of n lanes, as memory holds them: the accumulator (a
    vector), A's group of `group` values loaded as one 32-bit word and broadcast (<group·n x elem>), and B's group
    per lane (<group·n x elem>, a masked load spread over each lane's group on an edge iteration)."""
    B, vec = em.b, em.vec
    n, size = vec.lanes, elem.width // 8
    acc, acc_vec = em.ev(e.acc)
    if not acc_vec:
        acc = em.splat(acc)
    a_ptr, _, _ = em.address(e.a.buf, e.a.index)
    word = B.load(B.gep(a_ptr, [em._uniform(a_flat)[0]], source_etype=elem), typ=I32, align=size)
    vt = ir.VectorType(elem, group * n)
    a = B.bitcast(em.splat(word, n), vt)
    b_at = em.element_ptr(b_ptr, b_flat, elem)
    if vec.mask is None:
        return acc, a, B.load(b_at, typ=vt, align=size)
    per_value = ir.Constant(ir.VectorType(I32, group * n), [i // group for i in range(group * n)])
    spread = B.shuffle_vector(vec.mask, vec.mask, per_value)
    fn = em._decl(f"llvm.masked.load.v{group * n}i{elem.width}.p0", vt, [PTR, I32, ir.VectorType(I1, group * n), vt])
    return acc, a, B.call(fn, [b_at, ir.Constant(I32, size), spread, ir.Constant(vt, None)])


def lane_slice(em, v: ir.Value, start: int, count: int) -> ir.Value:  # noqa: ANN001
    """Lanes start … start + count of vector v."""
    return em.b.shuffle_vector(v, v, ir.Constant(ir.VectorType(I32, count), list(range(start, start + count))))


def join_lanes(em, parts: list[ir.Value]) -> ir.Value:  # noqa: ANN001
    """Equal-width vectors (a power-of-two count) concatenated in order, pairwise."""
    while len(parts) > 1:
        k = parts[0].type.count
        cat = ir.Constant(ir.VectorType(I32, 2 * k), list(range(2 * k)))
        parts = [em.b.shuffle_vector(parts[j], parts[j + 1], cat) for j in range(0, len(parts), 2)]
    return parts[0]


def pieces(em, acc: ir.Value, a8: ir.Value, b8: ir.Value, n: int, w: int, op, group: int = 4) -> ir.Value:  # noqa: ANN001
    """Apply op(acc piece <w x acc>, a piece <group·w x elem>, b piece) to each w-lane piece and join the results
    (`group` operand elements per accumulator lane: 4 bytes for vpdpbusd, 2 bf16 for vdpbf16ps)."""
    if w == n:
        return op(em, acc, a8, b8, w)
    g = group
    return join_lanes(em, [op(em, lane_slice(em, acc, i, w), lane_slice(em, a8, g * i, g * w),
                              lane_slice(em, b8, g * i, g * w), w) for i in range(0, n, w)])


def _vnni(em, acc: ir.Value, a8: ir.Value, b8: ir.Value, w: int) -> ir.Value:  # noqa: ANN001
    vt, bt = ir.VectorType(I32, w), ir.VectorType(I8, 4 * w)
    name = f"llvm.x86.avx512.vpdpbusd.{32 * w}"  # also the AVX-VNNI ({vex}) form when only avxvnni is on
    return em.b.call(em._decl(name, vt, [vt, bt, bt]), [acc, a8, b8])


def _pairs(em, v: ir.Value, first: int, w: int, signed: bool) -> ir.Value:  # noqa: ANN001
    """Bytes (4i + first, 4i + first + 1) of each lane i, widened to int16: <2w x i16>."""
    idx = [4 * (j // 2) + first + (j % 2) for j in range(2 * w)]
    sel = em.b.shuffle_vector(v, v, ir.Constant(ir.VectorType(I32, 2 * w), idx))
    t = ir.VectorType(I16, 2 * w)
    return em.b.sext(sel, t) if signed else em.b.zext(sel, t)


def _pmaddwd(em, acc: ir.Value, a8: ir.Value, b8: ir.Value, w: int, a_dtype: str) -> ir.Value:  # noqa: ANN001
    name = {4: "llvm.x86.sse2.pmadd.wd", 8: "llvm.x86.avx2.pmadd.wd", 16: "llvm.x86.avx512.pmaddw.d.512"}[w]
    vt, ht = ir.VectorType(I32, w), ir.VectorType(I16, 2 * w)
    fn = em._decl(name, vt, [ht, ht])
    out = acc
    for first in (0, 2):
        p = em.b.call(fn, [_pairs(em, a8, first, w, a_dtype == "int8"), _pairs(em, b8, first, w, True)])
        out = em.b.add(out, p)
    return out


def _sdot(em, acc: ir.Value, a8: ir.Value, b8: ir.Value, w: int) -> ir.Value:  # noqa: ANN001
    vt, bt = ir.VectorType(I32, 4), ir.VectorType(I8, 16)
    return em.b.call(em._decl("llvm.aarch64.neon.sdot.v4i32.v16i8", vt, [vt, bt, bt]), [acc, a8, b8])


def _widen(em, acc: ir.Value, a8: ir.Value, b8: ir.Value, n: int, a_dtype: str) -> ir.Value:  # noqa: ANN001
    """Σ_q ext(a[4i+q])·sext(b[4i+q]) as plain IR: four stride-4 byte selections, widened, multiplied, added."""
    out = acc
    t = ir.VectorType(I32, n)
    for q in range(4):
        sel = ir.Constant(ir.VectorType(I32, n), [4 * i + q for i in range(n)])
        a = em.b.shuffle_vector(a8, a8, sel)
        b = em.b.shuffle_vector(b8, b8, sel)
        a = em.b.sext(a, t) if a_dtype == "int8" else em.b.zext(a, t)
        out = em.b.add(out, em.b.mul(a, em.b.sext(b, t)))
    return out
