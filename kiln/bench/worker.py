"""One benchmarked system in its own process, driven by the parent over two pipes.

Why a process per system: a peer that segfaults (TVM, IREE) or brings its own OpenMP runtime must
not take the run down or slow the others; the parent still interleaves the systems round by round.

Started as `python -m kiln.bench.worker READ_FD WRITE_FD` with the thread-count variables already
in its environment. Messages are pickled tuples; every request gets exactly one reply:

    ("setup", system or name, strategy[, precision]) -> ("ok", available, reason, version)
    ("prepare", workload, threads[, {"calibration_inputs": n}])
                                        -> ("ok", compile_s, first_s, outputs, note)
                                           (compile_s: from the built ONNX model — building it is not timed)
    ("quality", n)                      -> ("ok", {eval_inputs, snr_db, quality_max_rel_err, top1_agreement})
    ("run", calls)                      -> ("ok", [seconds per call, ...])
    ("drop",)                           -> ("ok",)
    ("exit",)                           -> ("ok",) and the process ends
Any exception becomes ("error", "Type: message", traceback) and the worker keeps serving.

A precision other than fp32 (`kiln bench --precision`) prepares through the system's `prepare_precision` with the
calibration inputs of kiln/bench/precision.py (the quantization happens here, in compile time), and "quality"
compares it with the same system's fp32 build on the evaluation inputs. `note` is what the system's runner says
about itself (`run.note`, e.g. the operators XNNPACK did not take), or "".
"""
from __future__ import annotations

import os
import sys
import time
import traceback
from multiprocessing.connection import Connection
from typing import Any

import numpy as np


class _State:
    def __init__(self) -> None:
        self.system: Any = None
        self.strategy = "default"
        self.fn: Any = None
        self.precision = "fp32"
        self.feed_runner: Any = None
        self.workload: Any = None
        self.threads = 1


def _setup(st: _State, system: Any, strategy: str, precision: str = "fp32") -> tuple:
    if isinstance(system, str):  # the parent could not pickle it: rebuild it here by name
        from .systems import resolve
        system = resolve(system)
    st.system, st.strategy, st.precision = system, strategy, precision
    if precision == "fp32":
        ok, reason = system.available()
    elif hasattr(system, "precision_available"):
        ok, reason = system.precision_available(precision)
    else:
        ok, reason = False, f"{system.name} has no {precision} path in kiln bench"
    version = ""
    if ok:
        try:
            version = str(system.version())
        except Exception as exc:  # a version is nice to have, never a reason to fail
            version = f"unknown ({type(exc).__name__})"
    return ("ok", bool(ok), str(reason), version)


def _prebuilt(workload: Any) -> Any:
    """The workload with its ONNX model built once, now, and handed out as a fresh copy per call: building a zoo
    network's random weights (resnet50: 0.72 s) is not the system's compile time, which the clock after this
    measures; a copy (10 ms) because a system may change the proto it is given."""
    import dataclasses

    import onnx

    if workload.build_torch is not None:  # a torch model: built by the system itself
        return workload
    model = workload.build_model()

    def copy() -> onnx.ModelProto:
        out = onnx.ModelProto()
        out.CopyFrom(model)
        return out
    return dataclasses.replace(workload, build_model=copy)


def _prepare(st: _State, workload: Any, threads: int, options: dict[str, Any] | None = None) -> tuple:
    st.fn = st.feed_runner = None
    workload = _prebuilt(workload)
    st.workload, st.threads = workload, threads
    t0 = time.perf_counter()
    if st.precision == "fp32":
        fn = st.system.prepare(workload, threads, strategy=st.strategy)
    else:
        from .precision import CALIBRATION_INPUTS, calibration_feeds
        n = (options or {}).get("calibration_inputs", CALIBRATION_INPUTS)
        fr = st.system.prepare_precision(workload, threads, st.strategy, st.precision, calibration_feeds(workload, n))
        feeds = workload.inputs
        fn = _bound(fr, feeds)
        st.feed_runner = fr
    t1 = time.perf_counter()
    outs = fn()
    t2 = time.perf_counter()
    st.fn = fn
    note = str(getattr(fn, "note", "") or getattr(st.feed_runner, "note", "") or "")
    return ("ok", t1 - t0, t2 - t1, [np.array(o, copy=True) for o in outs], note)


def _bound(fr: Any, feeds: dict[str, Any]) -> Any:
    def run() -> Any:
        return fr(feeds)
    return run


def _quality(st: _State, n: int) -> tuple:
    """The low-precision build against the same system's fp32 build on `n` evaluation inputs."""
    from .precision import evaluate
    if st.feed_runner is None:
        raise ValueError("quality: nothing prepared at a low precision")
    fp32 = st.system.prepare_precision(st.workload, st.threads, st.strategy, "fp32", [])
    try:
        return ("ok", evaluate(st.feed_runner, fp32, st.workload, n))
    finally:
        del fp32


def _run(st: _State, calls: int) -> tuple:
    fn, clock = st.fn, time.perf_counter
    times = []
    for _ in range(calls):
        t0 = clock()
        fn()
        times.append(clock() - t0)
    return ("ok", times)


def _handle(st: _State, msg: tuple) -> tuple:
    op = msg[0]
    if op == "setup":
        return _setup(st, *msg[1:])
    if op == "prepare":
        return _prepare(st, *msg[1:])
    if op == "quality":
        return _quality(st, msg[1])
    if op == "run":
        return _run(st, msg[1])
    if op == "drop":
        st.fn = st.feed_runner = st.workload = None
        return ("ok",)
    raise ValueError(f"unknown request {op!r}")


def serve(rconn: Connection, wconn: Connection) -> None:
    # The parent's sys.path first, so that systems defined anywhere it can import (tests too) unpickle.
    sys.path[:0] = [p for p in rconn.recv() if p not in sys.path]
    wconn.send(("ok",))
    st = _State()
    while True:
        try:
            msg = rconn.recv()
        except EOFError:  # the parent went away
            return
        if msg[0] == "exit":
            wconn.send(("ok",))
            return
        try:
            reply = _handle(st, msg)
        except BaseException as exc:  # everything, SystemExit too, goes back to the parent as a reason
            reply = ("error", f"{type(exc).__name__}: {exc}"[:2000], traceback.format_exc()[-4000:])
        wconn.send(reply)


def main(argv: list[str]) -> None:
    rfd, wfd = int(argv[1]), int(argv[2])
    # Peers may print to stdout; the pipes carry the protocol, so stdout joins stderr (the log).
    os.dup2(2, 1)
    from .procs import pin_cpus
    pin_cpus(int(os.environ.get("KILN_NUM_THREADS", "0")) or os.cpu_count() or 1)
    serve(Connection(rfd, writable=False), Connection(wfd, readable=False))


if __name__ == "__main__":
    main(sys.argv)
