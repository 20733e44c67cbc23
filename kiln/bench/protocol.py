"""The measuring protocol: the same inputs for all, correctness before timing, interleaved rounds.

For one workload:
 1. every system prepares (compile time recorded apart) and runs once in its own worker process;
    its outputs are checked against a reference (NumPy float64 for GEMM, eager PyTorch in float64 for
    torch.nn workloads, onnxruntime otherwise):
    max_rel_err = max|out - ref| / max|ref| must be <= tolerance, or the system is reported wrong
    and never timed; a crash or a timeout is reported with its reason;
 2. warm-up, then the number of calls per turn is set so that one turn lasts about `round_s`;
 3. rounds: round-robin over the systems (in a new seeded order each round), each doing its calls
    in turn, so that the machine's drift hits every system alike; median and IQR over all calls.
Every worker has the same thread count (threads argument and the environment variables).
"""
from __future__ import annotations

import math
import os
import random
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .procs import Worker, WorkerError
from .report import make_record
from .workload import Workload


@dataclass
class ProtocolConfig:
    threads: int = 2
    rounds: int = 10             # interleaved rounds (fewer for very slow systems, see max_system_s)
    min_rounds: int = 3
    round_s: float = 0.05        # one system's turn in a round lasts about this long
    warmup_s: float = 0.2
    max_system_s: float = 6.0    # timed budget per system and workload: slow peers get min_rounds
    prepare_timeout_s: float = 900.0
    run_timeout_s: float = 120.0
    tolerance: float = 1e-3
    # After a system's turn, wait until its worker process is idle (at most settle_s): runtimes keep their
    # threads spinning after a run (onnxruntime's pool for up to ~0.5 s), which would otherwise be charged to
    # whoever runs next — measured on resnet50 after onnxruntime turns, kiln took 71 ms with a fixed 0.01 s
    # pause, 55 ms with 0.3 s, 47 ms with 0.6 s.
    settle_s: float = 1.0
    seed: int = 0                # the order of the systems is shuffled every round (seeded)


@dataclass
class Contestant:
    """One (system, strategy) pair, measured in its own worker process."""
    system: Any
    strategy: str
    worker: Worker | None = None
    available: bool = False
    reason: str = ""
    version: str = ""
    # per-workload state
    samples: list[float] = field(default_factory=list)
    calls: int = 1
    rounds: int = 0
    est_s: float = 0.0
    compile_s: float | None = None
    ok: bool = False
    err: float | None = None
    status: str = ""
    why: str = ""
    started: bool = False

    @property
    def name(self) -> str:
        return str(self.system.name)

    @property
    def label(self) -> str:
        return f"{self.name}:{self.strategy}"


@dataclass
class Reference:
    outputs: list[np.ndarray] | None
    bytes: float                 # compulsory memory traffic: inputs + weights + outputs
    error: str = ""


Progress = Callable[[str], None]  # told what happens now, e.g. "gemm_1024 kiln:direct round 3/10"


# ---- reference and checking ---------------------------------------------------------------------

def reference(w: Workload, threads: int) -> Reference:
    in_bytes = float(sum(a.nbytes for a in w.inputs.values()))
    if w.gemm is not None:
        g = w.gemm
        out = g.a.astype(np.float64) @ g.b.astype(np.float64)
        return Reference([out], in_bytes + g.b.nbytes + 4.0 * g.m * g.n)
    if w.build_torch is not None:
        try:
            outs, weights = _eager_float64(w)
        except Exception as exc:  # reported per record as 'unchecked'
            return Reference(None, in_bytes, f"reference failed: {type(exc).__name__}: {exc}")
        return Reference(outs, in_bytes + weights + sum(o.nbytes / 2 for o in outs))
    try:
        model = w.build_model()
        weights = float(sum(int(np.prod(t.dims)) * 4 for t in model.graph.initializer))
        outs = _onnxruntime(model, w.inputs, threads)
    except Exception as exc:  # reported per record as 'unchecked'
        return Reference(None, in_bytes, f"reference failed: {type(exc).__name__}: {exc}")
    return Reference(outs, in_bytes + weights + sum(o.nbytes for o in outs))


def _eager_float64(w: Workload) -> tuple[list[np.ndarray], float]:
    """A torch workload's outputs from eager PyTorch in float64 (its reference), and its float32 weight bytes."""
    import torch

    module, _ = w.build_torch()
    weights = float(sum(t.numel() * 4 for t in module.state_dict().values() if t.is_floating_point()))
    xs = [torch.from_numpy(np.asarray(a, dtype=np.float64)) for a in w.inputs.values()]
    with torch.no_grad():
        outs = module.double().eval()(*xs)
    return [o.numpy() for o in (outs if isinstance(outs, (tuple, list)) else [outs])], weights


def _onnxruntime(model: Any, feeds: dict[str, np.ndarray], threads: int) -> list[np.ndarray]:
    import onnxruntime as ort
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return [np.asarray(o) for o in sess.run(None, feeds)]


