"""Building and timing one candidate schedule of one kernel — the kernel alone, not its model.

`build_candidate` (run wherever compilation runs: this process, or a Ray worker) schedules a fresh copy of the
kernel with the candidate's knob values (an illegal value is rejected here, before code generation), emits it
into a module of its own with a timing entry point, and returns the object code:

    void kiln_tune_run(ptr buffers[], i64 reps, i32 nthreads, ptr kiln_parallel)   # the kernel reps times

`Measurer` times objects one at a time in a child process (`python -m kiln.tune.measure`), with a time limit
per candidate: a candidate that crashes the child (a segfault, an abort) or hangs is recorded as such and the
child is restarted, so a bad schedule never takes the tuner down. In the child, every argument buffer the kernel
reads gets seeded random values (the same for every candidate of a workload), every buffer it writes a seeded
fill, and scratch buffers zeros; one run's outputs are returned for checking against the reference (the
default schedule's outputs, tune/search.py), then the kernel is timed: warm-up, then `samples` timed calls of
`reps` runs each (reps chosen so one call lasts ≈ SAMPLE_S), per-run median.

A kernel over symbolic dims (a model compiled with dynamic shapes) is one piece of code for every size: it is run
and timed at each size of its distribution (tune/sizes.py) — the dims array of its module set to that size, its
outputs re-filled — and its time is the geometric mean of the per-size medians (which are its `samples`); its
outputs are checked at every size."""
from __future__ import annotations

import os
import pickle
import select
import struct
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kiln.kernel.ir import Kernel
from kiln.schedule.config import Config, Decisions, IllegalConfig
from kiln.target import Target
from kiln.tune.sizes import dims_vectors
from kiln.tune.workload import fresh

ENTRY = "kiln_tune_run"
SAMPLE_S = 2e-3      # one timed call lasts about this long (several runs of a short kernel)
SAMPLES = 7          # timed calls per candidate; the median per run is its time
WARMUP = 2
MAX_REPS = 2000


@dataclass
class Built:
    """One compiled candidate (or why it could not be built)."""
    config: dict[str, Any]
    obj: bytes = b""
    buffers: list[tuple[str, str, tuple[int, ...], str]] = field(default_factory=list)  # name, dtype, shape, role
    status: str = "ok"          # ok | illegal | error
    detail: str = ""
    compile_s: float = 0.0
    features: list[float] | None = None
    sizes: list[list[tuple[int, int]]] = field(default_factory=list)  # symbolic: (slot, value) per size measured
    amx: bool = False           # runs AMX tile kernels: the measuring process must hold the tile permission


def schedule_candidate(kernel: Kernel, target: Target, threads: int, options: dict[str, bool],
                       config: Config) -> Kernel:
    """A scheduled copy of `kernel` under `config` (IllegalConfig when a value lies outside its knob's domain
    or names a knob this kernel does not have)."""
    from kiln.schedule.default import schedule_kernel

    k = fresh(kernel)
    dec = Decisions(config, strict=True)
    schedule_kernel(k, target, threads, options, dec)
    if dec.unused():
        raise IllegalConfig(f"knobs {dec.unused()} do not exist for this kernel under this configuration")
    return k


def kernel_module(k: Kernel, target: Target) -> str:
    """LLVM IR: the scheduled kernel and the timing entry point."""
    from llvmlite import ir

    from kiln.codegen.access import I32, I64, PTR
    from kiln.codegen.kernel import NTHREADS_GLOBAL, PARALLEL_GLOBAL, KernelEmitter, declare_runtime
    from kiln.codegen.module import link_extern_ir, opaque_pointers

    with opaque_pointers():
        m = ir.Module(name=f"tune_{k.name}")
        m.triple = target.triple
        declare_runtime(m)
        fn = KernelEmitter(m, k, k.name, target=target).emit()
        entry = ir.Function(m, ir.FunctionType(ir.VoidType(), [PTR, I64, I32, PTR]), ENTRY)
        bufs, reps, nthreads, pool = entry.args
        b = ir.IRBuilder(entry.append_basic_block("entry"))
        b.store(nthreads, m.globals[NTHREADS_GLOBAL])
        b.store(b.ptrtoint(pool, I64), m.globals[PARALLEL_GLOBAL])
        n = len(k.args) + len(k.scratch)
        ptrs = [b.load(b.gep(bufs, [ir.Constant(I64, i)], source_etype=PTR), typ=PTR) for i in range(n)]
        head, body, done = (entry.append_basic_block(x) for x in ("head", "body", "done"))
        pre = b.block
        b.branch(head)
        b.position_at_end(head)
        i = b.phi(I64)
        i.add_incoming(ir.Constant(I64, 0), pre)
        b.cbranch(b.icmp_signed("<", i, reps), body, done)
        b.position_at_end(body)
        b.call(fn, ptrs)
        i.add_incoming(b.add(i, ir.Constant(I64, 1)), body)
        b.branch(head)
        b.position_at_end(done)
        b.ret_void()
        return link_extern_ir(str(m), [k])


