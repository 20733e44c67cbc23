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

from kiln.runtime.coreprobe import host_state

from .procs import Worker, WorkerError
from .reference import Reference, check, reference
from .report import make_record
from .workload import Workload

Progress = Callable[[str], None]  # told what happens now, e.g. "gemm_1024 kiln:direct round 3/10"


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
    calibration_inputs: int = 100  # low precision: inputs each system's quantizer calibrates on (precision.py)
    eval_inputs: int = 500         # low precision: inputs its quality against its own fp32 build is measured on


@dataclass
class Contestant:
    """One (system, strategy) pair, measured in its own worker process."""
    system: Any
    strategy: str
    precision: str = "fp32"      # `kiln bench --precision`: fp32, int8 or bf16 (kiln/bench/precision.py)
    worker: Worker | None = None
    available: bool = False
    reason: str = ""
    version: str = ""
    # per-workload state
    samples: list[float] = field(default_factory=list)
    states: list[str] = field(default_factory=list)   # the host's state during each sample (host_state)
    calls: int = 1
    rounds: int = 0
    est_s: float = 0.0
    compile_s: float | None = None
    ok: bool = False
    err: float | None = None
    status: str = ""
    why: str = ""
    started: bool = False
    note: str = ""
    quality: dict[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return str(self.system.name)

    @property
    def label(self) -> str:
        return f"{self.name}:{self.strategy}" + ("" if self.precision == "fp32" else f"@{self.precision}")


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
            ("setup", _payload(c.system), c.strategy, c.precision), timeout=cfg.prepare_timeout_s)
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
    from .systems import approach
    extra = {"precision": c.precision, "approach": approach(c.system, c.strategy), **c.quality}
    if c.note:
        extra["note"] = c.note
    return make_record(w.name, c.name, c.strategy, cfg.threads, c.version, flops=w.flops,
                       peak_gflops=peak, kind=w.kind, bytes=ref.bytes, **extra, **fields)


def _prepare(w: Workload, c: Contestant, cfg: ProtocolConfig, ref: Reference,
             peak: float | None) -> dict[str, Any] | None:
    """Compile and check. None when the contestant may be timed, else its final record."""
    c.compile_s, c.err, c.note, c.quality = None, None, "", {}
    if not c.started or (c.available and (c.worker is None or not c.worker.alive)):
        start(c, cfg)  # first use, or it died on an earlier workload
    if not c.available:
        return _record(w, c, cfg, ref, peak, ok=False, status="unavailable", reason=c.reason)
    try:
        _, compile_s, first_s, outs, c.note = c.worker.request(
            ("prepare", w, cfg.threads, {"calibration_inputs": cfg.calibration_inputs}), timeout=cfg.prepare_timeout_s)
    except WorkerError as exc:
        return _record(w, c, cfg, ref, peak, ok=False, status=exc.status, reason=exc.reason)
    c.samples, c.states, c.est_s, c.compile_s = [], [], first_s, compile_s
    if ref.outputs is None:  # cannot be checked: timed, but never reported ok
        c.ok, c.err, c.status, c.why = False, None, "unchecked", ref.error
        return None
    ok, err, why = check(outs, ref.outputs, cfg.tolerance) if c.precision == "fp32" else \
        check_low_precision(outs, ref.outputs, c.precision)
    if not ok:
        return _record(w, c, cfg, ref, peak, ok=False, max_rel_err=err, compile_s=compile_s,
                       status="wrong", reason=why)
    if c.precision != "fp32" and cfg.eval_inputs > 0:
        try:
            c.quality = c.worker.request(("quality", cfg.eval_inputs), timeout=cfg.prepare_timeout_s)[1]
        except WorkerError as exc:
            return _record(w, c, cfg, ref, peak, ok=False, status=exc.status, compile_s=compile_s,
                           reason=f"quality evaluation failed: {exc.reason}")
    c.ok, c.err, c.status, c.why = True, err, "ok", ""
    return None


def check_low_precision(outs: Sequence[Any], ref: Sequence[np.ndarray], precision: str) -> tuple[bool, float, str]:
    """An int8/bf16 run against the fp32 reference: its output SNR must reach precision.SNR_FLOOR (a wrong
    result, not a lossy one, misses it); returns (ok, max_rel_err, reason)."""
    from .precision import SNR_FLOOR, snr_db
    _, err, why = check(outs, ref, math.inf)
    if why:  # shapes or counts differ
        return False, err, why
    snr = snr_db([np.asarray(o) for o in outs], list(ref))
    if not snr >= SNR_FLOOR[precision]:  # NaN fails too
        return False, err, f"output SNR {snr:.1f} dB against fp32 < {SNR_FLOOR[precision]:g} dB ({precision} floor)"
    return True, err, ""


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
    states = np.asarray(c.states)
    by_state = {st: {"median_ms": float(np.median(ms[states == st])), "samples": int((states == st).sum())}
                for st in sorted(set(c.states))} if len(c.states) == len(ms) else {}
    return _record(w, c, cfg, ref, peak, ok=c.ok, median_ms=med, iqr_ms=q3 - q1,
                   compile_s=c.compile_s, max_rel_err=c.err, status=c.status, reason=c.why,
                   samples=len(c.samples), calls_per_round=c.calls, host_states=by_state)


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
            state = host_state()   # (the workers idle now: the probe's two threads have the CPUs; coreprobe.py)
            try:
                times = _run(c, c.calls, cfg)
                c.samples += times
                c.states += [state] * len(times)
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
