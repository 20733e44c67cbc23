"""Vector float32 exp / log / erf / tanh as straight-line polynomial code (no libm call per lane).

LLVM scalarizes `llvm.exp.v16f32` into 16 calls of `expf`; these keep every lane in one register.
Accuracy (float32, measured against NumPy in tests/test_mathfn.py): exp ≤ 2 ulp from ln(FLT_MIN) to ln(FLT_MAX)
(+inf above, 0 below), log ≤ 2 ulp, erf ≤ 3e-7 absolute (≈ 2 ulp near ±1; a rational fit on [-4, 4]), tanh ≤ 3 ulp
(Cephes tanhf polynomial below 0.625)."""
from __future__ import annotations

from collections.abc import Callable

from llvmlite import ir

from kiln.codegen.constants import splat_constant as _c

I32 = ir.IntType(32)
LN_FLT_MIN, LN_FLT_MAX = -87.33654, 88.72283   # float32's exp range ends, rounded inwards


def _poly(b: ir.IRBuilder, fma: Callable, x: ir.Value, coeffs: list[float]) -> ir.Value:
    """Horner: ((c0·x + c1)·x + c2)…"""
    acc = _c(x.type, coeffs[0])
    for c in coeffs[1:]:
        acc = fma(acc, x, _c(x.type, c))
    return acc


