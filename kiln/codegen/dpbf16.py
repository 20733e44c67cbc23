"""Emit `Dot2` (kiln/kernel/ir.py): two bfloat16 products summed into each float32 lane — AVX512_BF16 `vdpbf16ps`.

In a vector loop of n float32 lanes, with `a` uniform and `b` a pair per lane (weights in VNNI pair order
[K/2][N][2], graph/passes/precision.py):

    a2 = load i32 at &a; splat to <n x i32>, bitcast <2n x bfloat>     (LLVM folds it: vdpbf16ps zmm, zmm, m32{1to16})
    b  = load <2n x i16> at &b, bitcast <2n x bfloat>                  (masked per lane on an edge iteration)
    AVX512_BF16:            vdpbf16ps on 16-lane pieces (zmm)
    AVX512_BF16 + VL:       vdpbf16ps on 8 / 4-lane pieces (ymm / xmm: a 256-bit build on a BF16 host)
    AArch64 BF16 (NEON):    bfdot on 4-lane pieces
    anything else:          `Dot2.expand()` — the emulation (bf16 widened exactly, float32 multiply-adds)

vdpbf16ps adds the two (exact) products to the lane one after the other with round-to-nearest-even and flushes
denormals (Intel SDM): against the emulation only the order of two float32 additions and denormal inputs differ.

`dpbf16_widths(target)` says which forms a target has; `schedule/bf16.py` builds the tile only where it has one."""
from __future__ import annotations

from llvmlite import ir

from kiln.codegen.bf16 import BF16
from kiln.codegen.int8 import dot_operands, pieces
from kiln.kernel.analysis import coef
from kiln.kernel.dot import Dot2
from kiln.target import dpbf16_widths

I16, F32 = ir.IntType(16), ir.FloatType()


def emit_dot2(em, e: Dot2) -> tuple[ir.Value, bool]:  # noqa: ANN001  (em: codegen.exprs.ExprEmitter)
    vec = em.vec
    target = getattr(em, "target", None)
    if vec is None or getattr(em, "strip", None) is not None or em.bounds is not None:
        return em.ev(e.expand())
    _, a_dtype, a_flat = em.address(e.a.buf, e.a.index)
    b_ptr, b_dtype, b_flat = em.address(e.b.buf, e.b.index)
    n = vec.lanes
    widths = [w for w in dpbf16_widths(target) if w <= n and n % w == 0]
    if coef(a_flat, vec.var) != 0 or coef(b_flat, vec.var) != 2 or (a_dtype, b_dtype) != ("bfloat16",) * 2 \
            or not widths:
        return em.ev(e.expand())
    acc, a16, b16 = dot_operands(em, e, a_flat, b_ptr, b_flat, 2, I16)
    pairs = ir.VectorType(BF16, 2 * n)
    a2, b2 = em.b.bitcast(a16, pairs), em.b.bitcast(b16, pairs)
    op = _bfdot if target.arch == "aarch64" else _dpbf16
    return pieces(em, acc, a2, b2, n, widths[0], op, group=2), True


def _dpbf16(em, acc: ir.Value, a: ir.Value, b: ir.Value, w: int) -> ir.Value:  # noqa: ANN001
    vt, pt = ir.VectorType(F32, w), ir.VectorType(BF16, 2 * w)
    return em.b.call(em._decl(f"llvm.x86.avx512bf16.dpbf16ps.{32 * w}", vt, [vt, pt, pt]), [acc, a, b])


def _bfdot(em, acc: ir.Value, a: ir.Value, b: ir.Value, w: int) -> ir.Value:  # noqa: ANN001
    """AArch64 BFDOT v.4s: per float32 lane, the pair's two products added (as vdpbf16ps; Arm's own rounding)."""
    vt, pt = ir.VectorType(F32, 4), ir.VectorType(BF16, 8)
    return em.b.call(em._decl("llvm.aarch64.neon.bfdot.v4f32.v8bf16", vt, [vt, pt, pt]), [acc, a, b])
