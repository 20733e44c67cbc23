"""float32 → bfloat16 rounding in LLVM IR (kiln/codegen/bf16.py), both forms, against ml_dtypes (NumPy's bfloat16):
the integer sequence every target gets, and vcvtneps2bf16 (`native=True`) where the target has AVX512_BF16. Same
bits for every normal value, tie, infinity and NaN (a NaN stays a NaN); float32 denormals: the integer form rounds
them as ml_dtypes does, the instruction flushes them to ±0 (Intel SDM: input denormals are treated as zero)."""
from __future__ import annotations

import ctypes

import ml_dtypes
import numpy as np
import pytest
from llvmlite import ir

from kiln.codegen.bf16 import f32_to_bf16, native_rounding
from kiln.codegen.jit import LoadedObject, emit_assembly, emit_object, optimize
from kiln.target import resolve, runs_here, with_features

LANES = 16


def values() -> np.ndarray:
    rng = np.random.default_rng(0)
    bits = rng.integers(0, 2**32, 4096, dtype=np.uint64).astype(np.uint32)
    special = np.array([0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, np.nan, 3.4028235e38, -3.4028235e38, 1.1754944e-38,
                        65504.0, 1 / 3, 2.0 ** -126], np.float32)
    ties = np.array([0x3F808000, 0x3F818000, 0xBF808000, 0x7F7F8000, 0x00018000, 0x7FC00001, 0xFF800001],
                    np.uint32).view(np.float32)   # halfway cases (even and odd), rounding into infinity, NaN payloads
    out = np.concatenate([bits.view(np.float32), special, ties])
    return np.concatenate([out, np.zeros(-len(out) % LANES, np.float32)])


def module(native: bool) -> str:
    m = ir.Module("round")
    f32v = ir.VectorType(ir.FloatType(), LANES)
    fn = ir.Function(m, ir.FunctionType(ir.VoidType(), [ir.PointerType(), ir.PointerType(), ir.IntType(64)]), "rnd")
    src, dst, n = fn.args
    entry, loop, done = fn.append_basic_block(), fn.append_basic_block(), fn.append_basic_block()
    b = ir.IRBuilder(entry)
    b.branch(loop)
    b.position_at_end(loop)
    i = b.phi(ir.IntType(64))
    i.add_incoming(ir.Constant(ir.IntType(64), 0), entry)
    x = b.load(b.gep(src, [i], source_etype=ir.FloatType()), typ=f32v, align=4)
    b.store(f32_to_bf16(b, x, native), b.gep(dst, [i], source_etype=ir.IntType(16)), align=2)
    nxt = b.add(i, ir.Constant(ir.IntType(64), LANES))
    i.add_incoming(nxt, loop)
    b.cbranch(b.icmp_unsigned("<", nxt, n), loop, done)
    b.position_at_end(done)
    b.ret_void()
    return str(m)


def bf16_bits_of(x: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore"):  # NaN lanes (compared as NaNs, not by bits)
        return x.astype(ml_dtypes.bfloat16).view(np.uint16)


@pytest.mark.parametrize("native", [False, True], ids=["integer", "vcvtneps2bf16"])
def test_rounding_matches_ml_dtypes(native: bool) -> None:
    target = resolve("host")
    if target.arch != "x86_64":
        pytest.skip("x86 forms")
    if native and not native_rounding(target):
        # this CPU cannot run it: emit it for an AVX512_BF16 target and check the instruction is there
        t = with_features(resolve("avx512"), "avx512bf16", "avx512vl")
        assert native_rounding(t)
        asm = emit_assembly(optimize(module(True), t), t)
        assert "vcvtneps2bf16" in asm
        return
    assert runs_here(target)
    obj = LoadedObject(emit_object(optimize(module(native), target), target), target)
    rnd = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)(obj.address("rnd"))
    x = values()
    got = np.empty(len(x), np.uint16)
    rnd(x.ctypes.data, got.ctypes.data, len(x))
    want = bf16_bits_of(x)
    nan = np.isnan(x)
    got_f = got.astype(np.uint32) << 16
    assert np.isnan(got_f.view(np.float32)[nan]).all(), "a NaN must stay a NaN"
    denormal = (np.abs(x) < np.finfo(np.float32).tiny) & (x != 0)
    keep = ~nan & ~denormal if native else ~nan
    np.testing.assert_array_equal(got[keep], want[keep])
    if native:  # flushed to zero with the sign kept
        np.testing.assert_array_equal(got[denormal], np.where(np.signbit(x[denormal]), 0x8000, 0).astype(np.uint16))
    if native:
        assert "vcvtneps2bf16" in emit_assembly(optimize(module(True), target), target)
