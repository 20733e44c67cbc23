"""Emit `Dot4` (kiln/kernel/ir.py): four 8-bit products summed into each int32 lane, per ISA.

In a vector loop of n int32 lanes, with `a` uniform and `b` 4 bytes per lane (weights packed [K/4][N][4]):

    a4 = load i32 at &a; splat to <n x i32>, bitcast <4n x i8>     (LLVM folds it: vpdpbusd zmm, zmm, m32{1to16})
    b  = load <4n x i8> at &b                                     (masked per lane on an edge iteration)
    x86 AVX-512 VNNI:   vpdpbusd.512 on 16-lane pieces              (u8 × s8, no saturation)
    x86 AVX-VNNI / VL:  vpdpbusd.256 / .128 on 8 / 4-lane pieces     (target "avx2" on a VNNI host: {vex} form)
    x86, s8 A:          (a VNNI CPU; without VNNI the weights are int16 and the products `Dot2`, below) pmaddwd on
                        the widened pairs (a0,a1)·(b0,b1) + (a2,a3)·(b2,b3): u8 and s8 sign/zero-extended to int16,
                        exact (`vpmaddubsw` would saturate u8·s8 pairs at int16)
    AArch64 dotprod:    SDOT (s8 × s8, activations signed there: kiln.graph.quant_ops.activation_dtype); with i8mm
                        the register tile takes its rows in pairs and runs SMMLA instead (`Mmla`, codegen/mmla.py)
    anything else:      the plain widening arithmetic of `Dot4.expand` (LLVM picks the widening MACs)

Outside that pattern (scalar code, a varying `a`) it is emitted as `Dot4.expand()`.

On x86 without VNNI the weights are int16 pairs instead (graph/quant_pack.py dot_group) and the anchors' products
are `Dot2`s, one `pmaddwd` per pair (`emit_word_dot2`):

    a2 = the 2 activations, zero- (or sign-) extended to int16 and broadcast as one 32-bit word
    b  = load <2n x i16> at &b                                    (lane i: the pair at 2·i; masked on an edge)
    acc + pmaddwd(a2, b) per 4 / 8 / 16-lane piece                (exact: 8-bit × 16-bit products, int32 sums)

`dot_method(target)` names what a target gets; `kiln.compile` records it in `exe.meta["int8"]`."""
from __future__ import annotations

from llvmlite import ir

from kiln.kernel.analysis import coef, unclamped_index
from kiln.kernel.dot import Dot2, Dot4, LaneDot4
from kiln.kernel.ir import Const, Load, Select
from kiln.target import Target, features_on, vnni_widths

I1, I8, I16, I32, I64 = ir.IntType(1), ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.IntType(64)
PTR = ir.PointerType()


def features(target: Target | None) -> frozenset[str]:
    return frozenset() if target is None else features_on(target.features)


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
        return ("no VNNI on this target: weights packed as int16 pairs, one pmaddwd per pair of activations (exact, "
                "no saturation; about 3.5x the instructions per multiply-accumulate of vpdpbusd at 256 bits: "
                "python -m kiln.isa.int8)")
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