def check(outputs: Sequence[Any], ref: Sequence[np.ndarray], tol: float) -> tuple[bool, float, str]:
    """(ok, max_rel_err, reason). Same-size outputs of another shape are compared flattened."""
    if len(outputs) != len(ref):
        return False, math.inf, f"{len(outputs)} outputs, expected {len(ref)}"
    worst = 0.0
    for i, (out, want) in enumerate(zip(outputs, ref)):
        out = np.asarray(out)
        if out.size != want.size:
            return False, math.inf, f"output {i} has shape {out.shape}, expected {want.shape}"
        diff = np.abs(out.reshape(want.shape).astype(np.float64) - want)
        scale = float(np.max(np.abs(want))) if want.size else 0.0
        err = float(np.max(diff)) / (scale or 1.0) if want.size else 0.0
        worst = max(worst, err if math.isfinite(err) else math.inf)
    if worst > tol:
        return False, worst, f"max relative error {worst:.3g} > {tol:g}"
    return True, worst, ""


# ---- workers ------------------------------------------------------------------------------------

def _payload(system: Any) -> Any:
    """The system itself when it pickles, else its name for the worker to look up."""
    import pickle
    try:
        pickle.dumps(system)
        return system
    except Exception:
        return str(system.name)


def start(c: Contestant, cfg: ProtocolConfig) -> None:
    """(Re)start the contestant's worker and ask its system whether it can run here. A system
    that is not available, or whose setup fails, stays unavailable for the whole run."""
    c.started = True
    stop(c)  # a worker that died on an earlier workload: reap it and drop its log
    try:
        c.worker = Worker(c.label, cfg.threads)
        _, c.available, c.reason, c.version = c.worker.request(
            ("setup", _payload(c.system), c.strategy), timeout=cfg.prepare_timeout_s)
    except WorkerError as exc:
        c.available, c.reason = False, f"setup {exc.status}: {exc.reason}"
    if not c.available:
        stop(c)


def stop(c: Contestant) -> None:
    if c.worker is not None:
        c.worker.close()
        c.worker = None


# ---- one workload -------------------------------------------------------------------------------

def _record(w: Workload, c: Contestant, cfg: ProtocolConfig, ref: Reference, peak: float | None,
            **fields: Any) -> dict[str, Any]:
    fields.setdefault("status", "ok" if fields.get("ok") else "wrong")
    return make_record(w.name, c.name, c.strategy, cfg.threads, c.version, flops=w.flops,
                       peak_gflops=peak, kind=w.kind, bytes=ref.bytes, **fields)


def _prepare(w: Workload, c: Contestant, cfg: ProtocolConfig, ref: Reference,
             peak: float | None) -> dict[str, Any] | None:
    """Compile and check. None when the contestant may be timed, else its final record."""
    c.compile_s, c.err = None, None
    if not c.started or (c.available and (c.worker is None or not c.worker.alive)):
        start(c, cfg)  # first use, or it died on an earlier workload
    if not c.available:
        return _record(w, c, cfg, ref, peak, ok=False, status="unavailable", reason=c.reason)
    try:
        _, compile_s, first_s, outs = c.worker.request(("prepare", w, cfg.threads),
                                                       timeout=cfg.prepare_timeout_s)
    except WorkerError as exc:
        return _record(w, c, cfg, ref, peak, ok=False, status=exc.status, reason=exc.reason)
    c.samples, c.est_s, c.compile_s = [], first_s, compile_s
    if ref.outputs is None:  # cannot be checked: timed, but never reported ok
        c.ok, c.err, c.status, c.why = False, None, "unchecked", ref.error
        return None
    ok, err, why = check(outs, ref.outputs, cfg.tolerance)
    if not ok:
        return _record(w, c, cfg, ref, peak, ok=False, max_rel_err=err, compile_s=compile_s,
                       status="wrong", reason=why)
    c.ok, c.err, c.status, c.why = True, err, "ok", ""
    return None


def _run(c: Contestant, calls: int, cfg: ProtocolConfig) -> list[float]:
    timeout = max(cfg.run_timeout_s, 20.0 * calls * max(c.est_s, 1e-3))
    return list(c.worker.request(("run", calls), timeout=timeout)[1])


def _calibrate(c: Contestant, cfg: ProtocolConfig) -> None:
    """Warm up, then choose calls per turn and the number of rounds for this contestant."""
    if c.est_s < cfg.warmup_s:  # the checking call already warmed up a slow system
        n = min(1000, max(1, math.ceil(cfg.warmup_s / max(c.est_s, 1e-6))))
        c.est_s = statistics.median(_run(c, n, cfg))
    c.calls = min(10_000, max(1, round(cfg.round_s / max(c.est_s, 1e-7))))
    affordable = int(cfg.max_system_s / max(c.calls * c.est_s, 1e-9))
    c.rounds = min(cfg.rounds, max(cfg.min_rounds, affordable))


