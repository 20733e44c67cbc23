"""What one parallel loop costs in synchronisation, by host state (issue 19.4): Kiln's pool (runtime/threadpool.py)
runs a job of `--chunks` chunks of busy work, on 1 thread and on 2, in the same batch; the 2-thread time over half the
1-thread time is what publishing, joining, stealing and waiting cost. Each batch is labelled by a probe taken just
before it (kiln/runtime/coreprobe.py: the two vCPUs on one L3 or on two).

    python benchmarks/pool_sync.py [--work 10000] [--chunks 4] [--seconds 120]

Prints per host state: batches, median µs per call on 1 and 2 threads, and the 2-thread excess. The chunk function is
a JIT-compiled loop of `--work` dependent increments (~1 µs per 1000 on Zen 5), so both threads take part."""
from __future__ import annotations

import argparse
import ctypes
import os
import sys
import time

import numpy as np

from kiln.codegen.jit import LoadedObject, emit_object, optimize
from kiln.runtime.coreprobe import TWO_L3_NS, round_trip_ns
from kiln.runtime.threadpool import pool_address
from kiln.target import host

BUSY = """define void @busy(ptr %ctx, i64 %chunk) {
entry:
  %a = alloca i64
  store volatile i64 0, ptr %a
  br label %loop
loop:
  %i = phi i64 [0, %entry], [%n, %loop]
  %v = load volatile i64, ptr %a
  %w = add i64 %v, 1
  store volatile i64 %w, ptr %a
  %n = add i64 %i, 1
  %d = icmp slt i64 %n, WORK
  br i1 %d, label %loop, label %out
out:
  ret void
}"""


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--work", type=int, default=10000, help="increments per chunk")
    p.add_argument("--chunks", type=int, default=4)
    p.add_argument("--seconds", type=float, default=120.0)
    a = p.parse_args()
    if len(os.sched_getaffinity(0)) < 2:
        sys.exit("needs two CPUs")
    tgt = host()
    busy = LoadedObject(emit_object(optimize(BUSY.replace("WORK", str(a.work)), tgt), tgt), tgt)
    fn = busy.address("busy")
    run = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int32)(pool_address())
    for _ in range(500):
        run(fn, None, a.chunks, 2)
    rows = []
    end = time.time() + a.seconds
    while time.time() < end:
        time.sleep(0.2)  # the pool's worker spins on after a job: the probe would wait for its CPU
        row = [round_trip_ns()]
        for threads in (1, 2):
            for _ in range(50):
                run(fn, None, a.chunks, threads)
            t = time.perf_counter()
            for _ in range(500):
                run(fn, None, a.chunks, threads)
            row.append((time.perf_counter() - t) / 500 * 1e6)
        rows.append(row)
    print("| host | batches | 1 thread µs | 2 threads µs | 2 threads − half of 1 µs |")
    print("|---|---:|---:|---:|---:|")
    for two in (False, True):
        sel = np.array([r for r in rows if (r[0] >= TWO_L3_NS) == two])
        if len(sel):
            one_t, two_t = np.median(sel[:, 1]), np.median(sel[:, 2])
            print(f"| {'two L3s' if two else 'one L3'} | {len(sel)} | {one_t:.2f} | {two_t:.2f} | "
                  f"{two_t - one_t / 2:.2f} |")


if __name__ == "__main__":
    main()
