"""The parent's side of a worker process (see worker.py): spawn, request with a timeout, kill.

Each worker gets its own session (process group), so a timed-out worker is killed together with
any helper processes it started, and nothing else.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

# Every knob the common runtimes read for their thread count: fixed in each worker so that no
# system gets more (or fewer) threads than the others.
THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "BLIS_NUM_THREADS",
               "NUMEXPR_NUM_THREADS", "VECLIB_MAXIMUM_THREADS", "TVM_NUM_THREADS",
               "KILN_NUM_THREADS", "RAYON_NUM_THREADS", "TF_NUM_INTRAOP_THREADS")
_ROOT = str(Path(__file__).resolve().parents[2])  # the folder that holds the kiln package


class WorkerError(Exception):
    """status: 'crashed' or 'timeout' (the worker is gone) or 'error' (an exception, it lives on)."""

    def __init__(self, status: str, reason: str, detail: str = "") -> None:
        super().__init__(f"{status}: {reason}")
        self.status, self.reason, self.detail = status, reason, detail


def worker_env(threads: int) -> dict[str, str]:
    env = dict(os.environ)
    for var in THREAD_VARS:
        env[var] = str(threads)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (_ROOT, env.get("PYTHONPATH", "")) if p)
    return env


def pin_cpus(threads: int) -> None:
    """Restrict this process to `threads` CPUs when there are more: runtimes that size their pool
    from the affinity mask (XLA, some OpenMPs) then agree with the thread variables."""
    try:
        cpus = sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return
    if threads < len(cpus):
        os.sched_setaffinity(0, cpus[:threads])


def _signal_name(rc: int) -> str:
    try:
        return signal.Signals(-rc).name
    except ValueError:
        return f"signal {-rc}"


class Worker:
    def __init__(self, label: str, threads: int, log_dir: str | None = None) -> None:
        self.label = label
        p2c_r, p2c_w = os.pipe()
        c2p_r, c2p_w = os.pipe()
        safe = "".join(ch if ch.isalnum() else "_" for ch in label)
        self.log_path = Path(tempfile.mkstemp(prefix=f"kiln-bench-{safe}-", suffix=".log",
                                              dir=log_dir)[1])
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "kiln.bench.worker", str(p2c_r), str(c2p_w)],
                pass_fds=(p2c_r, c2p_w), env=worker_env(threads), stdin=subprocess.DEVNULL,
                stdout=log, stderr=log, start_new_session=True)
        os.close(p2c_r)
        os.close(c2p_w)
        self.tx = Connection(p2c_w, readable=False)
        self.rx = Connection(c2p_r, writable=False)
        self.alive = True
        self.request(list(sys.path), timeout=120)

    def request(self, msg: Any, timeout: float) -> tuple:
        if not self.alive:
            raise WorkerError("crashed", "worker is not running")
        try:
            self.tx.send(msg)
        except (BrokenPipeError, ConnectionError, EOFError):
            raise self._died() from None
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                self.kill()
                raise WorkerError("timeout", f"no answer within {timeout:.0f} s")
            # Short polls: a dead worker's grandchildren may hold the pipe open, hiding the EOF.
            if self.rx.poll(min(left, 0.25)):
                try:
                    reply = self.rx.recv()
                except (EOFError, ConnectionError):
                    raise self._died() from None
                if reply[0] == "error":
                    raise WorkerError("error", reply[1], reply[2] if len(reply) > 2 else "")
                return reply
            if self.proc.poll() is not None and not self.rx.poll(0):
                raise self._died()

    def _died(self) -> WorkerError:
        try:
            rc = self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            rc = None
        self.kill()
        how = ("still running" if rc is None else _signal_name(rc) if rc < 0 else f"exit code {rc}")
        tail = self.log_tail()
        return WorkerError("crashed", f"worker died ({how})" + (f": {tail}" if tail else ""))

    def log_tail(self, lines: int = 3, limit: int = 400) -> str:
        try:
            data = self.log_path.read_bytes()[-4000:].decode("utf-8", "replace")
        except OSError:
            return ""
        kept = [ln.strip() for ln in data.splitlines() if ln.strip()][-lines:]
        return " | ".join(kept)[-limit:]

    def kill(self) -> None:
        self.alive = False
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # our own session: the worker and its children
        except (ProcessLookupError, PermissionError):
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        for conn in (self.tx, self.rx):
            conn.close()

    def close(self) -> None:
        if self.alive:
            try:
                self.request(("exit",), timeout=10)
            except WorkerError:
                pass
        self.kill()
        try:
            self.log_path.unlink()
        except OSError:
            pass
