"""Timing stability (issue 19.4): each system in its own fresh process, `--procs` times; in each, the model is
compiled/loaded (Kiln from its cache after the first process) and run `--runs` times back to back. Prints per
system the median of the first `--early` runs, of the rest, the largest single run, and over the processes the
range of the later medians (the process-to-process spread). The systems' processes alternate (kiln, onnxruntime,
kiln, …), so a drift of the host's state reaches both. `--no-aslr` runs each child under `setarch -R` (the same
addresses in every process): a spread that collapses then comes from where buffers land.

    python benchmarks/timing_spread.py [zoo model ...] [--procs 5] [--runs 60] [--early 20] [--threads 2] [--no-aslr]
    python benchmarks/timing_spread.py resnet18 --copies 8

`--copies N` (one process): the model's code loaded N times, every copy running on the SAME weights and arena (so
only where its code landed differs), in interleaved rounds, twice: per copy the median of each pass, the spread,
the correlation of the two passes (a stable per-copy level, not noise), and per kernel the fastest copy's time
against the slowest's.

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


def one_process(system: str, name: str, threads: int, runs: int, no_aslr: bool = False) -> list[float]:
    cmd = [sys.executable, "-c", CHILD, system, name, str(threads), str(runs)]
    out = subprocess.run((["setarch", "-R"] if no_aslr else []) + cmd, check=True, capture_output=True, text=True,
                         env=os.environ)
    return json.loads(out.stdout.strip().splitlines()[-1])


def code_copies(name: str, n: int, threads: int, rounds: int = 10, runs: int = 5) -> None:
    from collections import defaultdict

    import numpy as np

    import kiln
    from kiln import zoo
    model, feeds = zoo.build(name), zoo.inputs(name)
    exes = [kiln.compile(model, num_threads=threads) for _ in range(n)]
    for e in exes[1:]:  # one weights blob and one arena for all: only the code differs
        e._weights, e._arena, e._weights_addr, e._arena_addr = (exes[0]._weights, exes[0]._arena,
                                                                exes[0]._weights_addr, exes[0]._arena_addr)
    for e in exes:
        for _ in range(10):
            e.run(feeds)
    prof = [defaultdict(float) for _ in exes]

    def one_pass(profile: bool) -> list[float]:
        ts: list[list[float]] = [[] for _ in exes]
        for _ in range(rounds):
            for i, e in enumerate(exes):
                for _ in range(runs):
                    t = time.perf_counter()
                    e.run(feeds, profile=prof[i] if profile else None)
                    ts[i].append(time.perf_counter() - t)
        return [statistics.median(t) * 1e3 for t in ts]
    a, b = one_pass(False), one_pass(True)
    spread = lambda v: 100 * (max(v) - min(v)) / min(v)  # noqa: E731
    print(f"{name}: {n} code copies, one weights blob and arena; per-copy median ms, two interleaved passes")
    print("pass 1:", " ".join(f"{x:.2f}" for x in a), f"(spread {spread(a):.1f}%)")
    print("pass 2:", " ".join(f"{x:.2f}" for x in b), f"(spread {spread(b):.1f}%)",
          f"correlation {float(np.corrcoef(a, b)[0, 1]):.2f}")
    fast, slow = int(np.argmin(b)), int(np.argmax(b))
    calls = rounds * runs
    print("| kernel | fastest copy ms | slowest copy ms | ratio |\n|---|---:|---:|---:|")
    for k in sorted(prof[fast], key=lambda k: -prof[fast][k])[:12]:
        f_ms, s_ms = prof[fast][k] / calls * 1e3, prof[slow][k] / calls * 1e3
        print(f"| {k} | {f_ms:.3f} | {s_ms:.3f} | {s_ms / f_ms:.2f} |")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("models", nargs="*", default=["gemm_1024", "mlp"])
    p.add_argument("--procs", type=int, default=5)
    p.add_argument("--runs", type=int, default=60)
    p.add_argument("--early", type=int, default=20)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--no-aslr", action="store_true", help="children under setarch -R (no address randomization)")
    p.add_argument("--copies", type=int, default=0, help="N code copies of one model in this process (see above)")
    a = p.parse_args()
    if a.copies:
        for name in a.models:
            code_copies(name, a.copies, a.threads)
        return
    print("| model | system | first runs median ms | later median ms | max ms | later medians over processes ms |")
    print("|---|---|---:|---:|---:|---|")
    systems = ("kiln", "onnxruntime")
    for name in a.models:
        one_process("kiln", name, a.threads, 2)  # fills Kiln's cache: every measured process loads from it
        early: dict[str, list[float]] = {s: [] for s in systems}
        late: dict[str, list[float]] = {s: [] for s in systems}
        worst = dict.fromkeys(systems, 0.0)
        for _ in range(a.procs):
            for system in systems:
                t = one_process(system, name, a.threads, a.runs, a.no_aslr)
                early[system].append(statistics.median(t[:a.early]) * 1e3)
                late[system].append(statistics.median(t[a.early:]) * 1e3)
                worst[system] = max(worst[system], max(t) * 1e3)
                time.sleep(1.0)
        for system in systems:
            lo, hi = min(late[system]), max(late[system])
            print(f"| {name} | {system} | {statistics.median(early[system]):.3f} | "
                  f"{statistics.median(late[system]):.3f} | {worst[system]:.3f} | {lo:.3f}–{hi:.3f} "
                  f"({100 * (hi - lo) / lo:.1f}%) |", flush=True)


if __name__ == "__main__":
    main()