def emit_word_dot2(em, e: Dot2) -> tuple[ir.Value, bool]:  # noqa: ANN001  (em: codegen.exprs.ExprEmitter)
    """An 8-bit × int16 `Dot2` in a vector loop on x86: one pmaddwd per piece (module docstring); anything else
    (scalar code, a bounds-checked build, another layout or ISA) is `Dot2.expand()`."""
    vec = em.vec
    target = getattr(em, "target", None)
    if vec is None or getattr(em, "strip", None) is not None or em.bounds is not None or target is None or \
            target.arch != "x86_64":
        return em.ev(e.expand())
    a_ptr, _, a_flat = em.address(e.a.buf, e.a.index)
    b_ptr, b_dtype, b_flat = em.address(e.b.buf, e.b.index)
    if coef(a_flat, vec.var) != 0 or coef(b_flat, vec.var) != 2 or b_dtype != "int16":
        return em.ev(e.expand())
    B, n = em.b, vec.lanes
    acc, acc_vec = em.ev(e.acc)
    if not acc_vec:
        acc = em.splat(acc)
    at = B.gep(a_ptr, [em._uniform(a_flat)[0]], source_etype=I8)
    w = min(n, max(4, target.vector_bits // 32))
    if e.a.dtype == "uint8":  # the pair's word broadcast, its bytes spread into zero-extended words: one vpshufb
        word = B.load(at, typ=I16, align=1)  # (in one 128-bit register the pshufb itself broadcasts the pair)
        words = B.insert_element(ir.Constant(ir.VectorType(I16, 2 * w), None), word, ir.Constant(I32, 0)) \
            if w == 4 else em.splat(word, 2 * w)
        bytes_ = B.bitcast(words, ir.VectorType(I8, 4 * w))
        a16 = B.bitcast(_zero_extend_pairs(em, bytes_, target), ir.VectorType(I16, 2 * w))
    else:
        wide = B.sext(B.load(at, typ=ir.VectorType(I8, 2), align=1), ir.VectorType(I16, 2))
        a16 = B.bitcast(em.splat(B.bitcast(wide, I32), w), ir.VectorType(I16, 2 * w))
    b16 = groups_per_lane(em, b_ptr, b_flat, 2, I16)
    return join_lanes(em, [_pmaddwd_words(em, lane_slice(em, acc, i, w), a16, lane_slice(em, b16, 2 * i, 2 * w), w)
                           for i in range(0, n, w)]), True


PMADDWD = {4: "llvm.x86.sse2.pmadd.wd", 8: "llvm.x86.avx2.pmadd.wd", 16: "llvm.x86.avx512.pmaddw.d.512"}  # by lanes
PSHUFB = {128: ("llvm.x86.ssse3.pshuf.b.128", "ssse3"), 256: ("llvm.x86.avx2.pshuf.b", "avx2"),
          512: ("llvm.x86.avx512.pshuf.b.512", "avx512bw")}


def _zero_extend_pairs(em, bytes_: ir.Value, target: Target) -> ir.Value:  # noqa: ANN001
    """Bytes (0, 1) of a broadcast word (of each 128-bit lane) as zero-extended words in every 32-bit lane:
    [b0, 0, b1, 0, …]. One `vpshufb` whose control passes through an empty asm — given the constant, LLVM 22 splits
    it into an unpack and a second broadcast (three shuffles per activation pair instead of one) —, where the vector
    is one register."""
    count = bytes_.type.count
    spread = [i // 2 % 2 if i % 2 == 0 else 0x80 for i in range(count)]  # 0x80: pshufb's zero
    name, feature = PSHUFB.get(8 * count, ("", ""))
    if not name or 8 * count != target.vector_bits or feature not in features(target):
        index = [i // 2 % 2 if i % 2 == 0 else count for i in range(count)]
        return em.b.shuffle_vector(bytes_, ir.Constant(bytes_.type, None), ir.Constant(ir.VectorType(I32, count),
                                                                                      index))
    opaque = ir.InlineAsm(ir.FunctionType(bytes_.type, [bytes_.type]), "", "=v,0")
    control = em.b.call(opaque, [ir.Constant(bytes_.type, [s - 256 if s > 127 else s for s in spread])],
                        attrs=("nounwind", "readnone"))
    return em.b.call(em._decl(name, bytes_.type, [bytes_.type, bytes_.type]), [bytes_, control])


def _pmaddwd_words(em, acc: ir.Value, a16: ir.Value, b16: ir.Value, w: int) -> ir.Value:  # noqa: ANN001
    name = PMADDWD[w]
    vt, ht = ir.VectorType(I32, w), ir.VectorType(I16, 2 * w)
    return em.b.add(acc, em.b.call(em._decl(name, vt, [ht, ht]), [a16, b16]))


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
    return acc, a, groups_per_lane(em, b_ptr, b_flat, group, elem)


def groups_per_lane(em, ptr: ir.Value, flat, group: int, elem: ir.IntType) -> ir.Value:  # noqa: ANN001
    """The `group` consecutive values of each lane at flat + group·lane, as <group·n x elem>: one load, masked per
    lane's group on an edge iteration."""
    B, vec = em.b, em.vec
    n, size = vec.lanes, elem.width // 8
    vt = ir.VectorType(elem, group * n)
    at = em.element_ptr(ptr, flat, elem)
    if vec.mask is None:
        return B.load(at, typ=vt, align=size)
    per_value = ir.Constant(ir.VectorType(I32, group * n), [i // group for i in range(group * n)])
    spread = B.shuffle_vector(vec.mask, vec.mask, per_value)
    fn = em._decl(f"llvm.masked.load.v{group * n}i{elem.width}.p0", vt, [PTR, I32, ir.VectorType(I1, group * n), vt])
    return B.call(fn, [at, ir.Constant(I32, size), spread, ir.Constant(vt, None)])


def _interleaved(em, e: LaneDot4, n: int) -> ir.Value:  # noqa: ANN001
    """The four tap vectors <n x i8> interleaved into <4n x i8> (lane i: bytes x0[i], x1[i], x2[i], x3[i]): two
    rounds of shuffles; a Const 0 tap (past the window's end) is a splat zero."""
    B = em.b
    taps = []
    for x in e.taps:
        v, is_vec = em.ev(x)
        taps.append(v if is_vec else em.splat(v, n))
    pair = ir.Constant(ir.VectorType(I32, 2 * n), [(i // 2) + (n if i % 2 else 0) for i in range(2 * n)])
    lo, hi = B.shuffle_vector(taps[0], taps[1], pair), B.shuffle_vector(taps[2], taps[3], pair)
    quad = ir.Constant(ir.VectorType(I32, 4 * n), [2 * (i // 4) + (i % 2) + (2 * n if i % 4 >= 2 else 0)
                                                   for i in range(4 * n)])
    return B.shuffle_vector(lo, hi, quad)


def _window_row(em, e: LaneDot4, n: int) -> ir.Value | None:  # noqa: ANN001
    """Where the taps read one buffer `stride` bytes apart (a blocked depthwise conv's adjacent pixels), the window
    row's bytes as one or two 64-byte loads and ONE byte permute per 16 lanes into the lanes' groups (AVX512_VBMI
    `vpermt2b`), against a widening and word permutes per tap for the generic interleave. Guarded taps (padding:
    select(in bounds, X[clamped], fill), kernel/lower.py guarded_window) read through masked loads at the unclamped
    address, each tap's bytes under its own condition, `fill` elsewhere. None where the form does not hold (no VBMI,
    a masked vector, taps of another shape)."""
    taps = [x for x in e.taps if not (isinstance(x, Const) and x.value == 0)]
    target = getattr(em, "target", None)
    if e.stride <= 0 or em.vec.mask is not None or "avx512vbmi" not in features(target) or \
            target.vector_bits < 512 or len(taps) != sum(1 for x in e.taps if not isinstance(x, Const)):
        return None
    index = [x.index if isinstance(x, Load) else unclamped_index(x) for x in taps]
    if any(i is None for i in index):  # (unclamped_index: a Select of a Load and a Const fill, else None)
        return None
    reads = [x if isinstance(x, Load) else x.a for x in taps]
    fills = {x.b.value for x in taps if isinstance(x, Select)}
    if len(fills) > 1 or len({ld.buf for ld in reads}) != 1:
        return None
    first = reads[0]
    ptr, dtype, flat = em.address(first.buf, index[0])
    if dtype != "uint8" or coef(flat, em.vec.var) != 1:
        return None
    span = (len(taps) - 1) * e.stride + n
    if span > 128:
        return None
    conds = []
    for x in taps:
        if isinstance(x, Select):
            c, cv = em.ev(x.cond)
            if cv:  # a condition that varies along the channels: not the padding of a pixel
                return None
            conds.append(c)
        else:
            conds.append(ir.Constant(I1, 1))
    at = em.element_ptr(ptr, flat, I8)
    guarded = any(isinstance(x, Select) for x in taps)
    fill = em.splat(ir.Constant(I8, int(fills.pop()) if fills else 0), 64)
    masked_load = em._decl("llvm.masked.load.v64i8.p0", ir.VectorType(I8, 64),
                           [PTR, I32, ir.VectorType(I1, 64), ir.VectorType(I8, 64)])

    def load64(offset: int) -> ir.Value:
        """Bytes offset … offset + 63 of the span; guarded: each tap's bytes where it is in bounds, the gaps
        between taps (n < stride) and the bytes past the span never touched."""
        p = em.b.gep(at, [ir.Constant(I64, offset)], source_etype=I8) if offset else at
        if not guarded and span >= 64:
            return em.b.load(p, typ=ir.VectorType(I8, 64), align=1)
        sel = [(offset + o) // e.stride if offset + o < span and (offset + o) % e.stride < n else 4 for o in range(64)]
        if guarded:  # the 64-bit mask as an integer: each tap's bits where it is in bounds, OR-ed (a k-register
            # move; a <4 x i1> shuffled out to 64 lanes went through byte vectors and spilled mask registers)
            bits: ir.Value = ir.Constant(I64, 0)
            for q, c in enumerate(conds):
                pattern = sum(1 << o for o in range(64) if sel[o] == q)
                pattern -= (pattern >> 63) << 64  # as a signed i64
                if pattern:
                    bits = em.b.or_(bits, em.b.select(c, ir.Constant(I64, pattern), ir.Constant(I64, 0)))
            mask = em.b.bitcast(bits, ir.VectorType(I1, 64))
        else:  # a span shorter than 64 bytes (16 lanes): one load under a constant mask, not a 48-byte vector
            mask = ir.Constant(ir.VectorType(I1, 64), [int(t < 4) for t in sel])
        return em.b.call(masked_load, [p, ir.Constant(I32, 1), mask, fill])

    # (a tap past the window's end has zero weights: any byte serves, so lane i's fourth byte is tap 0's)
    offsets = [(q if q < len(taps) else 0) * e.stride + i for i in range(n) for q in range(4)]
    if span <= 64:
        row = load64(0)
        if 4 * n == 64:  # one vpermb: as a shuffle with constant indices (which InstCombine makes of the intrinsic
            # too) LLVM 22 emits vpermd + vpshufb, two shuffles on port 5 — 29% of the port-5 cycles of mobilenetv2
            # int8's 144-channel depthwise convs (16-channel blocks) by llvm-mca. The indices pass through an empty
            # asm, opaque to the optimizer (and free: the constant is loaded into a register once)
            byte64 = ir.VectorType(I8, 64)
            opaque = ir.InlineAsm(ir.FunctionType(byte64, [byte64]), "", "=v,0")
            permute = em._decl("llvm.x86.avx512.permvar.qi.512", byte64, [byte64, byte64])
            index = em.b.call(opaque, [ir.Constant(byte64, offsets)], attrs=("nounwind", "readnone"))
            return em.b.call(permute, [row, index])
        return em.b.shuffle_vector(row, row, ir.Constant(ir.VectorType(I32, 4 * n), offsets))
    # two overlapping loads, the second ending at the span's last byte (never past the taps' reads)
    lo, hi = load64(0), load64(span - 64)
    index = [o if o < 64 else 64 + o - (span - 64) for o in offsets]
    return em.b.shuffle_vector(lo, hi, ir.Constant(ir.VectorType(I32, 4 * n), index))


def emit_lane_dot4(em, e: LaneDot4) -> tuple[ir.Value, bool]:  # noqa: ANN001  (em: codegen.exprs.ExprEmitter)
    """`LaneDot4` in a vector loop: the four tap vectors <n x i8> interleaved into <4n x i8> (two rounds of
    shuffles; LLVM picks the permutes), the weights one load of 4n bytes, then `vpdpbusd` per VNNI piece (pmaddwd
    pairs on x86 without VNNI); anything else (scalar code, an operand layout outside the form, a bounds-checked
    build, activations not uint8) is `LaneDot4.expand()`."""
    vec = em.vec
    if vec is None or getattr(em, "strip", None) is not None or em.bounds is not None:
        return em.ev(e.expand())
    w_ptr, w_dtype, w_flat = em.address(e.w.buf, e.w.index)
    target = getattr(em, "target", None)
    if coef(w_flat, vec.var) != 4 or w_dtype != "int8" or target is None or target.arch != "x86_64" or any(
            x.dtype != "uint8" for x in e.taps):
        return em.ev(e.expand())
    n = vec.lanes
    acc, acc_vec = em.ev(e.acc)
    if not acc_vec:
        acc = em.splat(acc)
    x8 = _window_row(em, e, n) or _interleaved(em, e, n)
    w8 = groups_per_lane(em, w_ptr, w_flat, 4, I8)
    widths = [w for w in vnni_widths(target) if w <= n and n % w == 0]
    if widths:
        return pieces(em, acc, x8, w8, n, widths[0], _vnni), True
    w = min(n, max(4, target.vector_bits // 32))
    return pieces(em, acc, x8, w8, n, w, lambda em_, c, x, y, w_: _pmaddwd(em_, c, x, y, w_, "uint8")), True


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
    name = PMADDWD[w]
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
