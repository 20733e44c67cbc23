"""Dynamic shapes (issue 15): one compilation serving every size, against Kiln compiled statically for each size
and onnxruntime running the same dynamic model. One interleaved run per model, 2 threads for everyone.

    python benchmarks/dynamic_report.py bert_base_dynamic gpt_decoder resnet50_dynamic --rounds 3
    python benchmarks/dynamic_report.py bert_base_dynamic --bounds batch=1:4,seq=1:512 --sizes 4x16,1x16
    kiln tune zoo:gpt_decoder --bounds batch=1:4,seq=1:512 --db d.db && \
        python benchmarks/dynamic_report.py gpt_decoder --bounds batch=1:4,seq=1:512 --tuning d.db

For each model: the dynamic executable is compiled once (compile cache off; after an untimed warm-up compile, as
every static one is; its compile time is the median of that one and two more among the static compiles) and the
number of compilations it took is read from exe.meta; Kiln's static executable is compiled per size (input_shapes=);
onnxruntime gets the dynamic model. At every size Kiln dynamic is checked against onnxruntime (max|Δ| / max|ref| ≤
1e-4) before timing.
Rounds run the three systems in a shuffled order, each after an idle gap (runtimes spin their pools after a call).
Prints a markdown table: median ms, and the ratios the issue's bar names (dynamic ÷ static ≤ 1.1, ÷ ORT ≤ 1.0)."""
from __future__ import annotations

import argparse
import random
import statistics
import time

import numpy as np
import onnxruntime as ort

import kiln
from kiln import zoo
from kiln.cli import parse_bounds
from kiln.runtime.coreprobe import host_state

SIZES = {  # (batch, seq) or (batch,) per model, as the issue asks
    "bert_base_dynamic": [(b, s) for b in (1, 4) for s in (1, 3, 16, 77, 128, 200, 384, 512)],
    "gpt_decoder": [(b, s) for b in (1, 4) for s in (1, 3, 16, 77, 128, 200, 384, 512)],
    "resnet50_dynamic": [(b,) for b in (1, 2, 8)],
    "resnet18_dynamic": [(b,) for b in (1, 2, 8)],
}
TOLERANCE = 1e-4


