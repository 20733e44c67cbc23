"""The search policies side by side (issue 14: the search's design justified by measurement): for each workload,
each policy of `kiln.tune.search.POLICIES` and each seed, `kiln.tune.tune` with the same trial budget into a fresh
database (no seeds from earlier runs, no verification step), then, for the model's largest kernel, the best time
measured after n trials ÷ the best any policy found for it, averaged over the seeds; then each run's pick (its
fastest measured configuration) re-timed, all picks of the workload interleaved in `--rounds` rounds in one
measuring process — the search's own minimum over many noisy timings flatters lucky candidates.

    python benchmarks/search_policies.py gemm_1024 gemm_odd conv_r50_3x3 [--trials 64] [--seeds 0,1]
        [--policies evolutionary,random,model-random,local] [--target host|avx2] [--threads 2] [--rounds 7]

The times are the search's own (each candidate's median over its samples, measured one at a time in the measuring
process); every run of one workload happens in this one sitting, the policies in turn within each seed. Wrap in
`flock /tmp/kiln-measure.lock` on a shared machine."""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time

from kiln import zoo
from kiln.target import resolve
from kiln.tune import tune
from kiln.tune.database import TuningDatabase
from kiln.tune.measure import Measurer, build_candidate
from kiln.tune.search import POLICIES
from kiln.tune.tuner import kernels_of
from kiln.tune.workload import target_key, workloads_of


def best_so_far(db_path: str, sig: str, tkey: str) -> tuple[list[float], dict]:
    """The running minimum of the ok measurements of `sig`, in the order they were made (the default first), and
    the configuration of the fastest."""
    with TuningDatabase(db_path, create=False) as db:
        rows = db.measurements(sig, tkey)
    out, best, pick = [], float("inf"), {}
    for m in rows:
        if m.status == "ok" and m.seconds and m.seconds < best:
            best, pick = m.seconds, m.config
        out.append(best)
    return out, pick


def retime(model, sig: str, picks: dict[str, list[dict]], target: str, threads: int, rounds: int
           ) -> dict[str, list[float]]:
    """Each policy's picks (one per seed) built again and timed in turns, `rounds` times: median s per pick."""
    tgt = resolve(target)
    (w,) = [w for w in workloads_of(kernels_of(model, tgt, threads, {})) if w.sig == sig]
    built = {(pol, i): build_candidate(w.kernel, tgt, threads, {}, cfg, with_features=False)
             for pol, cfgs in picks.items() for i, cfg in enumerate(cfgs)}
    times: dict[tuple[str, int], list[float]] = {k: [] for k in built}
    measurer = Measurer()
    try:
        for r in range(rounds):
            for k in (list(built) if r % 2 == 0 else list(built)[::-1]):
                res = measurer.measure(built[k], tgt, threads, want_outputs=False)
                if res.status == "ok":
                    times[k].append(res.seconds)
    finally:
        measurer.close()
    return {pol: [statistics.median(times[(pol, i)]) for i in range(len(cfgs))] for pol, cfgs in picks.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("workloads", nargs="+")
    p.add_argument("--trials", type=int, default=64)
    p.add_argument("--seeds", default="0,1")
    p.add_argument("--policies", default=",".join(POLICIES))
    p.add_argument("--target", default="host")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=7)
    a = p.parse_args()
    seeds = [int(s) for s in a.seeds.split(",")]
    policies = a.policies.split(",")
    checkpoints = [n for n in (8, 16, 32, 64, 128, 256) if n < a.trials] + [a.trials]
    tkey = target_key(resolve(a.target), a.threads)
    print(f"target {tkey}; {a.trials} trials per run; seeds {seeds}\n")
    print("| workload | policy | " + " | ".join(f"after {n}" for n in checkpoints)
          + " | trials to ≤ 1.02× | tuning s | pick re-timed ÷ best pick |\n|---|---|"
          + "---:|" * (len(checkpoints) + 3))
    for name in a.workloads:
        model = zoo.build(name)
        curves: dict[str, list[list[float]]] = {pol: [] for pol in policies}
        picks: dict[str, list[dict]] = {pol: [] for pol in policies}
        secs: dict[str, list[float]] = {pol: [] for pol in policies}
        sig = None
        for seed in seeds:
            for pol in policies:
                with tempfile.TemporaryDirectory() as tmp:
                    path = f"{tmp}/t.db"
                    t0 = time.perf_counter()
                    report = tune(model, budget_s=3600, per_kernel_s=3600, db=path, target=a.target,
                                  num_threads=a.threads, workers="local", progress=False, seed=seed,
                                  max_trials=a.trials, verify=False, search=pol)
                    secs[pol].append(time.perf_counter() - t0)
                    if sig is None:  # the model's largest kernel: the one the search matters for
                        sig = max(report.results, key=lambda r: (r.default_s or 0) * report.counts[r.sig]).sig
                    curve, pick = best_so_far(path, sig, tkey)
                    curves[pol].append(curve)
                    picks[pol].append(pick)
        best = min(min(c) for cs in curves.values() for c in cs)
        again = retime(model, sig, picks, a.target, a.threads, a.rounds)
        best_again = min(min(v) for v in again.values())
        for pol in policies:
            cells = []
            for n in checkpoints:
                cells.append(f"{statistics.mean(c[min(n, len(c)) - 1] / best for c in curves[pol]):.3f}")
            reach = [next((i + 1 for i, v in enumerate(c) if v <= 1.02 * best), None) for c in curves[pol]]
            reached = "/".join(str(r) if r else "—" for r in reach)
            ratios = "/".join(f"{v / best_again:.3f}" for v in again[pol])
            print(f"| {name} | {pol} | " + " | ".join(cells) + f" | {reached} | "
                  f"{statistics.mean(secs[pol]):.0f} | {ratios} |", flush=True)


if __name__ == "__main__":
    main()
