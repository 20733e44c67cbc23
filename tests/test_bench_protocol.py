"""The measuring protocol with fake systems, each in its own worker process as in a real run.

The fakes live at module level so that they pickle into the workers (which get our sys.path).
No timing is asserted: only what was checked, what was timed, and how failures are reported.
"""
from __future__ import annotations

import math
import os
import signal
import time
from pathlib import Path

import numpy as np
import pytest

from kiln.bench import protocol, workloads
from kiln.bench.protocol import Contestant, ProtocolConfig, check
from kiln.bench.workloads import ConvShape


class NumpyGemm:
    """Correct for GEMM; logs every call (name, time) to a shared file to show interleaving."""
    name = "numpy"
    kinds = frozenset({"gemm"})
    strategies = ("default",)

    def __init__(self, log: str = "") -> None:
        self.log = log

    def available(self):
        return True, ""

    def version(self):
        return f"threads={os.environ.get('OMP_NUM_THREADS')}"

    def prepare(self, w, threads, strategy="default"):
        a, b, log, name = w.inputs["A"], w.gemm.b, self.log, self.name

        def run():
            if log:
                with open(log, "a") as fh:
                    fh.write(f"{name}\n")
            return [a @ b]
        return run


class NumpyGemm2(NumpyGemm):
    name = "numpy2"


class Wrong(NumpyGemm):
    name = "wrong"

    def prepare(self, w, threads, strategy="default"):
        inner = super().prepare(w, threads, strategy)
        return lambda: [inner()[0] * 1.01]


class SegfaultInPrepare(NumpyGemm):
    name = "segv"

    def prepare(self, w, threads, strategy="default"):
        os.kill(os.getpid(), signal.SIGSEGV)


class Raises(NumpyGemm):
    name = "raises"

    def prepare(self, w, threads, strategy="default"):
        raise NotImplementedError("no GEMM here")


class Unavailable(NumpyGemm):
    name = "absent"

    def available(self):
        return False, "pip install absent"


class Hangs(NumpyGemm):
    name = "hangs"

    def prepare(self, w, threads, strategy="default"):
        time.sleep(60)


class DiesWhileTimed:
    """Correct on both kinds, but aborts on its 4th GEMM call: crashes during the timed rounds,
    and must come back (a new worker) for the next workload."""
    name = "flaky"
    kinds = frozenset({"gemm", "conv"})
    strategies = ("default",)

    def available(self):
        return True, ""

    def version(self):
        return "1"

    def prepare(self, w, threads, strategy="default"):
        import onnxruntime as ort
        sess = ort.InferenceSession(w.build_model().SerializeToString(),
                                    providers=["CPUExecutionProvider"])
        calls = [0]

        def run():
            calls[0] += 1
            if w.kind == "gemm" and calls[0] == 4:
                os.abort()
            return sess.run(None, w.inputs)
        return run


CFG = ProtocolConfig(threads=1, rounds=4, min_rounds=4, round_s=0.005, warmup_s=0.01,
                     max_system_s=1.0, prepare_timeout_s=3.0, run_timeout_s=20.0)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bench")
    calls, wrong_calls = str(tmp / "calls.log"), str(tmp / "wrong.log")
    wl = [workloads.gemm_workload("gemm_test", 48, 40, 56),
          workloads.conv_workload("conv_test", ConvShape(4, 8, 10, 3))]
    systems = [NumpyGemm(calls), NumpyGemm2(calls), Wrong(wrong_calls), SegfaultInPrepare(),
               Raises(), Unavailable(), Hangs(), DiesWhileTimed()]
    people = [Contestant(s, "default") for s in systems]
    records = protocol.run(wl, people, CFG, peak=100.0)
    return {(r["workload"], r["system"]): r for r in records}, Path(calls), Path(wrong_calls)


def test_correct_system_is_timed(run):
    recs, _, _ = run
    rec = recs[("gemm_test", "numpy")]
    assert rec["ok"] and rec["status"] == "ok"
    assert rec["median_ms"] > 0 and rec["iqr_ms"] >= 0 and rec["samples"] >= CFG.rounds
    assert rec["max_rel_err"] < 1e-5 and rec["compile_s"] >= 0
    assert rec["gflops"] > 0 and rec["pct_peak"] == pytest.approx(rec["gflops"])  # peak = 100
    assert rec["version"] == "threads=1"  # the worker's environment pins the thread count
    assert ("conv_test", "numpy") not in recs  # kinds it does not handle: no record
    # every sample labelled with the host's state when it ran (kiln/runtime/coreprobe.py; "–": fewer than 2 CPUs)
    by_state = rec["host_states"]
    assert set(by_state) <= {"one L3", "two L3s", "–"}
    assert sum(v["samples"] for v in by_state.values()) == rec["samples"]
    assert all(v["median_ms"] > 0 for v in by_state.values())


