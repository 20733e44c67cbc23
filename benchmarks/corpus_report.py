"""The real-architecture corpus (kiln/corpus) against onnxruntime: per family and exporter, Kiln's median time ÷
onnxruntime's, and Kiln's cold compile time — the table of issue 19's closing note.

    python benchmarks/corpus_report.py [FAMILY ...] [--exporters torchscript,dynamo] [--threads 2] [--rounds 5]

Protocol: both systems in this one process, 2 threads each; outputs checked against onnxruntime first
(max|kiln − ort| ≤ 1e-5·max|ort|); then `--rounds` interleaved rounds, each a batch of `--runs` timed runs per system
after warm-up, with an idle gap (`--gap` s) before every batch (onnxruntime's pool spins ≈ 0.5 s after a call);
medians over all runs of a system. Compile s: `kiln.compile(..., cache=False)`, wall clock, first compile of the
model in this process; compile CPU s: this process's CPU time over it (what a busy machine does not
inflate). Wrap in `flock /tmp/kiln-measure.lock` on a shared machine."""
from __future__ import annotations

import argparse
import statistics
import time
import warnings

import numpy as np
import onnx
import onnxruntime as ort

import kiln
from kiln import corpus


def timed(run, n: int) -> list[float]:  # noqa: ANN001
    out = []
    for _ in range(n):
        t = time.perf_counter()
        run()
        out.append(time.perf_counter() - t)
    return out


def measure(name: str, exporter: str, threads: int, rounds: int, runs: int, gap: float) -> dict:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        path = corpus.export(name, exporter)
    model, feeds = onnx.load(path), corpus.feeds(name)
    t, cpu = time.perf_counter(), time.process_time()
    exe = kiln.compile(model, num_threads=threads, cache=False)
    compile_s, compile_cpu_s = time.perf_counter() - t, time.process_time() - cpu
    so = ort.SessionOptions()
    so.intra_op_num_threads, so.inter_op_num_threads, so.log_severity_level = threads, 1, 3
    sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    for g, w in zip(exe.run(feeds), sess.run(None, feeds)):
        err = float(np.abs(g - w).max())
        if err > 1e-5 * max(float(np.abs(w).max()), 1e-6):
            raise AssertionError(f"{name} {exporter}: kiln differs from onnxruntime by {err:.3g}")
    systems = {"kiln": lambda: exe.run(feeds), "onnxruntime": lambda: sess.run(None, feeds)}
    times: dict[str, list[float]] = {s: [] for s in systems}
    for _ in range(rounds):
        for s, run in systems.items():
            time.sleep(gap)
            timed(run, 3)  # warm-up of this batch
            times[s] += timed(run, runs)
    med = {s: statistics.median(v) * 1e3 for s, v in times.items()}
    return {"family": name, "exporter": exporter, "kiln_ms": med["kiln"], "ort_ms": med["onnxruntime"],
            "ratio": med["kiln"] / med["onnxruntime"], "compile_s": compile_s,
            "compile_cpu_s": compile_cpu_s}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("families", nargs="*", default=corpus.names())
    p.add_argument("--exporters", default="torchscript,dynamo")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--gap", type=float, default=1.0)
    a = p.parse_args()
    rows = []
    for name in a.families:
        for exporter in a.exporters.split(","):
            r = measure(name, exporter, a.threads, a.rounds, a.runs, a.gap)
            rows.append(r)
            print(f"# {name} {exporter}: kiln {r['kiln_ms']:.3f} ms, onnxruntime {r['ort_ms']:.3f} ms, "
                  f"compile {r['compile_s']:.2f} s", flush=True)
    print("\n| family | exporter | Kiln ms | onnxruntime ms | Kiln ÷ onnxruntime | compile s | compile CPU s |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['family']} | {r['exporter']} | {r['kiln_ms']:.3f} | {r['ort_ms']:.3f} | {r['ratio']:.2f} | "
              f"{r['compile_s']:.2f} | {r['compile_cpu_s']:.2f} |")


if __name__ == "__main__":
    main()