class VectorMath:
    def __init__(self, b: ir.IRBuilder, intrinsic: Callable[[str, ir.Type, list[ir.Value]], ir.Value],
                 declare: Callable[[str, ir.Type, list[ir.Type]], ir.Function], scalef: bool = False):
        """`declare(name, ret, args)`: the module's function of that signature (the emitter's); `scalef`: the target
        has AVX-512F's vscalefps (exp applies 2^n with it on 16-lane vectors)."""
        self.b, self.intrinsic, self.declare, self.scalef = b, intrinsic, declare, scalef

    def fma(self, a: ir.Value, x: ir.Value, c: ir.Value) -> ir.Value:
        return self.intrinsic("llvm.fmuladd", a.type, [a, x, c])

    def _exp_reduced(self, xc: ir.Value) -> tuple[ir.Value, ir.Value]:
        """e^xc = y · 2^n: n = round(xc / ln2) (a float), y = e^r on r = xc − n·ln2 ∈ [−ln2/2, ln2/2] (Cody–Waite: ln2
        in two parts) by a degree-7 polynomial."""
        b, t = self.b, xc.type
        n = self.intrinsic("llvm.roundeven", t, [b.fmul(xc, _c(t, 1.44269504088896341))])
        r = self.fma(n, _c(t, -0.693359375), xc)
        r = self.fma(n, _c(t, 2.12194440e-4), r)
        p = _poly(b, self.fma, r, [1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2,
                                    1.6666665459e-1, 5.0000001201e-1])
        return n, b.fadd(self.fma(p, b.fmul(r, r), r), _c(t, 1.0))

    def exp(self, x: ir.Value) -> ir.Value:
        b, t = self.b, x.type
        if self.scalef and t.count == 16:
            return self._exp_scalef(x)
        lo, hi = _c(t, LN_FLT_MIN), _c(t, LN_FLT_MAX)
        xc = self.intrinsic("llvm.minnum", t, [self.intrinsic("llvm.maxnum", t, [x, lo]), hi])
        n, y = self._exp_reduced(xc)   # n in [-126, 128]
        # y · 2^n by adding n to y's exponent field: y = e^r in [0.707, 1.415] has exponent 126 or 127, so the sum
        # stays a normal float at both ends — n = -126 comes with r ≥ 0 (x clamped at ln(FLT_MIN)): 127 - 126; n = 128
        # with y < 1 below ln(FLT_MAX): 126 + 128 — where 2^n itself (2^128) has no float32
        vi = ir.VectorType(I32, t.count)
        out = b.bitcast(b.add(b.bitcast(y, vi), b.shl(b.fptosi(n, vi), _c(vi, 23))), t)
        out = b.select(b.fcmp_ordered(">", x, hi), _c(t, float("inf")), out)
        out = b.select(b.fcmp_ordered("<", x, lo), _c(t, 0.0), out)
        return b.select(b.fcmp_unordered("uno", x, x), x, out)  # NaN stays NaN

    def _exp_scalef(self, x: ir.Value) -> ir.Value:
        """AVX-512: the same reduction and polynomial, 2^n applied by vscalefps (y·2^n without forming 2^n, +inf past
        float32's range, NaN for NaN) instead of adding n to the exponent bits and selecting the limits: softmax's exp
        loop 29 instructions for 37 (its exp is most of softmax's time). The clamp keeps the reduction finite for ±inf
        and lets NaN through (compare-and-select: x when the compare fails); 0 below ln(FLT_MIN) as on the other
        path."""
        b, t = self.b, x.type
        lo, hi = _c(t, -88.0), _c(t, 89.0)
        xc = b.select(b.fcmp_ordered("<", x, lo), lo, x)
        xc = b.select(b.fcmp_ordered(">", xc, hi), hi, xc)
        n, y = self._exp_reduced(xc)
        scalef = self.declare("llvm.x86.avx512.mask.scalef.ps.512", t, [t, t, t, ir.IntType(16), I32])
        # all 16 lanes (mask -1), the MXCSR rounding (4)
        out = b.call(scalef, [y, n, y, ir.Constant(ir.IntType(16), -1), ir.Constant(I32, 4)])
        return b.select(b.fcmp_ordered("<", x, _c(t, LN_FLT_MIN)), _c(t, 0.0), out)

    def erf(self, x: ir.Value) -> ir.Value:
        """erf(x) = x·P(x²)/Q(x²) on [-4, 4] (the rational form Eigen uses for float), ±1 beyond."""
        b, t = self.b, x.type
        xc = self.intrinsic("llvm.minnum", t, [self.intrinsic("llvm.maxnum", t, [x, _c(t, -4.0)]), _c(t, 4.0)])
        x2 = b.fmul(xc, xc)
        p = b.fmul(xc, _poly(b, self.fma, x2, [-2.72614225801306e-10, 2.77068142495902e-08, -2.10102402082508e-06,
                                               -5.69250639462346e-05, -7.34990630326855e-04, -2.95459980854025e-03,
                                               -1.60960333262415e-02]))
        q = _poly(b, self.fma, x2, [-1.45660718464996e-05, -2.13374055278905e-04, -1.68282697438203e-03,
                                    -7.37332916720468e-03, -1.42647390514189e-02])
        return b.fdiv(p, q)

    def tanh(self, x: ir.Value) -> ir.Value:
        b, t = self.b, x.type
        ax = self.intrinsic("llvm.fabs", t, [x])
        z = b.fmul(x, x)
        small = self.fma(b.fmul(x, z), _poly(b, self.fma, z, [-5.70498872745e-3, 2.06390887954e-2,
                                                              -5.37397155531e-2, 1.33314422036e-1,
                                                              -3.33332819422e-1]), x)
        e = self.exp(b.fmul(ax, _c(t, 2.0)))
        big = b.fsub(_c(t, 1.0), b.fdiv(_c(t, 2.0), b.fadd(e, _c(t, 1.0))))
        big = self.intrinsic("llvm.copysign", t, [big, x])
        return b.select(b.fcmp_ordered("<", ax, _c(t, 0.625)), small, big)

    def log(self, x: ir.Value) -> ir.Value:
        """Cephes logf: x = m·2^e with m in [√½, √2), log(1 + (m − 1)) by a degree-9 polynomial, + e·ln2 in two
        parts; subnormals scaled by 2^23 first; log(0) = −inf, log(+inf) = +inf, log(x < 0) = NaN = log(NaN)."""
        b, t = self.b, x.type
        n = t.count
        vi = ir.VectorType(I32, n)
        tiny = b.fcmp_ordered("<", x, _c(t, 1.17549435e-38))
        xs = b.select(tiny, b.fmul(x, _c(t, 8388608.0)), x)
        bits = b.bitcast(xs, vi)
        e = b.sub(b.lshr(bits, _c(vi, 23)), _c(vi, 126))
        e = b.sub(e, b.select(tiny, _c(vi, 23), _c(vi, 0)))
        m = b.bitcast(b.or_(b.and_(bits, _c(vi, 0x807FFFFF)), _c(vi, 0x3F000000)), t)
        low = b.fcmp_ordered("<", m, _c(t, 0.707106781186547524))
        e = b.sub(e, b.zext(low, vi))
        m = b.fsub(b.select(low, b.fadd(m, m), m), _c(t, 1.0))
        ef = b.sitofp(e, t)
        z = b.fmul(m, m)
        y = b.fmul(b.fmul(_poly(b, self.fma, m, [7.0376836292e-2, -1.1514610310e-1, 1.1676998740e-1,
                                                 -1.2420140846e-1, 1.4249322787e-1, -1.6668057665e-1,
                                                 2.0000714765e-1, -2.4999993993e-1, 3.3333331174e-1]), m), z)
        y = self.fma(ef, _c(t, -2.12194440e-4), y)
        y = self.fma(z, _c(t, -0.5), y)
        r = self.fma(ef, _c(t, 0.693359375), b.fadd(m, y))
        r = b.select(b.fcmp_ordered("==", x, _c(t, float("inf"))), x, r)
        r = b.select(b.fcmp_ordered("==", x, _c(t, 0.0)), _c(t, float("-inf")), r)
        return b.select(b.fcmp_unordered("<", x, _c(t, 0.0)), _c(t, float("nan")), r)  # x < 0 or NaN

    def sigmoid(self, x: ir.Value) -> ir.Value:
        t = x.type
        return self.b.fdiv(_c(t, 1.0), self.b.fadd(_c(t, 1.0), self.exp(self.b.fneg(x))))