def _finish(w: Workload, c: Contestant, cfg: ProtocolConfig, ref: Reference,
            peak: float | None) -> dict[str, Any]:
    ms = np.asarray(c.samples) * 1e3
    q1, med, q3 = (float(v) for v in np.percentile(ms, [25, 50, 75]))
    return _record(w, c, cfg, ref, peak, ok=c.ok, median_ms=med, iqr_ms=q3 - q1,
                   compile_s=c.compile_s, max_rel_err=c.err, status=c.status, reason=c.why,
                   samples=len(c.samples), calls_per_round=c.calls)


def _fail(w: Workload, c: Contestant, cfg: ProtocolConfig, ref: Reference, peak: float | None,
          exc: WorkerError) -> dict[str, Any]:
    return _record(w, c, cfg, ref, peak, ok=False, status=exc.status, reason=exc.reason,
                   compile_s=c.compile_s, max_rel_err=c.err)


def measure_workload(w: Workload, contestants: Sequence[Contestant], cfg: ProtocolConfig,
                     peak: float | None = None, progress: Progress | None = None) -> list[dict]:
    say = progress or (lambda _msg: None)
    ref = reference(w, cfg.threads)
    records: list[dict[str, Any]] = []
    live: list[Contestant] = []
    for c in contestants:
        if w.kind not in c.system.kinds:
            continue
        say(f"{w.name} {c.label} prepare")
        final = _prepare(w, c, cfg, ref, peak)
        if final is None:
            live.append(c)
        else:
            records.append(final)
    for c in list(live):
        say(f"{w.name} {c.label} warm-up")
        try:
            _calibrate(c, cfg)
        except WorkerError as exc:
            records.append(_fail(w, c, cfg, ref, peak, exc))
            live.remove(c)
    records += _rounds(w, live, cfg, ref, peak, say)
    order = {(c.name, c.strategy): i for i, c in enumerate(contestants)}
    records.sort(key=lambda rec: order.get((rec["system"], rec["strategy"]), len(order)))
    for c in contestants:
        if c.worker is not None and c.worker.alive:
            try:
                c.worker.request(("drop",), timeout=60)
            except WorkerError:
                stop(c)
    return records


def _cpu_seconds(pid: int) -> float | None:
    """CPU time (user + system) a process has used, from /proc; None where that is not readable."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


def _settle(prev: Contestant | None, limit_s: float, poll_s: float = 0.05) -> None:
    """Wait until the previous system's worker stops burning CPU (spinning threads), at most limit_s."""
    proc = getattr(getattr(prev, "worker", None), "proc", None)
    if proc is None:
        time.sleep(0.01)
        return
    deadline = time.perf_counter() + limit_s
    last = _cpu_seconds(proc.pid)
    while last is not None and time.perf_counter() < deadline:
        time.sleep(poll_s)
        now = _cpu_seconds(proc.pid)
        if now is None or now - last < 0.1 * poll_s:  # under 10% of one core: idle
            return
        last = now


def _rounds(w: Workload, live: list[Contestant], cfg: ProtocolConfig, ref: Reference,
            peak: float | None, say: Progress) -> list[dict[str, Any]]:
    records = []
    rng = random.Random(cfg.seed)
    n_rounds = max((c.rounds for c in live), default=0)
    for r in range(n_rounds):
        say(f"{w.name} round {r + 1}/{n_rounds}")
        # A new order each round, so no system always follows the same neighbour (and its tail).
        turn = rng.sample(live, len(live))
        prev: Contestant | None = None
        for c in turn:
            if r >= c.rounds:
                continue
            _settle(prev, cfg.settle_s)
            prev = c
            try:
                c.samples += _run(c, c.calls, cfg)
            except WorkerError as exc:
                records.append(_fail(w, c, cfg, ref, peak, exc))
                live.remove(c)
    return records + [_finish(w, c, cfg, ref, peak) for c in live]


# ---- a whole run --------------------------------------------------------------------------------

def run(workloads: Sequence[Callable[[], Workload] | Workload], contestants: Sequence[Contestant],
        cfg: ProtocolConfig, peak: float | None = None, progress: Progress | None = None,
        on_workload: Callable[[str], None] | None = None,
        sink: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """Measure every workload with every contestant; workers are started once and reused.
    Records are appended to `sink` (if given) as each workload finishes, then returned."""
    records: list[dict[str, Any]] = sink if sink is not None else []
    try:
        for c in contestants:
            (progress or (lambda _m: None))(f"starting {c.label}")
            start(c, cfg)
        for item in workloads:
            w = item if isinstance(item, Workload) else item()
            records += measure_workload(w, contestants, cfg, peak, progress)
            if on_workload is not None:
                on_workload(w.name)
            del w
    except BaseException:  # Ctrl-C included: do not wait for busy workers to answer
        for c in contestants:
            if c.worker is not None:
                c.worker.kill()
        raise
    finally:
        for c in contestants:
            stop(c)
    return records
