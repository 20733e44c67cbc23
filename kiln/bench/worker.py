"""One benchmarked system in its own process, driven by the parent over two pipes.

Why a process per system: a peer that segfaults (TVM, IREE) or brings its own OpenMP runtime must
not take the run down or slow the others; the parent still interleaves the systems round by round.

Started as `python -m kiln.bench.worker READ_FD WRITE_FD` with the thread-count variables already
in its environment. Messages are pickled tuples; every request gets exactly one reply:

    ("setup", system or name, strategy) -> ("ok", available, reason, version)
    ("prepare", workload, threads)      -> ("ok", compile_s, first_s, outputs)
    ("run", calls)                      -> ("ok", [seconds per call, ...])
    ("drop",)                           -> ("ok",)
    ("exit",)                           -> ("ok",) and the process ends
Any exception becomes ("error", "Type: message", traceback) and the worker keeps serving.
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


def _setup(st: _State, system: Any, strategy: str) -> tuple:
    if isinstance(system, str):  # the parent could not pickle it: rebuild it here by name
        from .systems import resolve
        system = resolve(system)
    st.system, st.strategy = system, strategy
    ok, reason = system.available()
    version = ""
    if ok:
        try:
            version = str(system.version())
        except Exception as exc:  # a version is nice to have, never a reason to fail
            version = f"unknown ({type(exc).__name__})"
    return ("ok", bool(ok), str(reason), version)


def _prepare(st: _State, workload: Any, threads: int) -> tuple:
    st.fn = None
    t0 = time.perf_counter()
    fn = st.system.prepare(workload, threads, strategy=st.strategy)
    t1 = time.perf_counter()
    outs = fn()
    t2 = time.perf_counter()
    st.fn = fn
    return ("ok", t1 - t0, t2 - t1, [np.array(o, copy=True) for o in outs])


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
        return _setup(st, msg[1], msg[2])
    if op == "prepare":
        return _prepare(st, msg[1], msg[2])
    if op == "run":
        return _run(st, msg[1])
    if op == "drop":
        st.fn = None
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