def buffer_roles(k: Kernel) -> list[tuple[str, str, tuple[int, ...], str]]:
    written = {c.out for c in k.computes}
    out = [(b.name, b.dtype, tuple(b.shape), "out" if b.name in written else "in") for b in k.args]
    return out + [(b.name, b.dtype, tuple(b.shape), "scratch") for b in k.scratch]


def build_candidate(kernel: Kernel, target: Target, threads: int, options: dict[str, bool], config: Config,
                    with_features: bool = True) -> Built:
    """Schedule, generate and compile one candidate; never raises for a bad candidate (status says why)."""
    from kiln.codegen.jit import emit_object, optimize

    t0 = time.perf_counter()
    cfg = dict(config)
    try:
        k = schedule_candidate(kernel, target, threads, options, cfg)
    except IllegalConfig as e:
        return Built(cfg, status="illegal", detail=str(e))
    except Exception as e:  # a schedule bug: recorded, never fatal
        return Built(cfg, status="error", detail=f"schedule: {type(e).__name__}: {e}")
    features = None
    if with_features:
        from kiln.tune.cost import features_of
        features = features_of(k, target, threads)
    try:
        obj = emit_object(optimize(kernel_module(k, target), target), target)
    except Exception as e:
        return Built(cfg, status="error", detail=f"codegen: {type(e).__name__}: {e}", features=features)
    return Built(cfg, obj, buffer_roles(k), compile_s=time.perf_counter() - t0, features=features,
                 sizes=dims_vectors(kernel), amx="amx" in k.precision.values())


# -- the child process ---------------------------------------------------------------------------------------------
def make_buffers(roles: list[tuple[str, str, tuple[int, ...], str]], seed: int) -> list[np.ndarray]:
    """The candidate's buffers, 64-byte aligned: inputs seeded standard-normal, outputs a seeded fill (elements a
    kernel does not write keep it, the same for every candidate), scratch zeros."""
    import ml_dtypes  # noqa: F401  (registers numpy's "bfloat16")

    from kiln.runtime.executable import _aligned

    out = []
    for i, (_, dtype, shape, role) in enumerate(roles):
        n = int(np.prod(shape)) if shape else 1
        raw = _aligned(max(1, n) * np.dtype(dtype).itemsize)
        a = raw.view(dtype)[:max(1, n)]
        if role == "in":
            a[:] = np.random.default_rng(seed + i).standard_normal(a.size).astype(dtype)
        elif role == "out":
            a[:] = np.random.default_rng(seed + 1000 + i).standard_normal(a.size).astype(dtype)
        else:
            a[:] = 0
        out.append(a)
    return out


