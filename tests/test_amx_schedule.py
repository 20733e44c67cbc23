"""The AMX schedules of the integer anchors (kiln/schedule/amx.py through schedule/int8.py), on every host:

  * emulated — the nest (rows in place or packed, K steps, panels, edge tiles, the requantizing epilogue on the int32
    C block) runs with the tile kernels replaced by a NumPy implementation of their documented contract
    (kiln/ukernels/amx.py), called back from the compiled code; outputs exact against onnxruntime. This checks
    everything around the kernels on a host without AMX;
  * emitted — the real tile kernels lowered for an AVX-512 + AMX target and emitted (tdpbusd in the object);
  * on AMX hardware (skipped elsewhere) — the real thing, exact against onnxruntime.
The tile kernels themselves are checked against NumPy on AMX hosts by tests/test_amx.py."""
from __future__ import annotations

import ctypes
import dataclasses
import re

import llvmlite.binding as llvm
import numpy as np
import pytest
from test_ops_quant import qlinear_conv_model, qlinear_matmul_model

import kiln
import kiln.schedule.amx as amx_schedule
from conftest import rand, run_ort
from kiln.runtime.amx import usable
from kiln.target import resolve
from kiln.ukernels.amx import DTYPES, TILE_BYTES, AMXKernel, kernel_name

I64 = ctypes.c_int64
EMUL_T = ctypes.CFUNCTYPE(None, I64, ctypes.c_void_p, ctypes.c_void_p, I64, ctypes.c_void_p, ctypes.c_void_p, I64,
                          I64, I64, I64, I64, I64, I64, ctypes.c_int32)
ARGS = ("ptr %A0, ptr %A1, i64 %lda, ptr %B, ptr %C, i64 %ldc, i64 %n2, i64 %sa2, i64 %n1, i64 %sa1, i64 %n0, "
        "i64 %sa0, i32 %acc")
KERNELS: list[tuple[str, int, int, int, int]] = []   # (dtype, MT, NT, MR, KB) by the id the IR passes
CALLS: list[int] = [0]


def _bytes(addr: int, n: int, dtype: str) -> np.ndarray:
    """n elements at addr: u8 / s8 as int64, or (dtype "b") bf16 as float64."""
    if dtype == "b":
        bits = np.frombuffer(ctypes.string_at(addr, 2 * n), np.uint16).astype(np.uint32) << 16
        return bits.view(np.float32).astype(np.float64)
    return np.frombuffer(ctypes.string_at(addr, n), np.uint8 if dtype == "u" else np.int8).astype(np.int64)


