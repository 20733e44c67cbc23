"""A batched GEMM's rows merged across the batch (kiln/kernel/analysis.py: fuse_row_axes) against the same static
build without the merge, in one interleaved run per size.

    python benchmarks/batched_rows.py [4x1 4x3 4x16 ...] [--model bert_base_dynamic] [--int8] [--rounds 6]

bert_base_dynamic (or any zoo model with symbolic batch and sequence dims) compiled statically for each size
(`input_shapes=`), twice: as Kiln builds it, and with `fuse_row_axes` replaced by the identity (each batch entry
its own GEMM, every weight panel streamed once per entry). `--int8`: both builds of kiln.quantize's model
(calibrated on the size's own input). Prints median ms of each, their ratio and the outputs' relative difference."""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

import kiln
import kiln.schedule.default as default_schedule
from kiln import zoo

sys.path.insert(0, str(Path(__file__).parent))
from dynamic_report import feeds_for  # noqa: E402


def timed(exe: kiln.Executable, feeds: dict[str, np.ndarray], runs: int = 10) -> float:
    for _ in range(3):
        exe.run(feeds)
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        exe.run(feeds)
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("sizes", nargs="*", default=["4x1", "4x3", "4x16", "2x77", "1x16"])
    p.add_argument("--model", default="bert_base_dynamic")
    p.add_argument("--int8", action="store_true")
    p.add_argument("--rounds", type=int, default=6)
    a = p.parse_args()
    base = zoo.build(a.model)
    print("| size | unmerged ms | merged ms | merged ÷ unmerged | outputs rel. diff |\n|---|---:|---:|---:|---:|")
    for size in a.sizes:
        feeds = feeds_for(base, tuple(int(x) for x in size.split("x")))
        model = kiln.quantize(base, [feeds]) if a.int8 else base
        shapes = {k: v.shape for k, v in feeds.items()}
        merged = kiln.compile(model, num_threads=2, cache=False, input_shapes=shapes, tuning="off")
        keep = default_schedule.fuse_row_axes
        default_schedule.fuse_row_axes = lambda c, shape_of: c
        try:
            unmerged = kiln.compile(model, num_threads=2, cache=False, input_shapes=shapes, tuning="off")
        finally:
            default_schedule.fuse_row_axes = keep
        want, got = unmerged.run(feeds)[0], merged.run(feeds)[0]
        diff = float(np.max(np.abs(want - got)) / max(float(np.max(np.abs(want))), 1e-30))
        res: dict[str, list[float]] = {"unmerged": [], "merged": []}
        for r in range(a.rounds):
            for name in ("unmerged", "merged") if r % 2 == 0 else ("merged", "unmerged"):
                res[name].append(timed(unmerged if name == "unmerged" else merged, feeds))
        u, m = statistics.median(res["unmerged"]), statistics.median(res["merged"])
        print(f"| {size} | {u:.2f} | {m:.2f} | {m / u:.2f} | {diff:.1e} |", flush=True)


if __name__ == "__main__":
    main()
