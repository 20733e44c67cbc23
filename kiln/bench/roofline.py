"""The machine's roofline, measured with code Kiln emits itself through llvmlite.

Peak fp32 FLOP/s: a loop of `llvm.fma.v16f32` over many independent accumulators (enough to cover
the FMA latency times its throughput), JIT-compiled for the host CPU and run on N Python threads at
once (ctypes releases the GIL during the call). Bandwidth: a STREAM triad a = b + s*c, emitted the
same way, over arrays far larger than the L3 (DRAM) and over arrays that fit in it (L3).
"""
from __future__ import annotations

import ctypes
import os
import platform
import sys
import threading
import time
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

VEC = 16  # <16 x float>: one zmm on AVX-512, two ymm on AVX2


@dataclass
class Roofline:
    peak_gflops: float          # all threads, from CPU time (the hardware's peak)
    peak_gflops_1t: float       # one thread
    peak_gflops_wall: float     # all threads, from wall time: lower when the host was busy
    bandwidth_gbs: float        # DRAM triad, all threads
    l3_bandwidth_gbs: float     # triad on arrays that fit in the L3
    threads: int
    accumulators: int

    @property
    def host_busy(self) -> bool:
        """Other load on the machine while measuring (then timings are noisy too)."""
        return self.peak_gflops_wall < 0.85 * self.peak_gflops

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "host_busy": self.host_busy}


# ---- emitted kernels ----------------------------------------------------------------------------

def _features() -> str:
    import llvmlite.binding as llvm
    return llvm.get_host_cpu_features().flatten()


def default_accumulators(features: str | None = None) -> int:
    # 12 x zmm in the 32 AVX-512 registers; without AVX-512 a v16f32 is two ymm of only 16, so 6; SSE four xmm, 3
    feats = (_features() if features is None else features).split(",")
    return 12 if "+avx512f" in feats else 6 if "+avx" in feats or "+avx2" in feats else 3


def fma_ir(accumulators: int, unroll: int = 4, fused: bool = True) -> str:
    """void fma_peak(i64 iters, float* io): io = x[16], y[16], acc[accumulators][16]. `fused=False` (a width
    without FMA: SSE): llvm.fmuladd, a multiply and an add — what Kiln's code for that width does."""
    import llvmlite.ir as ir
    f32, i64 = ir.FloatType(), ir.IntType(64)
    vty = ir.VectorType(f32, VEC)
    mod = ir.Module(name="kiln_roofline_fma")
    fma = ir.Function(mod, ir.FunctionType(vty, [vty, vty, vty]),
                      name="llvm.fma.v16f32" if fused else "llvm.fmuladd.v16f32")
    fn = ir.Function(mod, ir.FunctionType(ir.VoidType(), [i64, f32.as_pointer()]), name="fma_peak")
    iters, io = fn.args
    entry, loop, done = (fn.append_basic_block(n) for n in ("entry", "loop", "done"))
    b = ir.IRBuilder(entry)

    def vptr(k: int) -> ir.Value:
        return b.bitcast(b.gep(io, [ir.Constant(i64, VEC * k)]), vty.as_pointer())

    x, y = (b.load(vptr(k), align=4) for k in (0, 1))
    init = [b.load(vptr(2 + k), align=4) for k in range(accumulators)]
    b.branch(loop)
    b.position_at_end(loop)
    i = b.phi(i64)
    i.add_incoming(ir.Constant(i64, 0), entry)
    phis = [b.phi(vty) for _ in range(accumulators)]
    accs = list(phis)
    for _ in range(unroll):  # independent chains: each acc depends only on itself
        accs = [b.call(fma, [a, x, y]) for a in accs]
    nxt = b.add(i, ir.Constant(i64, 1))
    for phi, v0, v1 in zip(phis, init, accs):
        phi.add_incoming(v0, entry)
        phi.add_incoming(v1, loop)
    i.add_incoming(nxt, loop)
    b.cbranch(b.icmp_signed("<", nxt, iters), loop, done)
    b.position_at_end(done)
    for k, phi_out in enumerate(accs):  # stored, so nothing can be optimized away
        b.store(phi_out, vptr(2 + k), align=4)
    b.ret_void()
    return str(mod)