def _emulate(kid, a0, a1, lda, b, c, ldc, n2, sa2, n1, sa1, n0, sa0, acc) -> None:  # noqa: ANN001
    """The tile kernel's contract (kiln/ukernels/amx.py) in NumPy: C (+)= Σ over the steps of A tiles · B step."""
    dtype, mt, nt, mr, kb = KERNELS[kid]
    CALLS[0] += 1
    size, pair = DTYPES[dtype][:2]
    kinds = ("b", "b") if dtype == "bf16" else (dtype[0], dtype[2])
    cols, c_type = nt * 16, (ctypes.c_float if dtype == "bf16" else ctypes.c_int32)
    out = np.zeros((mt * mr, cols), np.float64 if dtype == "bf16" else np.int64)
    step = (kb // pair) * nt * TILE_BYTES  # bytes of B per step
    s = 0
    for i2 in range(n2):
        for i1 in range(n1):
            for i0 in range(n0):
                off = i2 * sa2 + i1 * sa1 + i0 * sa0
                bs = _bytes(b + s * step, step // size, kinds[1])
                bk = bs.reshape(kb // pair, cols, pair).transpose(0, 2, 1).reshape(kb, cols)
                for t, at in enumerate((a0, a1)[:mt]):
                    rows = np.stack([_bytes(at + off + r * lda, kb, kinds[0]) for r in range(mr)])
                    out[t * mr:(t + 1) * mr] += rows @ bk
                s += 1
    for r in range(mt * mr):
        row = (c_type * cols).from_address(c + r * ldc)
        old = np.frombuffer(row, np.float32 if dtype == "bf16" else np.int32).astype(out.dtype) if acc else 0
        row[:] = (out[r] + old).astype(np.float32 if dtype == "bf16" else np.int32).tolist()


_CALLBACK = EMUL_T(_emulate)


@pytest.fixture
def emulated_amx(monkeypatch: pytest.MonkeyPatch) -> None:
    """AMX 'usable', its tile kernels forwarding to _emulate, configuration and release no-ops. Not on an SSE-only
    host: every AMX CPU has AVX-512, and the AMX nest takes the 16- or 32-column panels of 256/512-bit vectors."""
    from kiln.target import host
    if host().vector_bits < 256:
        pytest.skip("an SSE-only host: its 8-column panels are no AMX tile's (AMX CPUs have AVX-512)")
    def kernel(dtype: str, mt: int = 2, nt: int = 2, mr: int = 16, kb: int | None = None,
               prefetch: int = 0) -> AMXKernel:
        kb = kb or TILE_BYTES // DTYPES[dtype][0]
        KERNELS.append((dtype, mt, nt, mr, kb))
        name = kernel_name(dtype, mt, nt, mr, kb, prefetch)
        ir = (f"define internal void @{name}({ARGS}) {{\n"
              f"  call void @kiln_test_amx_emulated(i64 {len(KERNELS) - 1}, ptr %A0, ptr %A1, i64 %lda, ptr %B, "
              "ptr %C, i64 %ldc, i64 %n2, i64 %sa2, i64 %n1, i64 %sa1, i64 %n0, i64 %sa0, i32 %acc)\n  ret void\n}\n"
              "declare void @kiln_test_amx_emulated(i64, ptr, ptr, i64, ptr, ptr, i64, i64, i64, i64, i64, i64, i64, "
              "i32)\n")
        return AMXKernel(name, dtype, mt, nt, mr, kb, ir)

    monkeypatch.setattr(amx_schedule, "usable", lambda features: True)
    monkeypatch.setattr(amx_schedule, "amx_kernel", kernel)
    monkeypatch.setattr(amx_schedule, "config_ir",
                        lambda dtype, mr, kb: f"define internal void @{amx_schedule.config_name(dtype, mr, kb)}() "
                                              "{\n  ret void\n}\n")
    monkeypatch.setattr(amx_schedule, "release_ir",
                        lambda: f"define internal void @{amx_schedule.RELEASE}() {{\n  ret void\n}}\n")
    monkeypatch.setattr("kiln.runtime.amx.ensure", lambda: None)
    llvm.add_symbol("kiln_test_amx_emulated", ctypes.cast(_CALLBACK, ctypes.c_void_p).value)


def vnni_host() -> None:
    """Skip an int8 AMX case on a host taken as one without VNNI (KILN_HOST_VECTOR_BITS): every AMX CPU has
    AVX512-VNNI, and without it the weights are int16 pairs (graph/quant_pack.py dot_group), which no AMX tile reads."""
    from kiln.target import host, vnni_widths
    if not vnni_widths(host()):
        pytest.skip("a host without VNNI packs int16 weights: no AMX CPU is one")


def cases() -> list[tuple[str, object, dict[str, np.ndarray]]]:
    u8 = rand(1, 32, 9, 7, lo=0, hi=255, dtype="uint8")           # a 32-channel block: 32-byte steps, rows in place
    s8 = rand(1, 64, 6, 6, lo=-128, hi=127, dtype="int8", seed=3)  # stride 2: packed rows (im2col), 64-byte steps
    a = rand(2, 19, 128, lo=0, hi=255, dtype="uint8", seed=8)      # 19 rows: a 16-row block and an edge tile
    return [("conv3x3", qlinear_conv_model(u8, 48, 1, "uint8", True), {"x": u8}),   # 16-column panels
            ("conv stride 2", qlinear_conv_model(s8, 32, 1, "int8", False, stride=2), {"x": s8}),
            ("matmul", qlinear_matmul_model(a, 48), {"a": a})]


@pytest.mark.parametrize("case", range(3), ids=[c[0] for c in cases()])
def test_int8_amx_schedule_emulated(emulated_amx: None, case: int) -> None:
    vnni_host()
    _, m, feeds = cases()[case]
    exe = kiln.compile(m, num_threads=2, cache=False)  # the host's widest vectors: 32- or 16-column panels
    assert set(exe.meta["precision"].values()) == {"amx"}, exe.meta["precision"]
    assert exe.meta["int8"].startswith("tdpbusd (AMX tiles)")
    before = CALLS[0]
    got, want = exe.run(feeds)[0], run_ort(m, feeds)[0]
    assert CALLS[0] > before, "the emulated tile kernels were not called"
    assert got.dtype == want.dtype and np.array_equal(got, want), np.abs(got.astype(int) - want.astype(int)).max()


def test_int8_amx_objects_emitted(monkeypatch: pytest.MonkeyPatch) -> None:
    """The real tile kernels, lowered for AVX-512 + AMX and emitted on any host: tdpbusd / tdpbssd in the object."""
    from kiln.codegen.jit import emit_assembly, emit_object, optimize
    from kiln.compiler import check_options, lower

    monkeypatch.setattr(amx_schedule, "usable", lambda features: True)
    t = resolve("avx512")
    t = dataclasses.replace(t, features=t.features + ",+amx-tile,+amx-int8,+amx-bf16")
    for name, m, _ in cases():
        c = lower(m, t, 2, check_options({}), stop_after="llvm")
        assert {how for k in c.program.kernels for how in k.precision.values()} == {"amx"}, name
        module = optimize(c.llvm_ir, t)
        assert emit_object(module, t)[:4] == b"\x7fELF"
        assert re.search(r"\btdpb(us|ss)d\b", emit_assembly(module, t)), f"{name}: no AMX int8 product"


@pytest.mark.skipif(not usable(resolve("host").features), reason="needs AMX")
def test_int8_amx_on_hardware() -> None:
    for _, m, feeds in cases():
        exe = kiln.compile(m, num_threads=2, cache=False)
        assert set(exe.meta["precision"].values()) == {"amx"}, exe.meta["precision"]
        assert np.array_equal(exe.run(feeds)[0], run_ort(m, feeds)[0])


@pytest.mark.parametrize("name", ["gemm_odd", "conv_r50_3x3"])
def test_bf16_amx_schedule_emulated(emulated_amx: None, name: str) -> None:
    """precision="bf16" on the emulated tile kernels against the same build without AMX (vdpbf16ps or the emulation):
    the same bf16 products, float32 sums in another order."""
    from conftest import assert_close
    from kiln import zoo

    m, feeds = zoo.build(name), zoo.inputs(name)
    exe = kiln.compile(m, num_threads=2, cache=False, precision="bf16", native_bf16_only=False)
    assert "amx" in set(exe.meta["precision"].values()), exe.meta["precision"]
    before = CALLS[0]
    got = exe.run(feeds)[0]
    assert CALLS[0] > before
    want = kiln.compile(m, num_threads=2, cache=False, precision="bf16", amx=False,
                        native_bf16_only=False).run(feeds)[0]
    assert_close(got, want, 1e-4)


@pytest.mark.parametrize("case", [0, 2], ids=["conv3x3", "matmul"])
def test_int8_amx_knobs(emulated_amx: None, case: int, tmp_path) -> None:
    """The AMX nest is a space (schedule/amx.py knobs `amx_order`, `amx_parts`, `amx_prefetch`): its default point is
    the heuristic's nest, and random points, applied by kiln.compile as tuning records, give onnxruntime's result
    exactly (every point computes the same C blocks, each whole in one tile-kernel call)."""
    import random

    from test_tune import db_with_best
    vnni_host()

    from kiln.schedule.config import Decisions
    from kiln.schedule.default import schedule_kernel
    from kiln.tune.space import Space
    from kiln.tune.tuner import kernels_of
    from kiln.tune.workload import fresh, signature, workloads_of

    _, m, feeds = cases()[case]
    t = resolve("host")
    w = max(workloads_of(kernels_of(m, t, 2, {})), key=lambda x: x.flops)
    space = Space(w.kernel, t, 2, {})
    names = {k.split(":")[1] for k in space.default}
    assert {"amx_order", "amx_parts", "amx_prefetch"} <= names, sorted(space.default)
    plain, dflt = fresh(w.kernel), fresh(w.kernel)
    schedule_kernel(plain, t, 2, {})
    schedule_kernel(dflt, t, 2, {}, Decisions(space.default, strict=True))
    assert str(plain) == str(dflt)
    want = run_ort(m, feeds)[0]
    rng, sig, seen = random.Random(5), signature(w.kernel), set()
    for i in range(4):
        cand = space.sample(rng)
        assert cand is not None
        seen.add(tuple(sorted((k, v) for k, v in cand.config.items() if "amx" in k)))
        db_with_best(tmp_path / f"{i}.db", m, t, lambda sp, c=cand.config: c if signature(sp.kernel) == sig
                     else None).close()
        exe = kiln.compile(m, num_threads=2, cache=False, tuning=str(tmp_path / f"{i}.db"))
        assert set(exe.meta["precision"].values()) == {"amx"}, exe.meta["precision"]
        if cand.config != space.default:  # the record was applied
            assert [v["sig"] for v in exe.meta["tuned"].values()] == [sig]
        got = exe.run(feeds)[0]
        assert np.array_equal(got, want), (cand.config, np.abs(got.astype(int) - want.astype(int)).max())
    assert len(seen) > 1, seen


@pytest.mark.skipif(not usable(resolve("host").features), reason="needs AMX")
def test_int8_amx_candidates_measured() -> None:
    """The tuner's measuring child runs AMX candidates (it requests the tile permission first: without it the first
    tile instruction is SIGILL); each point's outputs are the default's, bit for bit — the panel order, and the tile
    kernel's prefetch of B off (the default prefetches 6 KiB ahead, past B's end too)."""
    from kiln.tune.measure import Measurer, build_candidate
    from kiln.tune.space import Space
    from kiln.tune.tuner import kernels_of
    from kiln.tune.workload import workloads_of

    _, m, _ = cases()[2]
    t = resolve("host")
    w = max(workloads_of(kernels_of(m, t, 2, {})), key=lambda x: x.flops)
    space = Space(w.kernel, t, 2, {})
    order = next(k for k in space.knobs if k.endswith(":amx_order"))
    prefetch = next(k for k in space.knobs if k.endswith(":amx_prefetch"))
    assert space.default[prefetch] > 0
    points = [{order: "panels"}, {order: "blocks"}, {prefetch: 0}]
    with Measurer(timeout_s=30.0) as meas:
        results = [meas.measure(build_candidate(w.kernel, t, 2, {}, {**space.default, **p}), t, 2) for p in points]
    assert [r.status for r in results] == ["ok"] * 3, [r.detail for r in results]
    a = results[0].outputs
    for r in results[1:]:
        assert a.keys() == r.outputs.keys() and all(np.array_equal(a[k], r.outputs[k]) for k in a)
