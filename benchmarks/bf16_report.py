"""Kiln bf16 vs Kiln fp32 vs OpenVINO bf16 / f32 (issue 18): median latency and the relative error to float32.

    flock /tmp/kiln-measure.lock python benchmarks/bf16_report.py gemm_1024 bert_base resnet50 [--threads 2]
          [--ukernel]   (also "kiln bf16 ukernel": strategy="ukernel", the bf16 microkernels of kiln/ukernels/dot.py)

Per workload (kiln.zoo models, random weights): every system compiled first (Kiln: kiln.compile(precision=...);
OpenVINO: INFERENCE_PRECISION_HINT bf16 / f32), checked against onnxruntime float32 (max|out − ref| / max|ref|),
then `--rounds` interleaved rounds — the systems in a shuffled order each round, each doing `--calls` calls,
with `--idle` s (default 1 s: OpenVINO's and onnxruntime's pools spin after a call) before each system's batch.
Prints the median per system, the ratio bf16/fp32 and Kiln bf16 / OpenVINO bf16, the error and how Kiln's bf16
anchors ran (exe.meta["precision"]: amx / emulated counts)."""
from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import kiln  # noqa: E402
from kiln import zoo  # noqa: E402

Runner = Callable[[], list[np.ndarray]]


def kiln_system(model, feeds, threads: int, precision: str, strategy: str = "direct") -> tuple[Runner, str]:
    t0 = time.perf_counter()
    exe = kiln.compile(model, num_threads=threads, precision=precision, strategy=strategy)
    paths = Counter(exe.meta["precision"].values())
    built = Counter(v.split(" (")[0] for v in exe.meta["strategies"].values())
    note = f"compile {time.perf_counter() - t0:.1f}s" + (f", anchors {dict(paths)}" if paths else "") + \
        (f", built {dict(built)}" if strategy != "direct" else "")
    return (lambda: exe.run(feeds)), note


def openvino_system(model, feeds, threads: int, precision: str) -> tuple[Runner, str]:
    import openvino as ov

    with tempfile.NamedTemporaryFile(suffix=".onnx", delete=False) as f:
        f.write(model.SerializeToString())
    core = ov.Core()
    compiled = core.compile_model(core.read_model(f.name), "CPU", {
        "INFERENCE_PRECISION_HINT": precision, "INFERENCE_NUM_THREADS": threads,
        "PERFORMANCE_HINT": "LATENCY", "NUM_STREAMS": 1})
    os.unlink(f.name)
    request = compiled.create_infer_request()

    def run() -> list[np.ndarray]:
        request.infer(feeds)
        return [request.get_output_tensor(i).data.copy() for i in range(len(compiled.outputs))]
    return run, f"openvino {ov.__version__}"


def reference(model, feeds, threads: int) -> list[np.ndarray]:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"]).run(None, feeds)


def rel_err(got: list[np.ndarray], want: list[np.ndarray]) -> float:
    return max(float(np.abs(np.asarray(g, np.float64) - w).max() / max(np.abs(w).max(), 1e-30))
               for g, w in zip(got, want))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("workloads", nargs="*", default=["gemm_1024", "bert_base", "resnet50"])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--calls", type=int, default=10)
    ap.add_argument("--idle", type=float, default=1.0)
    ap.add_argument("--no-openvino", action="store_true")
    ap.add_argument("--ukernel", action="store_true", help="also Kiln bf16 built with strategy='ukernel'")
    args = ap.parse_args(argv)
    systems = [("kiln fp32", kiln_system, "fp32"), ("kiln bf16", kiln_system, "bf16")]
    if args.ukernel:
        systems.append(("kiln bf16 ukernel", lambda m, f, t, p: kiln_system(m, f, t, p, "ukernel"), "bf16"))
    if not args.no_openvino:
        systems += [("openvino f32", openvino_system, "f32"), ("openvino bf16", openvino_system, "bf16")]
    for name in args.workloads:
        model, feeds = zoo.build(name), zoo.inputs(name)
        want = reference(model, feeds, args.threads)
        runners: dict[str, Runner] = {}
        errors: dict[str, float] = {}
        notes: dict[str, str] = {}
        for label, make, precision in systems:
            try:
                run, notes[label] = make(model, feeds, args.threads, precision)
            except Exception as e:  # a peer that cannot build this model is reported, not fatal
                print(f"{name}: {label} unavailable: {type(e).__name__}: {e}")
                continue
            errors[label] = rel_err(run(), want)
            runners[label] = run
        times: dict[str, list[float]] = {label: [] for label in runners}
        order = list(runners)
        rng = random.Random(0)
        for _ in range(args.rounds):
            rng.shuffle(order)
            for label in order:
                time.sleep(args.idle)
                run = runners[label]
                run()  # warm-up call after the idle gap
                for _ in range(args.calls):
                    t0 = time.perf_counter()
                    run()
                    times[label].append(time.perf_counter() - t0)
        med = {label: statistics.median(ts) * 1e3 for label, ts in times.items()}
        print(f"\n{name} ({args.threads} threads, {args.rounds}×{args.calls} calls, median ms; "
              f"error = max|out − ort fp32| / max|ort fp32|)")
        for label in runners:
            print(f"  {label:17s} {med[label]:9.3f} ms   err {errors[label]:.2e}   {notes[label]}")
        if "kiln fp32" in med and "kiln bf16" in med:
            print(f"  kiln bf16 speed-up vs kiln fp32: {med['kiln fp32'] / med['kiln bf16']:.2f}×")
        if "openvino bf16" in med and "kiln bf16" in med:
            print(f"  kiln bf16 / openvino bf16 time: {med['kiln bf16'] / med['openvino bf16']:.2f}×")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
