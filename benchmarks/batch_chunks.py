"""A dynamic transformer compiled without bounds: laid out for a chunk of samples (kernel/dynamic.py: batch_chunk,
the default) against the per-sample build it replaced (the kernels once per sample, every weight read once per
sample) and onnxruntime on the same model, in one interleaved run, 2 threads each.

    python benchmarks/batch_chunks.py [--model bert_base_dynamic] [--sizes 1x3,4x3,8x3,4x16,16x16,2x128] [--rounds 3]

Every size is checked against onnxruntime (max|Δ| / max|ref| ≤ 1e-4) before timing. Prints a markdown table: median
ms of each, chunked ÷ per-sample, chunked ÷ onnxruntime; and each build's compile time and arena."""
from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

import onnxruntime as ort

import kiln
import kiln.kernel.dynamic as dynamic
from kiln import zoo
from kiln.runtime.coreprobe import host_state

sys.path.insert(0, str(Path(__file__).parent))
from dynamic_report import TOLERANCE, feeds_for, rel_err, timed  # noqa: E402


def builds(model, threads: int) -> dict[str, kiln.Executable]:  # noqa: ANN001 - an onnx.ModelProto
    out = {}
    t = time.perf_counter()
    out["chunked"] = kiln.compile(model, num_threads=threads, cache=False, tuning="off")
    secs = {"chunked": time.perf_counter() - t}
    chosen = dynamic.batch_chunk
    dynamic.batch_chunk = lambda graph: None  # the build before: one sample at a time (kernel/dynamic.py: per_sample)
    try:
        t = time.perf_counter()
        out["per-sample"] = kiln.compile(model, num_threads=threads, cache=False, tuning="off")
        secs["per-sample"] = time.perf_counter() - t
    finally:
        dynamic.batch_chunk = chosen
    for name, exe in out.items():
        d = exe.meta["dynamic"]
        print(f"{name}: compiled in {secs[name]:.2f} s, arena {exe.meta['arena_bytes'] / 2**20:.0f} MiB, bounds "
              f"{d['bounds']}, per-sample over {d['per_sample']}, chunk {d.get('chunk')}")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="bert_base_dynamic")
    ap.add_argument("--sizes", default="1x3,4x3,8x3,4x16,16x16,2x128")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--gap", type=float, default=0.6, help="idle seconds before each system's batch")
    args = ap.parse_args()
    model = zoo.build(args.model)
    kiln.compile(model, num_threads=args.threads, cache=False, tuning="off",  # warm-up: imports, caches
                 input_shapes={k: v.shape for k, v in feeds_for(model, (1, 3)).items()})
    exes = builds(model, args.threads)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads, opts.inter_op_num_threads = args.threads, 1
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    rows = []
    for size in [tuple(int(x) for x in s.split("x")) for s in args.sizes.split(",")]:
        feeds = feeds_for(model, size)
        ref = sess.run(None, feeds)
        for name, exe in exes.items():
            err = max(rel_err(r, g) for r, g in zip(ref, exe.run(feeds)))
            if err > TOLERANCE:
                raise SystemExit(f"{size}: Kiln {name} differs from onnxruntime by {err:.2e} > {TOLERANCE}")
        systems = {**{k: (lambda f=feeds, e=e: e.run(f)) for k, e in exes.items()},
                   "onnxruntime": lambda f=feeds: sess.run(None, f)}
        budget = min(1.0, max(0.2, 3 * statistics.median(timed(systems["chunked"], 0.0))))
        samples: dict[str, list[float]] = {k: [] for k in systems}
        order, states = list(systems), []
        for r in range(args.rounds):
            random.Random(r).shuffle(order)
            states.append(host_state())
            for k in order:
                time.sleep(args.gap)  # (the previous system may still be spinning its pool)
                samples[k] += timed(systems[k], budget)
        med = {k: 1e3 * statistics.median(v) for k, v in samples.items()}
        rows.append((size, med))
        print(f"  {size}: " + ", ".join(f"{k} {v:.3f} ms" for k, v in med.items()) + f"  (host: {', '.join(states)})",
              flush=True)
    print("\n| size | chunked ms | per-sample ms | onnxruntime ms | chunked ÷ per-sample | chunked ÷ onnxruntime |")
    print("|---|---:|---:|---:|---:|---:|")
    for size, med in rows:
        print(f"| {'×'.join(map(str, size))} | {med['chunked']:.3f} | {med['per-sample']:.3f} | "
              f"{med['onnxruntime']:.3f} | {med['chunked'] / med['per-sample']:.2f} | "
              f"{med['chunked'] / med['onnxruntime']:.2f} |")


if __name__ == "__main__":
    main()
