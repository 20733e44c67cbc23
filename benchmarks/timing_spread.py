"""Timing stability (issue 19.4): each system in its own fresh process, `--procs` times; in each, the model is
compiled/loaded (Kiln from its cache after the first process) and run `--runs` times back to back. Prints per
system the median of the first `--early` runs, of the rest, the largest single run, and over the processes the
range of the later medians (the process-to-process spread).

    python benchmarks/timing_spread.py [zoo model ...] [--procs 5] [--runs 60] [--early 20] [--threads 2]

Wrap in `flock /tmp/kiln-measure.lock` on a shared machine; on a busy host the numbers are indicative only."""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

CHILD = r"""
import json, sys, time
import numpy as np
from kiln import zoo
system, name, threads, runs = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
model, feeds = zoo.build(name), zoo.inputs(name)
if system == "kiln":
    import kiln
    run = kiln.compile(model, num_threads=threads).run
    call = lambda: run(feeds)
else:
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.intra_op_num_threads, so.inter_op_num_threads, so.log_severity_level = threads, 1, 3
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    call = lambda: sess.run(None, feeds)
times = []
for _ in range(runs):
    t = time.perf_counter()
    call()
    times.append(time.perf_counter() - t)
print(json.dumps(times))
"""


def one_process(system: str, name: str, threads: int, runs: int) -> list[float]:
    out = subprocess.run([sys.executable, "-c", CHILD, system, name, str(threads), str(runs)], check=True,
                         capture_output=True, text=True, env=os.environ)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("models", nargs="*", default=["gemm_1024", "mlp"])
    p.add_argument("--procs", type=int, default=5)
    p.add_argument("--runs", type=int, default=60)
    p.add_argument("--early", type=int, default=20)
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args()
    print("| model | system | first runs median ms | later median ms | max ms | later medians over processes ms |")
    print("|---|---|---:|---:|---:|---|")
    for name in a.models:
        for system in ("kiln", "onnxruntime"):
            early, late, worst = [], [], 0.0
            for _ in range(a.procs):
                t = one_process(system, name, a.threads, a.runs)
                early.append(statistics.median(t[:a.early]) * 1e3)
                late.append(statistics.median(t[a.early:]) * 1e3)
                worst = max(worst, max(t) * 1e3)
                time.sleep(1.0)
            print(f"| {name} | {system} | {statistics.median(early):.3f} | {statistics.median(late):.3f} | "
                  f"{worst:.3f} | {min(late):.3f}–{max(late):.3f} |", flush=True)


if __name__ == "__main__":
    main()
