"""Timings split by where the host put the two vCPUs (issue 19.4): on one L3, or on two.

A virtualized host may move a guest's vCPUs between cores that share an L3 and cores that do not, for seconds at a
time, invisibly to the guest. A cache line bounced between CPU 0 and CPU 1 (kiln/runtime/coreprobe.py, JIT-compiled)
takes ~55 ns in the first state and ~330 ns in the second. Each batch of runs is classified by such a probe taken just
before it; each system runs in its own process, the processes alternate.

    python benchmarks/cross_l3.py [zoo model ...] [--rounds 6] [--seconds 8] [--kernels]

Prints per model and system the median ms on one L3 / on two (and how many batches each), their ratio (the growth
issue 19.4 compares with onnxruntime's), and the 10th-90th percentile over all batches. `--kernels`: Kiln's kernels
whose time grows most on two L3s (profile hook)."""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

from kiln.runtime.coreprobe import TWO_L3_NS

CHILD = r"""
import json, sys, time
import numpy as np
from kiln import zoo
from kiln.runtime.coreprobe import round_trip_ns
name, system, seconds, kernels = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4] == "1"
model, feeds = zoo.build(name), zoo.inputs(name)
if system == "kiln":
    import kiln
    exe = kiln.compile(model, num_threads=2)
    run = lambda prof=None: exe.run(feeds, profile=prof)
else:
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.intra_op_num_threads, so.inter_op_num_threads, so.log_severity_level = 2, 1, 3
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    run = lambda prof=None: sess.run(None, feeds)
for _ in range(5):
    run()
out = []
end = time.time() + seconds
while time.time() < end:
    time.sleep(0.02)  # the last batch's pool workers spin on after it: the probe would wait for their CPU
    ns = round_trip_ns()
    times, prof = [], {} if kernels and system == "kiln" else None
    for _ in range(8):
        t = time.perf_counter()
        run(prof)
        times.append(time.perf_counter() - t)
    out.append([ns, float(np.median(times)) * 1e3, {k: v / 8 * 1e3 for k, v in (prof or {}).items()}])
print(json.dumps(out))
"""


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("models", nargs="*", default=["resnet18", "resnet50", "mobilenetv2"])
    p.add_argument("--systems", default="kiln,onnxruntime")
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--seconds", type=float, default=8.0, help="per system and round")
    p.add_argument("--kernels", action="store_true")
    a = p.parse_args()
    if len(os.sched_getaffinity(0)) < 2:
        sys.exit("needs two CPUs")
    systems = a.systems.split(",")
    print("| model | system | one L3: median ms (batches) | two L3s: median ms (batches) | two ÷ one | p10–p90 ms |")
    print("|---|---|---:|---:|---:|---|")
    for name in a.models:
        rows: dict[str, list] = {s: [] for s in systems}
        for r in range(a.rounds):
            for s in systems if r % 2 == 0 else systems[::-1]:
                out = subprocess.run([sys.executable, "-c", CHILD, name, s, str(a.seconds),
                                      "1" if a.kernels else "0"], check=True, capture_output=True, text=True)
                rows[s] += json.loads(out.stdout.strip().splitlines()[-1])
                time.sleep(0.6)  # onnxruntime's pool spins after its last call
        for s in systems:
            one = [ms for ns, ms, _ in rows[s] if ns < TWO_L3_NS]
            two = [ms for ns, ms, _ in rows[s] if ns >= TWO_L3_NS]
            every = [ms for _, ms, _ in rows[s]]
            cell = lambda xs: f"{np.median(xs):.2f} ({len(xs)})" if xs else "– (0)"  # noqa: E731
            grow = f"{np.median(two) / np.median(one):.3f}" if one and two else "–"
            print(f"| {name} | {s} | {cell(one)} | {cell(two)} | {grow} | "
                  f"{np.percentile(every, 10):.2f}–{np.percentile(every, 90):.2f} |")
        if a.kernels and "kiln" in systems:
            per = {k: ([], []) for _, _, prof in rows["kiln"] for k in prof}
            for ns, _, prof in rows["kiln"]:
                for k, v in prof.items():
                    per[k][ns >= TWO_L3_NS].append(v)
            grown = sorted(((np.median(b) - np.median(o), k, np.median(o), np.median(b))
                            for k, (o, b) in per.items() if o and b), reverse=True)[:15]
            for _, k, o, b in grown:
                print(f"    {k}: {o:.3f} → {b:.3f} ms ({b / o:.2f}×)")


if __name__ == "__main__":
    main()