def triad_ir() -> str:
    """void triad(float* a, float* b, float* c, float s, i64 n): a = b + s*c, n a multiple of 16."""
    import llvmlite.ir as ir
    f32, i64 = ir.FloatType(), ir.IntType(64)
    vty, fp = ir.VectorType(f32, VEC), f32.as_pointer()
    mod = ir.Module(name="kiln_roofline_triad")
    fma = ir.Function(mod, ir.FunctionType(vty, [vty, vty, vty]), name="llvm.fma.v16f32")
    fn = ir.Function(mod, ir.FunctionType(ir.VoidType(), [fp, fp, fp, f32, i64]), name="triad")
    pa, pb, pc, s, n = fn.args
    entry, loop, done = (fn.append_basic_block(name) for name in ("entry", "loop", "done"))
    b = ir.IRBuilder(entry)
    sv = b.insert_element(ir.Constant(vty, None), s, ir.Constant(ir.IntType(32), 0))
    sv = b.shuffle_vector(sv, ir.Constant(vty, None), ir.Constant(ir.VectorType(ir.IntType(32), VEC),
                                                                  [0] * VEC))
    b.cbranch(b.icmp_signed(">", n, ir.Constant(i64, 0)), loop, done)
    b.position_at_end(loop)
    i = b.phi(i64)
    i.add_incoming(ir.Constant(i64, 0), entry)

    def at(p: ir.Value) -> ir.Value:
        return b.bitcast(b.gep(p, [i]), vty.as_pointer())

    # align 4: numpy buffers are not 64-byte aligned, and an aligned vector load would fault.
    va = b.call(fma, [sv, b.load(at(pc), align=4), b.load(at(pb), align=4)])
    b.store(va, at(pa), align=4)
    nxt = b.add(i, ir.Constant(i64, VEC))
    i.add_incoming(nxt, loop)
    b.cbranch(b.icmp_signed("<", nxt, n), loop, done)
    b.position_at_end(done)
    b.ret_void()
    return str(mod)


class _Jit:
    """An MCJIT engine for the host CPU holding one module; keep it alive while calling."""

    def __init__(self, ir_text: str, features: str | None = None) -> None:
        import llvmlite.binding as llvm
        llvm.initialize_native_target()
        llvm.initialize_native_asmprinter()
        target = llvm.Target.from_default_triple()
        self.tm = target.create_target_machine(cpu=llvm.get_host_cpu_name(), features=features or _features(),
                                               opt=3, codemodel="large")  # why: kiln/codegen/jit.py code_model
        mod = llvm.parse_assembly(ir_text)
        mod.verify()
        self.engine = llvm.create_mcjit_compiler(mod, self.tm)
        self.engine.finalize_object()

    def func(self, name: str, restype: Any, *argtypes: Any) -> Any:
        return ctypes.CFUNCTYPE(restype, *argtypes)(self.engine.get_function_address(name))


# ---- measurements -------------------------------------------------------------------------------

def _parallel(threads: int, work: Any) -> tuple[float, list[float]]:
    """Run work(t) on `threads` Python threads released together: (wall seconds of the slowest,
    each thread's own CPU seconds)."""
    barrier = threading.Barrier(threads + 1)
    cpu = [0.0] * threads

    def body(t: int) -> None:
        barrier.wait()
        c0 = time.thread_time()
        work(t)
        cpu[t] = time.thread_time() - c0

    pool = [threading.Thread(target=body, args=(t,)) for t in range(threads)]
    for th in pool:
        th.start()
    barrier.wait()
    t0 = time.perf_counter()
    for th in pool:
        th.join()
    return time.perf_counter() - t0, cpu


def measure_peak(threads: int, seconds: float = 0.2, repeats: int = 5,
                 accumulators: int | None = None, unroll: int = 4, features: str | None = None) -> tuple[float, float]:
    """Best GFLOP/s over `repeats` runs of about `seconds` each, on `threads` threads:
    (from each thread's CPU time, from wall time). The machine is shared: another tenant's load
    shows in wall time, while CPU time gives what the cores do when they run - the hardware peak.
    `features`: the peak of code limited to those LLVM features (a narrower x86 width: target.host_with)."""
    accs = accumulators or default_accumulators(features)
    fused = "+fma" in (features or _features()).split(",")
    jit = _Jit(fma_ir(accs, unroll, fused), features)
    fn = jit.func("fma_peak", None, ctypes.c_int64, ctypes.POINTER(ctypes.c_float))
    bufs = [np.full((2 + accs) * VEC, 0.5, dtype=np.float32) for _ in range(threads)]
    for buf in bufs:
        buf[:VEC] = 0.999  # x slightly below 1 keeps the accumulators bounded
        buf[VEC:2 * VEC] = 1e-3
    ptrs = [buf.ctypes.data_as(ctypes.POINTER(ctypes.c_float)) for buf in bufs]
    flops_per_iter = 2.0 * VEC * accs * unroll
    t0 = time.perf_counter()
    fn(100_000, ptrs[0])
    per_iter = max((time.perf_counter() - t0) / 100_000, 1e-10)
    iters = max(1000, int(seconds / per_iter))
    flops = flops_per_iter * iters / 1e9
    best_cpu = best_wall = 0.0
    for _ in range(repeats):
        wall, cpu = _parallel(threads, lambda t: fn(iters, ptrs[t]))
        best_wall = max(best_wall, flops * threads / wall)
        best_cpu = max(best_cpu, sum(flops / max(c, 1e-9) for c in cpu))
    return best_cpu, best_wall


