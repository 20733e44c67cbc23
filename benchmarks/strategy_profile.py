"""Where the time goes, per kernel, for each of Kiln's strategies on one model — what backs the "why" of the
strategy table (packing, edge tiles, epilogue placement, parallel split).

    python benchmarks/strategy_profile.py resnet50 [direct ukernel library:mkl ...] [--threads 2] [--rounds 5]

Every strategy builds the same graph with the same fusion, so the kernels line up one to one (rows are named
after the first strategy's kernels: a library conv is `conv`, not `packedconv`); each is
compiled once and the rounds run the strategies interleaved (round-robin), per-kernel times summed through
Kiln's profile hook, medians per kernel over the rounds. Prints the kernels whose time differs most."""
from __future__ import annotations

import argparse
import statistics

from kiln import zoo


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("model")
    p.add_argument("strategies", nargs="*")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--runs", type=int, default=5, help="runs per round")
    p.add_argument("--top", type=int, default=15)
    a = p.parse_args()
    import kiln
    from kiln.autostrategy import candidates
    from kiln.target import host

    strategies = a.strategies or candidates(host())
    model, feeds = zoo.build(a.model), zoo.inputs(a.model)
    exes = {s: kiln.compile(model, num_threads=a.threads, strategy=s, cache=False) for s in strategies}
    per: dict[str, dict[str, list[float]]] = {s: {} for s in strategies}
    totals: dict[str, list[float]] = {s: [] for s in strategies}
    for exe in exes.values():
        exe.run(feeds)
    for _ in range(a.rounds):
        for s, exe in exes.items():
            prof: dict[str, float] = {}
            for _ in range(a.runs):
                exe.run(feeds, profile=prof)
            # kernels line up by position (same graph, same fusion); names differ (packedconv vs conv)
            pos = {name: i for i, name in enumerate(exe.kernel_names)}
            for k, sec in prof.items():
                per[s].setdefault(exes[strategies[0]].kernel_names[pos[k]], []).append(sec / a.runs * 1e3)
            totals[s].append(sum(prof.values()) / a.runs * 1e3)
    med = {s: {k: statistics.median(v) for k, v in per[s].items()} for s in strategies}
    base = strategies[0]
    kernels = sorted(med[base], key=lambda k: -max(abs(med[s].get(k, 0) - med[base][k]) for s in strategies))
    flops = dict(zip(exes[base].kernel_names, exes[base].meta.get("flops", [])))
    head = f"{'kernel':34s}" + "".join(f"{s:>16s}" for s in strategies)
    print(f"{a.model}, {a.threads} threads, ms per run (median of {a.rounds} interleaved rounds of {a.runs})")
    print(head)
    print(f"{'total':34s}" + "".join(f"{statistics.median(totals[s]):16.3f}" for s in strategies))
    for k in kernels[:a.top]:
        gf = flops.get(k, 0)
        cells = "".join(f"{med[s].get(k, float('nan')):16.3f}" for s in strategies)
        print(f"{k:34s}{cells}   " + (f"{gf / 1e9:.3f} GFLOP" if gf else "no anchor"))
    for s, exe in exes.items():
        built = list(exe.meta["strategies"].values())
        print(f"{s}: anchors built " + ", ".join(f"{how} ×{built.count(how)}" for how in sorted(set(built))))

if __name__ == "__main__":
    main()