def run_candidate(req: dict) -> dict:
    """In the child: load the object; per size (one, for a kernel of constant extents) run once for the outputs,
    then time it."""
    import ctypes

    from kiln.codegen.jit import LoadedObject
    from kiln.runtime.threadpool import pool_address

    target: Target = req["target"]
    if req.get("amx"):  # without the XTILEDATA permission the first tile instruction is SIGILL (runtime/amx.py)
        from kiln.runtime.amx import ensure
        ensure()
    code = LoadedObject(req["obj"], target)
    fn = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int32, ctypes.c_void_p)(code.address(ENTRY))
    roles = req["buffers"]
    seed = req.get("seed", 0)
    bufs = make_buffers(roles, seed)
    ptrs = (ctypes.c_void_p * len(bufs))(*[a.ctypes.data for a in bufs])
    pool, threads = pool_address(), int(req["threads"])
    sizes = req.get("sizes") or [[]]
    dims = None
    if req.get("sizes"):
        from kiln.codegen.dims import DIMS_ACCESSOR, MAX_DIMS
        address = ctypes.CFUNCTYPE(ctypes.c_void_p)(code.address(DIMS_ACCESSOR))()
        dims = (ctypes.c_int64 * MAX_DIMS).from_address(address)
    outs = [j for j, r in enumerate(roles) if r[3] == "out"]
    fills = {j: bufs[j].copy() for j in outs} if dims is not None else {}
    outputs: dict[str, np.ndarray] = {}
    medians = []
    for i, size in enumerate(sizes):
        if dims is not None:
            for slot, value in size:
                dims[slot] = value
            for j in outs if i else ():  # the outputs' seeded fill again: what this size does not write is the
                bufs[j][:] = fills[j]     # same for every candidate
        fn(ptrs, 1, threads, pool)
        at = f"@{i}" if dims is not None else ""
        outputs.update({roles[j][0] + at: bufs[j].copy().reshape(roles[j][2]) for j in outs})
        for _ in range(WARMUP):
            fn(ptrs, 1, threads, pool)
        t = time.perf_counter()
        fn(ptrs, 1, threads, pool)
        one = time.perf_counter() - t
        reps = int(min(MAX_REPS, max(1, req.get("sample_s", SAMPLE_S) // max(one, 1e-7))))
        samples = []
        for _ in range(int(req.get("samples", SAMPLES))):
            t = time.perf_counter()
            fn(ptrs, reps, threads, pool)
            samples.append((time.perf_counter() - t) / reps)
        medians.append(float(np.median(samples)))
    if dims is None:
        return {"status": "ok", "samples": samples, "outputs": outputs if req.get("want_outputs", True) else None}
    return {"status": "ok", "samples": medians, "sized": True,
            "outputs": outputs if req.get("want_outputs", True) else None}


def _read_msg(stream: Any) -> Any:
    head = stream.read(8)
    if len(head) < 8:
        return None
    (n,) = struct.unpack("<Q", head)
    return pickle.loads(stream.read(n))


def _write_msg(stream: Any, obj: Any) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(struct.pack("<Q", len(data)) + data)
    stream.flush()


def serve() -> None:
    """The child's loop: one request in, one reply out, until stdin closes."""
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # nothing else may write to the reply pipe
    import kiln.codegen.jit  # noqa: F401  (imported before the first request: its time is not a candidate's)
    import kiln.runtime.threadpool  # noqa: F401
    while True:
        req = _read_msg(stdin)
        if req is None:
            return
        try:
            reply = run_candidate(req)
        except Exception as e:
            reply = {"status": "error", "detail": f"run: {type(e).__name__}: {e}"}
        _write_msg(stdout, reply)


# -- the parent side -----------------------------------------------------------------------------------------------
@dataclass
class Result:
    status: str                      # ok | crash | timeout | error
    seconds: float | None = None     # median per run
    samples: list[float] | None = None
    outputs: dict[str, np.ndarray] | None = None
    detail: str = ""
    wall: float = 0.0                # seconds the request took (a fresh child's start-up not included)


class Measurer:
    """Times built candidates one at a time in a child process with a time limit each (see the module doc)."""

    def __init__(self, timeout_s: float = 30.0, samples: int = SAMPLES):
        self.timeout_s, self.samples = timeout_s, samples
        self.proc: subprocess.Popen | None = None
        self.restarts = 0
        self._log = None

    def _start(self) -> subprocess.Popen:
        import tempfile

        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env = dict(os.environ)
        env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        self._log = tempfile.TemporaryFile()
        self.proc = subprocess.Popen([sys.executable, "-m", "kiln.tune.measure"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self._log, env=env,
                                     start_new_session=True)  # a Ctrl-C is the tuner's to handle, not the child's
        return self.proc

    def _stop(self) -> None:
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.kill()
            self.proc.wait()
            for s in (self.proc.stdin, self.proc.stdout):
                try:
                    s.close()
                except OSError:
                    pass
        self.proc = None

    def _stderr_tail(self) -> str:
        if self._log is None:
            return ""
        self._log.seek(0)
        text = self._log.read().decode(errors="replace").strip().splitlines()
        return " | ".join(text[-3:])

    def measure(self, built: Built, target: Target, threads: int, seed: int = 0, want_outputs: bool = True,
                timeout_s: float | None = None) -> Result:
        proc = self.proc if self.proc is not None and self.proc.poll() is None else self._start()
        req = {"obj": built.obj, "buffers": built.buffers, "target": target, "threads": threads, "seed": seed,
               "samples": self.samples, "want_outputs": want_outputs, "sizes": built.sizes, "amx": built.amx}
        limit = timeout_s or self.timeout_s
        t0 = time.perf_counter()
        try:
            _write_msg(proc.stdin, req)
            reply = self._wait_reply(proc, limit)
        except (BrokenPipeError, OSError, EOFError, pickle.UnpicklingError) as e:
            reply = {"status": "crash", "detail": f"{type(e).__name__}: {e}"}
        if reply.get("status") in ("crash", "timeout"):
            code = proc.poll()
            tail = self._stderr_tail()
            self._stop()
            self.restarts += 1
            what = reply.get("detail", "")
            if code is not None and code < 0:
                import signal
                what = f"killed by {signal.Signals(-code).name}" if -code in signal.Signals._value2member_map_ \
                    else f"signal {-code}"
            elif code is not None and reply["status"] == "crash":
                what = f"exit code {code}"
            return Result(reply["status"], detail=(what + (f"; {tail}" if tail else "")).strip("; "))
        if reply.get("status") != "ok":
            return Result(reply.get("status", "error"), detail=reply.get("detail", ""))
        samples = reply["samples"]
        # a symbolic kernel's samples are its per-size medians: its time is their geometric mean (tune/sizes.py)
        seconds = float(np.exp(np.mean(np.log(samples)))) if reply.get("sized") else float(np.median(samples))
        return Result("ok", seconds, samples, reply.get("outputs"), wall=time.perf_counter() - t0)

    def _wait_reply(self, proc: subprocess.Popen, limit: float) -> dict:
        """The child's reply, or crash / timeout (the child is then killed)."""
        fd = proc.stdout.fileno()
        ready, _, _ = select.select([fd], [], [], limit)
        if not ready:
            return {"status": "timeout", "detail": f"no result after {limit:.0f} s"}
        msg = _read_msg(proc.stdout)
        if msg is None:
            proc.wait(timeout=5)
            return {"status": "crash", "detail": "the measuring process died"}
        return msg

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                self.proc.stdin.close()
                self.proc.wait(timeout=5)
            except (OSError, subprocess.TimeoutExpired):
                pass
        self._stop()

    def __enter__(self) -> Measurer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def outputs_match(got: dict[str, np.ndarray], want: dict[str, np.ndarray], rtol: float = 1e-4) -> tuple[bool, str]:
    """A candidate's outputs against the reference: NaNs and infinities in the same places, elsewhere
    max|got − want| ≤ rtol · max|want| (per output; the tests' float tolerance for anchors)."""
    for name, w in want.items():
        g = got.get(name)
        if g is None or g.shape != w.shape:
            return False, f"output {name}: missing or shape {None if g is None else g.shape} ≠ {w.shape}"
        if not np.array_equal(np.isnan(g), np.isnan(w)):
            return False, f"output {name}: NaNs in different places"
        fin = np.isfinite(w)
        if not np.array_equal(g[~fin & ~np.isnan(w)], w[~fin & ~np.isnan(w)]):
            return False, f"output {name}: infinities differ"
        if fin.any():
            err = float(np.max(np.abs(g[fin].astype(np.float64) - w[fin].astype(np.float64))))
            scale = max(float(np.max(np.abs(w[fin]))), 1e-6)
            if err > rtol * scale:
                return False, f"output {name}: max error {err:.3g} > {rtol:g} × {scale:.3g}"
    return True, ""


if __name__ == "__main__":
    serve()