def measure_triad(threads: int, n: int = 1 << 24, repeats: int = 5) -> float:
    """Best GB/s of a = b + s*c over float arrays of n elements each (STREAM counts 12 bytes/elem)."""
    jit = _Jit(triad_ir())
    fp = ctypes.POINTER(ctypes.c_float)
    fn = jit.func("triad", None, fp, fp, fp, ctypes.c_float, ctypes.c_int64)
    n -= n % (VEC * threads)
    a, b, c = np.zeros(n, np.float32), np.full(n, 1.0, np.float32), np.full(n, 2.0, np.float32)
    chunk = n // threads

    def ptr(arr: np.ndarray, t: int) -> Any:
        return ctypes.cast(arr.ctypes.data + 4 * chunk * t, fp)

    args = [(ptr(a, t), ptr(b, t), ptr(c, t)) for t in range(threads)]
    t0 = time.perf_counter()
    fn(*args[0], 3.0, chunk)
    # Small (cache-resident) arrays: loop inside each thread, so thread start-up is not timed.
    inner = max(1, int(0.02 / max(time.perf_counter() - t0, 1e-9)))

    def work(t: int) -> None:
        for _ in range(inner):
            fn(*args[t], 3.0, chunk)

    best = 0.0
    for _ in range(repeats):
        wall, _ = _parallel(threads, work)  # bandwidth is shared: wall time is the honest one
        best = max(best, 12.0 * n * inner / wall / 1e9)
    if not np.allclose(a[:: max(1, n // 97)], 7.0):
        raise RuntimeError("triad kernel computed a wrong result")
    return best


def measure(threads: int, quick: bool = False) -> Roofline:
    """The roofline of this machine with `threads` threads; quick=True for tests (rough numbers)."""
    secs, reps = (0.01, 1) if quick else (0.2, 5)
    dram_n, l3_n = (1 << 16, 1 << 14) if quick else (1 << 24, 1 << 18)
    peak, peak_wall = measure_peak(threads, secs, reps)
    return Roofline(peak_gflops=peak, peak_gflops_wall=peak_wall,
                    peak_gflops_1t=measure_peak(1, secs, reps)[0],
                    bandwidth_gbs=measure_triad(threads, dram_n, reps),
                    l3_bandwidth_gbs=measure_triad(threads, l3_n, reps),
                    threads=threads, accumulators=default_accumulators())


def machine_info() -> dict[str, Any]:
    import llvmlite.binding as llvm
    feats = [f[1:] for f in _features().split(",") if f.startswith("+")]
    notable = [f for f in ("avx2", "fma", "avx512f", "avx512bw", "avx512vnni", "avx512bf16",
                           "amx-tile", "neon", "sve", "v") if f in feats]
    info: dict[str, Any] = {
        "cpu": llvm.get_host_cpu_name(), "features": notable, "cores": os.cpu_count(),
        "platform": platform.platform(), "python": sys.version.split()[0],
        "llvm": ".".join(map(str, llvm.llvm_version_info)), "numpy": np.__version__,
    }
    try:
        with open("/proc/cpuinfo") as fh:
            model = next((ln.split(":", 1)[1].strip() for ln in fh if ln.startswith("model name")), "")
        info["model"] = model
        with open("/proc/meminfo") as fh:
            info["memory_gib"] = round(int(fh.readline().split()[1]) / 2**20, 1)
    except OSError:
        pass
    return info


if __name__ == "__main__":
    print(machine_info())
    print(measure(int(sys.argv[1]) if len(sys.argv) > 1 else os.cpu_count() or 1))
