"""bfloat16 ⇔ float32 in LLVM IR, on any ISA (bfloat16 is the upper 16 bits of a float32).

    widen:  f32 = bitcast(zext(bits) << 16)                                 exact
    round:  bits = (u + 0x7FFF + ((u >> 16) & 1)) >> 16,  u = bitcast(f32)  round to nearest, ties to even
            a NaN keeps its sign and payload's top bits and is made quiet (bit 6 of the bf16 set), so it never
            rounds into an infinity

The rounding is integer arithmetic (five vector operations per register), not LLVM's `fptrunc … to bfloat`:
without AVX512_BF16 that becomes a libcall (`__truncsfbf2`) the JIT cannot resolve. Where the target has
AVX512_BF16 the backend's vcvtneps2bf16 computes the same function (RNE, quiet NaNs; float32 denormals flushed
to zero) in one instruction, and is used there (`native_rounding`). The AMX and vdpbf16ps kernels
(kiln/ukernels/amx.py, codegen/dpbf16.py) read operands in this form. NumPy's side of the same rounding is
ml_dtypes' bfloat16 (graph/passes/precision.py)."""
from __future__ import annotations

import struct

from llvmlite import ir

from kiln.target import Target, features_on

I16, I32 = ir.IntType(16), ir.IntType(32)
F32 = ir.FloatType()


def _like(t: ir.Type, elem: ir.Type) -> ir.Type:
    return ir.VectorType(elem, t.count) if isinstance(t, ir.VectorType) else elem


def _k(t: ir.Type, v: int) -> ir.Constant:
    return ir.Constant(t, [v] * t.count) if isinstance(t, ir.VectorType) else ir.Constant(t, v)


def bf16_to_f32(b: ir.IRBuilder, bits: ir.Value) -> ir.Value:
    """i16 (or <n x i16>) bfloat16 bits → the float32 value (exact)."""
    wide = b.zext(bits, _like(bits.type, I32))
    return b.bitcast(b.shl(wide, _k(wide.type, 16)), _like(bits.type, F32))


def _widened_bits(x: ir.Value) -> ir.Value | None:
    """The i16 bits x was widened from by bf16_to_f32 (bitcast(zext(bits) << 16)), else None."""
    if not (isinstance(x, ir.CastInstr) and x.opname == "bitcast"):
        return None
    shl = x.operands[0]
    if not (isinstance(shl, ir.Instruction) and shl.opname == "shl" and isinstance(shl.operands[1], ir.Constant)):
        return None
    amount = shl.operands[1].constant
    lanes = [getattr(a, "constant", a) for a in amount] if isinstance(amount, list) else [amount]
    zext = shl.operands[0]
    if set(lanes) != {16} or not (isinstance(zext, ir.CastInstr) and zext.opname == "zext"):
        return None
    bits = zext.operands[0]
    return bits if bits.type == _like(x.type, I16) else None


class BFloatType(ir.Type):
    """LLVM's `bfloat` (llvmlite has no such type): vcvtneps2bf16's result, the vdpbf16ps operands' element."""

    def _to_string(self) -> str:
        return "bfloat"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, BFloatType)

    def __hash__(self) -> int:
        return hash("bfloat")


BF16 = BFloatType()


def native_rounding(target: Target | None) -> bool:
    """Does `target` round float32 → bf16 in one instruction (vcvtneps2bf16)? Its 128/256-bit forms (and a scalar)
    need AVX512VL too."""
    return target is not None and target.arch == "x86_64" and {"avx512bf16", "avx512vl"} <= features_on(
        target.features)


def f32_to_bf16(b: ir.IRBuilder, x: ir.Value, native: bool = False) -> ir.Value:
    """float32 (or <n x float>) → i16 bfloat16 bits, rounded to nearest even; NaN stays a (quiet) NaN.
    A value just widened from bf16 is its own bits (a bf16 copy — the AMX packing stages — stays a copy, which
    LLVM can vectorize, instead of a round trip whose NaN quieting it cannot fold away).
    `native` (a target with AVX512_BF16: `native_rounding`): `fptrunc … to bfloat`, one vcvtneps2bf16 per register
    instead of the integer sequence — the same bits except for float32 denormals, which it flushes to ±0 (it
    treats input denormals as zero, Intel SDM); their bf16 values are themselves below 1.2e-38."""
    same = _widened_bits(x)
    if same is not None:
        return same
    if native:
        return b.bitcast(b.fptrunc(x, _like(x.type, BF16)), _like(x.type, I16))
    it = _like(x.type, I32)
    u = b.bitcast(x, it)
    lsb = b.and_(b.lshr(u, _k(it, 16)), _k(it, 1))
    rounded = b.lshr(b.add(u, b.add(lsb, _k(it, 0x7FFF))), _k(it, 16))
    quiet = b.or_(b.lshr(u, _k(it, 16)), _k(it, 0x40))
    is_nan = b.fcmp_unordered("uno", x, x)
    return b.trunc(b.select(is_nan, quiet, rounded), _like(x.type, I16))


def bf16_bits(value: float) -> int:
    """The bfloat16 bits of a Python float (rounded as f32_to_bf16 rounds)."""
    u = struct.unpack("<I", struct.pack("<f", value))[0]
    if value != value:  # NaN
        return (u >> 16) | 0x40
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) & 0xFFFF


def bf16_bits_const(value: float) -> ir.Constant:
    return ir.Constant(I16, bf16_bits(value))
