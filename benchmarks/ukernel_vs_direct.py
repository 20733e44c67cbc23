"""Kiln's ukernel strategy vs direct emission vs onnxruntime, interleaved in one process, on zoo workloads.

    python benchmarks/ukernel_vs_direct.py gemm_1024 gemm_odd conv_r50_3x3 [--rounds 15] [--runs 5]
           [--systems direct,ukernel,onnxruntime] [--target host|avx2]

Every system's outputs are checked against onnxruntime (≤ 1e-3 relative) first. Then `rounds` rounds, each
running every system `runs` times back to back (the order rotates per round), 2 threads for everyone; the
table shows the median ms over all runs and GFLOP/s from kiln.zoo.flops. `kiln bench --systems kiln,onnxruntime
--strategy kiln=direct,ukernel` measures the same in separate processes."""
from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import numpy as np

import kiln
from kiln import zoo


def make_runner(system: str, name: str, target: str, threads: int) -> Callable[[], list[np.ndarray]]:
    model, feeds = zoo.build(name), zoo.inputs(name)
    if system == "onnxruntime":
        import onnxruntime as ort
        so = ort.SessionOptions()
        so.intra_op_num_threads, so.inter_op_num_threads = threads, 1
        sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
        return lambda: sess.run(None, feeds)
    exe = kiln.compile(model, target=target, num_threads=threads, strategy=system)
    built = set(exe.meta["strategies"].values())
    if system != "direct" and system not in built:
        print(f"  note: {name} with strategy={system}: no anchor was built that way ({exe.meta['strategies']})")
    return lambda: exe.run(feeds)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("workloads", nargs="+")
    p.add_argument("--systems", default="direct,ukernel,onnxruntime")
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--target", default="host")
    p.add_argument("--cpu", action="store_true", help="also GFLOP/s from CPU time (see above)")
    a = p.parse_args()
    systems = a.systems.split(",")
    cols = [f"{s} ms" for s in systems] + [f"{s} GF/s" for s in systems] + \
        ([f"{s} cpu-GF/s" for s in systems] if a.cpu else [])
    print(f"| workload | {' | '.join(cols)} |")
    print("|---|" + "---:|" * len(cols))
    for name in a.workloads:
        runners = {s: make_runner(s, name, a.target, a.threads) for s in systems}
        ref = runners["onnxruntime"]() if "onnxruntime" in runners else None
        for s, run in runners.items():
            outs = run()
            if ref is not None:
                for o, r in zip(outs, ref):
                    err = float(np.abs(o - r).max() / max(float(np.abs(r).max()), 1e-6))
                    if err > 1e-3:
                        raise SystemExit(f"{name}/{s}: relative error {err:.2e} > 1e-3 vs onnxruntime")
            for _ in range(3):
                run()
        times: dict[str, list[float]] = {s: [] for s in systems}
        cpu: dict[str, list[float]] = {s: [] for s in systems}
        for rnd in range(a.rounds):
            order = systems[rnd % len(systems):] + systems[:rnd % len(systems)]
            for s in order:
                for _ in range(a.runs):
                    t, c = time.perf_counter(), time.process_time()
                    runners[s]()
                    cpu[s].append(time.process_time() - c)
                    times[s].append(time.perf_counter() - t)
        gf = zoo.flops(name) / 1e9
        ms = {s: float(np.median(v)) * 1e3 for s, v in times.items()}
        cells = [f"{ms[s]:.4g}" for s in systems] + [f"{gf / ms[s] * 1e3:.1f}" for s in systems]
        if a.cpu:
            cells += [f"{gf * a.threads / float(np.median(cpu[s])):.1f}" for s in systems]
        print(f"| {name} | {' | '.join(cells)} |", flush=True)


if __name__ == "__main__":
    main()