def feeds_for(model, size: tuple[int, ...], seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {}
    for v in model.graph.input:
        dims = [d.dim_value if d.HasField("dim_value") else None for d in v.type.tensor_type.shape.dim]
        it = iter(size)
        shape = tuple(d if d is not None else next(it) for d in dims)
        if v.type.tensor_type.elem_type == 7:  # int64 token ids
            out[v.name] = rng.integers(0, 1000, shape).astype(np.int64)
        else:
            out[v.name] = rng.standard_normal(shape).astype(np.float32)
    return out


def rel_err(ref: np.ndarray, got: np.ndarray) -> float:
    """max|got − ref| ÷ max|ref|."""
    return float(np.max(np.abs(ref - got)) / max(float(np.max(np.abs(ref))), 1e-30))


def timed(fn, seconds: float) -> list[float]:
    fn()
    times = []
    end = time.perf_counter() + seconds
    while True:
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
        if time.perf_counter() > end and len(times) >= 2:
            return times


def report(name: str, rounds: int, threads: int, gap: float, sizes: list[tuple[int, ...]],
           bounds: dict[str, tuple[int, int]] | None = None, tuning: str | None = None) -> None:
    model = zoo.build(name)
    # a warm-up compile, not timed: the first compile of a process also imports Kiln's passes and fills its caches
    # (~0.1 s), which would be charged to the dynamic build alone — every compile timed below is a warm one
    kiln.compile(model, num_threads=threads, cache=False,
                 input_shapes={k: v.shape for k, v in feeds_for(model, sizes[0]).items()}, tuning="off")
    t = time.perf_counter()
    dyn = kiln.compile(model, num_threads=threads, cache=False, dynamic_bounds=bounds, tuning="off")
    dyn_s = [time.perf_counter() - t]
    tuned = None
    if tuning:  # the same dynamic build with the records of `kiln tune --bounds` (tuned once, over sizes)
        tuned = kiln.compile(model, num_threads=threads, cache=False, dynamic_bounds=bounds, tuning=tuning)
        print(f"tuned dynamic build: {len(tuned.meta['tuned'])} kernels run tuned schedules ({tuning})")
    opts = ort.SessionOptions()
    opts.intra_op_num_threads, opts.inter_op_num_threads = threads, 1
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    print(f"\n### {name}: compiled once in {dyn_s[0]:.2f} s ({dyn.meta['compilations']} compilation, "
          f"symbols {dyn.meta['dynamic']['symbols']}, per-sample over {dyn.meta['dynamic']['per_sample']})")
    rows, static_s = [], []
    for size in sizes:
        feeds = feeds_for(model, size)
        shapes = {k: v.shape for k, v in feeds.items()}
        time.sleep(gap)  # (the previous size's last system may still be spinning its pool)
        if len(static_s) in (len(sizes) // 3, 2 * len(sizes) // 3):  # the dynamic compile again, among the static
            t = time.perf_counter()                                     # ones: one compile is one noisy sample
            kiln.compile(model, num_threads=threads, cache=False, dynamic_bounds=bounds, tuning="off")
            dyn_s.append(time.perf_counter() - t)
            time.sleep(gap)
        t = time.perf_counter()
        static = kiln.compile(model, num_threads=threads, cache=False, input_shapes=shapes, tuning="off")
        static_s.append(time.perf_counter() - t)
        ref = sess.run(None, feeds)
        err = max(rel_err(r, g) for exe in ([dyn] if tuned is None else [dyn, tuned])
                  for r, g in zip(ref, exe.run(feeds)))
        if err > TOLERANCE:
            raise SystemExit(f"{name} {size}: Kiln dynamic differs from onnxruntime by {err:.2e} > {TOLERANCE}")
        systems = {"dynamic": lambda f=feeds: dyn.run(f), "static": lambda f=feeds, s=static: s.run(f),
                   "onnxruntime": lambda f=feeds: sess.run(None, f)}
        if tuned is not None:
            systems["tuned"] = lambda f=feeds: tuned.run(f)
        one = statistics.median(timed(systems["dynamic"], 0.0))
        budget = min(1.0, max(0.2, 3 * one))
        samples: dict[str, list[float]] = {k: [] for k in systems}
        order = list(systems)
        states = []
        for r in range(rounds):
            random.Random(r).shuffle(order)
            states.append(host_state())  # the vCPUs on one L3 or on two: a schedule may win in one, lose in the other
            for k in order:
                time.sleep(gap)
                samples[k] += timed(systems[k], budget)
        med = {k: 1e3 * statistics.median(v) for k, v in samples.items()}
        rows.append((size, med, err))
        print(f"  {size}: dynamic {med['dynamic']:.3f} ms, static {med['static']:.3f}, onnxruntime "
              f"{med['onnxruntime']:.3f}" + (f", dynamic tuned {med['tuned']:.3f}" if tuned else "") +
              f"  (err {err:.1e}; host per round: {', '.join(states)})", flush=True)
    print(f"\nstatic compile per size: median {statistics.median(static_s):.2f} s; dynamic once: median "
          f"{statistics.median(dyn_s):.2f} s of {len(dyn_s)} ({', '.join(f'{x:.2f}' for x in dyn_s)}) = "
          f"{statistics.median(dyn_s) / statistics.median(static_s):.2f}× one static compile\n")
    extra = " Kiln dynamic tuned ms | tuned ÷ static | tuned ÷ onnxruntime |" if tuned else ""
    print("| size | Kiln dynamic ms | Kiln static ms | onnxruntime (dynamic model) ms | dynamic ÷ static | "
          "dynamic ÷ onnxruntime |" + extra + " max rel err |")
    print("|---|---:|---:|---:|---:|---:|" + ("---:|" * 3 if tuned else "") + "---:|")
    for size, med, err in rows:
        more = (f" {med['tuned']:.3f} | {med['tuned'] / med['static']:.2f} | {med['tuned'] / med['onnxruntime']:.2f} |"
                if tuned else "")
        print(f"| {'×'.join(map(str, size))} | {med['dynamic']:.3f} | {med['static']:.3f} | {med['onnxruntime']:.3f} "
              f"| {med['dynamic'] / med['static']:.2f} | {med['dynamic'] / med['onnxruntime']:.2f} |{more} {err:.1e} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("models", nargs="+", choices=sorted(SIZES))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--gap", type=float, default=0.6, help="idle seconds before each system's turn")
    ap.add_argument("--sizes", help="override: e.g. '1x1,4x128' (batch x seq) or '1,8' (batch)")
    ap.add_argument("--bounds", help="dynamic_bounds of the dynamic build: e.g. 'batch=1:4,seq=1:512' (default: "
                    "each symbol (1, 512))")
    ap.add_argument("--tuning", metavar="DB", help="also time the dynamic build with this tuning database's records "
                    "(kiln tune --bounds: tuned once over sizes); the other Kiln builds run untuned")
    a = ap.parse_args()
    bounds = parse_bounds(a.bounds)
    for name in a.models:
        sizes = SIZES[name] if not a.sizes else [tuple(int(x) for x in s.split("x")) for s in a.sizes.split(",")]
        report(name, a.rounds, a.threads, a.gap, sizes, bounds, a.tuning)


if __name__ == "__main__":
    main()
