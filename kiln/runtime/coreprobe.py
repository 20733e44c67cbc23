"""How far apart the host put this process's first two CPUs right now: one cache line bounced between them.

A virtualized host may move a guest's vCPUs between cores that share an L3 and cores that do not, for seconds at a
time, invisibly to the guest (measured on a Zen 4 guest: a round trip of ~55 ns in the first state, ~330 ns in the
second). Timings differ between the states, and a schedule may win in one and lose in the other (issue 14: the
tuned Winograd product of conv_r50_3x3 at AVX2, 0.998× the default on one L3, 1.073× on two). So a measurement that
compares builds says which state each of its batches ran in (`tune/verify.py`, `benchmarks/cross_l3.py`).

The probe is JIT-compiled like the thread pool (no C compiler needed at run time): `kiln_ping` on the calling thread
and `kiln_pong` on a helper thread, each pinned to one of the two CPUs, hand one 64-byte-aligned word back and
forth with release stores and acquire loads; ctypes drops the GIL for both calls."""
from __future__ import annotations

import ctypes
import functools
import os
import threading
import time

import numpy as np
from llvmlite import ir

from kiln.codegen.loops import emit_loop

I64 = ir.IntType(64)
# between one L3's round trip (Zen 4 ~55 ns, Zen 5 ~45, an Emerald Rapids guest's mesh ~125–140 with one 300 MB L3)
# and two L3s' (Zen 4 ~330 ns, Zen 5 ~400): at 150 the Intel guest's single L3 was read as two in half the probes
TWO_L3_NS = 230.0
ROUND_TRIPS = 4000  # ~0.2 ms on one L3, ~1.3 ms on two


def build_module() -> ir.Module:
    """kiln_ping(flag, i0, n): for i0 <= i < n: *flag = 2i+1; wait for *flag == 2i+2.
    kiln_pong(flag, i0, n): for i0 <= i < n: wait for *flag == 2i+1; *flag = 2i+2."""
    m = ir.Module("kiln_coreprobe")
    pause = ir.Function(m, ir.FunctionType(ir.VoidType(), []), "llvm.x86.sse2.pause")
    for name, first_store in (("kiln_ping", True), ("kiln_pong", False)):
        f = ir.Function(m, ir.FunctionType(ir.VoidType(), [I64.as_pointer(), I64, I64]), name)
        flag, i0, n = f.args
        b = ir.IRBuilder(f.append_basic_block("entry"))

        def round_trip(i: ir.Value, b: ir.IRBuilder = b, f: ir.Function = f, flag: ir.Value = flag,
                       first_store: bool = first_store) -> ir.Value:
            odd = b.add(b.mul(i, ir.Constant(I64, 2)), ir.Constant(I64, 1))
            even = b.add(odd, ir.Constant(I64, 1))
            if first_store:
                b.store_atomic(odd, flag, "release", 8)
            wait, spin, done = (f.append_basic_block(x) for x in ("wait", "spin", "arrived"))
            b.branch(wait)
            b.position_at_end(wait)
            seen = b.load_atomic(flag, "acquire", 8, typ=I64)
            b.cbranch(b.icmp_signed("==", seen, even if first_store else odd), done, spin)
            b.position_at_end(spin)
            b.call(pause, [])
            b.branch(wait)
            b.position_at_end(done)
            if not first_store:
                b.store_atomic(even, flag, "release", 8)
            return ir.Constant(I64, 1)
        emit_loop(b, i0, n, round_trip)
        b.ret_void()
    return m


@functools.cache
def _functions() -> tuple[object, ctypes._CFuncPtr, ctypes._CFuncPtr]:
    from kiln.codegen.jit import LoadedObject, emit_object, optimize
    from kiln.codegen.module import opaque_pointers
    from kiln.target import host

    with opaque_pointers():
        text = str(build_module())
    tgt = host()
    loaded = LoadedObject(emit_object(optimize(text, tgt), tgt), tgt)
    sig = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64)
    return loaded, sig(loaded.address("kiln_ping")), sig(loaded.address("kiln_pong"))


def round_trip_ns(round_trips: int = ROUND_TRIPS) -> float:
    """Mean ns for one cache line to go from the process's first CPU to its second and back; NaN when the process
    may run on fewer than two CPUs (or the platform cannot pin threads)."""
    try:
        cpus = sorted(os.sched_getaffinity(0))
    except AttributeError:
        return float("nan")
    if len(cpus) < 2:
        return float("nan")
    _, ping, pong = _functions()
    word = np.zeros(16, np.int64)            # 128 bytes: one aligned 64-byte line inside it
    addr = word.ctypes.data
    addr += -addr % 64

    def partner() -> None:
        os.sched_setaffinity(0, {cpus[1]})   # (pid 0 = this thread on Linux)
        pong(addr, 0, round_trips + 1)

    t = threading.Thread(target=partner, daemon=True)
    try:
        os.sched_setaffinity(0, {cpus[0]})
        t.start()
        ping(addr, 0, 1)                     # both threads running and pinned before the clock starts
        start = time.perf_counter()
        ping(addr, 1, round_trips + 1)
        elapsed = time.perf_counter() - start
    finally:
        t.join()
        os.sched_setaffinity(0, set(cpus))
    return elapsed / round_trips * 1e9



def two_l3(ns: float) -> bool:
    return bool(ns >= TWO_L3_NS)


def host_state() -> str:
    """"one L3" or "two L3s" now; "–" where the probe cannot run (fewer than two CPUs)."""
    ns = round_trip_ns()
    return "–" if ns != ns else "two L3s" if two_l3(ns) else "one L3"
