"""Where the two-L3 penalty is (issue 19.4): one model on one thread pinned to each vCPU, on two threads, and on two
threads with the arena's reuse off, each batch classified by the host state a probe finds before and after it.

    python benchmarks/cross_l3_threads.py [zoo model] [--seconds 900]

If one vCPU were slower when the host puts the two on different L3s, the pinned one-thread runs would show it; if
they take the same time in both states, the penalty is between the threads (data one wrote and the other reads, the
arena's lines moving between L3s). The state flips rarely (minutes at a time): run long. Prints median ms per
build and state, and how many batches each median is over (batches whose two probes disagree are dropped)."""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import kiln
from kiln import zoo
from kiln.runtime.coreprobe import TWO_L3_NS, round_trip_ns


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("model", nargs="?", default="resnet18")
    p.add_argument("--seconds", type=float, default=900.0)
    a = p.parse_args()
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        sys.exit("needs two CPUs")
    model, feeds = zoo.build(a.model), zoo.inputs(a.model)
    one = kiln.compile(model, num_threads=1)
    builds = [(f"1 thread on CPU {cpus[0]}", one, {cpus[0]}), (f"1 thread on CPU {cpus[1]}", one, {cpus[1]}),
              ("2 threads", kiln.compile(model, num_threads=2), set(cpus[:2])),
              ("2 threads, memory_reuse=False", kiln.compile(model, num_threads=2, memory_reuse=False), set(cpus[:2]))]
    res: dict[tuple[str, str], list[float]] = {(n, s): [] for n, _, _ in builds for s in ("one L3", "two L3s")}

    def probe() -> float:
        os.sched_setaffinity(0, set(cpus[:2]))
        return round_trip_ns()

    end = time.time() + a.seconds
    while time.time() < end:
        for name, exe, where in builds:
            os.sched_setaffinity(0, where)
            for _ in range(2):
                exe.run(feeds)
            before = probe()
            os.sched_setaffinity(0, where)
            times = []
            for _ in range(6):
                t = time.perf_counter()
                exe.run(feeds)
                times.append(time.perf_counter() - t)
            after = probe()
            if min(before, after) > TWO_L3_NS:
                res[(name, "two L3s")].append(statistics.median(times) * 1e3)
            elif max(before, after) < TWO_L3_NS:
                res[(name, "one L3")].append(statistics.median(times) * 1e3)
    os.sched_setaffinity(0, set(cpus))
    print(f"| {a.model} | one L3: median ms (batches) | two L3s: median ms (batches) |\n|---|---:|---:|")
    for name, _, _ in builds:
        cells = [f"{statistics.median(v):.2f} ({len(v)})" if (v := res[(name, s)]) else "–"
                 for s in ("one L3", "two L3s")]
        print(f"| {name} | {cells[0]} | {cells[1]} |")


if __name__ == "__main__":
    main()