def test_wrong_system_is_reported_and_not_timed(run):
    recs, _, wrong_log = run
    rec = recs[("gemm_test", "wrong")]
    assert rec["ok"] is False and rec["status"] == "wrong"
    assert rec["max_rel_err"] == pytest.approx(0.01, rel=1e-3)
    assert rec["median_ms"] is None and rec["gflops"] is None
    assert wrong_log.read_text().splitlines() == ["wrong"]  # only the checking call ran


@pytest.mark.parametrize("system,status,needle", [
    ("segv", "crashed", "SIGSEGV"),
    ("raises", "error", "NotImplementedError: no GEMM here"),
    ("absent", "unavailable", "pip install absent"),
    ("hangs", "timeout", "no answer within 3 s"),
])
def test_failures_are_reported_with_reason(run, system, status, needle):
    rec = run[0][("gemm_test", system)]
    assert rec["ok"] is False and rec["status"] == status and rec["median_ms"] is None
    assert needle in rec["reason"]


def test_crash_while_timed_then_restarted(run):
    recs = run[0]
    gemm = recs[("gemm_test", "flaky")]
    assert gemm["status"] == "crashed" and "SIGABRT" in gemm["reason"] and not gemm["ok"]
    conv = recs[("conv_test", "flaky")]  # a fresh worker for the next workload
    assert conv["ok"] and conv["median_ms"] > 0


def test_rounds_are_interleaved(run):
    _, calls, _ = run
    seq = calls.read_text().split()
    assert {"numpy", "numpy2"} == set(seq)
    switches = sum(a != b for a, b in zip(seq, seq[1:]))
    assert switches >= CFG.rounds  # round-robin: every round switches at least once


def test_check_relative_error():
    ref = [np.array([[1.0, -4.0], [2.0, 0.5]])]
    ok, err, _ = check([ref[0].astype(np.float32) + 1e-4], ref, 1e-3)
    assert ok and err == pytest.approx(1e-4 / 4, rel=1e-3)
    ok, err, why = check([ref[0] + 0.1], ref, 1e-3)
    assert not ok and err == pytest.approx(0.1 / 4) and "0.025" in why
    ok, err, why = check([np.full((2, 2), np.nan)], ref, 1e-3)
    assert not ok and math.isinf(err)
    ok, _, why = check([np.zeros(3)], ref, 1e-3)
    assert not ok and "shape" in why
    ok, _, why = check([], ref, 1e-3)
    assert not ok and "0 outputs" in why
    assert check([ref[0].reshape(4)], ref, 1e-3)[0]  # same size, other shape: compared flat


def test_reference_bytes_and_gemm_in_float64():
    w = workloads.gemm_workload("g", 8, 16, 4)
    ref = protocol.reference(w, 1)
    assert ref.outputs[0].dtype == np.float64 and ref.outputs[0].shape == (8, 4)
    assert ref.bytes == 4 * (8 * 16 + 16 * 4 + 8 * 4)


def test_unpicklable_system_goes_by_name():
    import threading

    class Holds:
        name = "onnxruntime"
        lock = None

    sys_ = Holds()
    sys_.lock = threading.Lock()  # not picklable: the worker rebuilds the system by its name
    assert protocol._payload(sys_) == "onnxruntime"
    assert protocol._payload(NumpyGemm()) is not None and not isinstance(
        protocol._payload(NumpyGemm()), str)


class CountsBuilds(NumpyGemm):
    """Asks for the ONNX model twice in prepare and remembers what it saw."""
    name = "counts"

    def prepare(self, w, threads, strategy="default"):
        self.built_before = BUILDS[0]
        self.models = [w.build_model(), w.build_model()]
        return super().prepare(w, threads, strategy)


BUILDS = [0]


def test_compile_time_starts_from_the_built_model():
    """The worker builds the workload's ONNX model (a zoo network's random weights) before its compile clock starts,
    and hands each request of the system a fresh copy: the model was built once, before prepare, and the copies are
    equal to it and distinct from each other (a system may change the proto it is given)."""
    import dataclasses

    from kiln.bench import worker

    w = workloads.gemm_workload("gemm_test", 48, 40, 56)
    build = w.build_model
    BUILDS[0] = 0

    def counted():
        BUILDS[0] += 1
        return build()
    st = worker._State()
    st.system, st.strategy = CountsBuilds(), "default"
    status, compile_s, _, outs, _ = worker._prepare(st, dataclasses.replace(w, build_model=counted), 1)
    assert status == "ok" and compile_s >= 0 and BUILDS[0] == 1
    assert st.system.built_before == 1
    a, b = st.system.models
    assert a is not b and a.SerializeToString() == b.SerializeToString() == build().SerializeToString()
    np.testing.assert_allclose(outs[0], w.inputs["A"] @ w.gemm.b, rtol=1e-6)
