"""Do a model's per-kernel tuning gains carry into the model? Where they do not, why: per distinct kernel
(workload signature), whether the database has a record for this target, whether kiln.compile applied it
(`exe.meta["tuned"]`) or rejected it (and why), the speedup the tuner measured for the kernel alone, and the
speedup the same kernel shows inside the model (Kiln's profile hook, default build vs tuned build, interleaved).

    flock /tmp/kiln-measure.lock python benchmarks/tuned_in_model.py bert_base --db FILE [--threads 2] [--runs 20]

`kiln tune zoo:bert_base --budget-s N --db FILE` first. The table lists the workloads by their share of the
default build's time; its last line compares the whole model's default and tuned medians, and what the
alone-measured speedups would predict (each workload's in-model default time ÷ its recorded speedup)."""
from __future__ import annotations

import argparse
import time
from types import SimpleNamespace

import numpy as np

from kiln import zoo
from kiln.compiler import check_options, executable_of, lower
from kiln.target import host
from kiln.tune.apply import apply_tuning
from kiln.tune.database import TuningDatabase
from kiln.tune.tuner import kernels_of
from kiln.tune.workload import kernel_class, signature, target_key


def profiled(exe, feeds: dict, runs: int) -> tuple[list[dict[str, float]], list[float]]:  # noqa: ANN001
    """Each run's seconds per kernel, and each run's wall time."""
    profs, walls = [], []
    for _ in range(runs):
        prof: dict[str, float] = {}
        t = time.perf_counter()
        exe.run(feeds, profile=prof)
        walls.append(time.perf_counter() - t)
        profs.append(prof)
    return profs, walls


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model")
    p.add_argument("--db", required=True)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--runs", type=int, default=10, help="profiled runs per round (per kernel: the median of all)")
    p.add_argument("--rounds", type=int, default=4, help="rounds, alternating default and tuned")
    a = p.parse_args()
    model, feeds = zoo.build(a.model), zoo.inputs(a.model)
    tgt, opts = host(), check_options({})
    db = TuningDatabase(a.db, create=False)
    tkey = target_key(tgt, a.threads)
    records = db.bests(tkey)
    default = lower(model, tgt, a.threads, opts, tuning=None)
    tuned = lower(model, tgt, a.threads, opts, tuning=db)
    plain = kernels_of(model, tgt, a.threads, opts)   # unscheduled, as apply_tuning sees them
    applied = apply_tuning(SimpleNamespace(kernels=plain), db, tgt, a.threads, opts)  # for the rejections' reasons
    sig_of = {k.name: signature(k) for k in plain}
    exes = {"default": executable_of(default, tgt, a.threads), "tuned": executable_of(tuned, tgt, a.threads)}
    for exe in exes.values():
        for _ in range(3):
            exe.run(feeds)
    runs: dict[str, list[dict[str, float]]] = {s: [] for s in exes}
    walls: dict[str, list[float]] = {s: [] for s in exes}
    for r in range(a.rounds):
        for s in (list(exes) if r % 2 == 0 else list(exes)[::-1]):
            time.sleep(1.0)
            pr, w = profiled(exes[s], feeds, a.runs)
            runs[s] += pr
            walls[s] += w
    # per kernel, the median over runs (a load spike in one run does not move it)
    prof = {s: {k: float(np.median([p.get(k, 0.0) for p in runs[s]])) for k in runs[s][0]} for s in exes}
    by_sig: dict[str, dict] = {}
    for k in default.program.kernels:
        sig = sig_of[k.name]
        row = by_sig.setdefault(sig, {"klass": kernel_class(k), "n": 0, "default": 0.0, "tuned": 0.0, "names": []})
        row["n"] += 1
        row["names"].append(k.name)
        row["default"] += prof["default"].get(k.name, 0.0)
        row["tuned"] += prof["tuned"].get(k.name, 0.0)
    total = sum(r["default"] for r in by_sig.values())
    meta = tuned.tuned
    print(f"{a.model}, {a.threads} threads, database {a.db}: {len(records)} records for this target; "
          f"{len({v['sig'] for v in meta.values()})} workloads applied ({len(meta)} kernels), "
          f"{len(applied.rejected)} kernels' records rejected")
    print("| class | sig | × | share of default | record | applied | alone: speedup | in model: default ms → tuned ms "
          "(speedup) |")
    print("|---|---|---:|---:|---|---|---:|---|")
    predicted = 0.0
    for sig, r in sorted(by_sig.items(), key=lambda kv: -kv[1]["default"]):
        rec = records.get(sig)
        is_applied = any(n in meta for n in r["names"])
        why = next((applied.rejected[n] for n in r["names"] if n in applied.rejected), "")
        alone = rec.speedup if rec else None
        predicted += r["default"] / (alone if is_applied and alone else 1.0)
        if r["default"] / total < 0.005 and not is_applied:
            continue
        state = "yes" if is_applied else (f"rejected: {why[:60]}" if why else ("default won" if rec else "—"))
        print(f"| {r['klass']} | {sig[:8]} | {r['n']} | {100 * r['default'] / total:.1f}% | "
              f"{'yes' if rec else 'no'} | {state} | {f'{alone:.2f}' if alone else '—'} | "
              f"{r['default'] * 1e3:.3f} → {r['tuned'] * 1e3:.3f} ({r['default'] / max(r['tuned'], 1e-12):.2f}) |")
    md, mt = (float(np.median(walls[s])) * 1e3 for s in ("default", "tuned"))
    print(f"\nmodel median: default {md:.2f} ms, tuned {mt:.2f} ms (tuned ÷ default {mt / md:.3f}); kernels' sum "
          f"{total * 1e3:.2f} ms; predicted from the alone-measured speedups {predicted * 1e3:.2f} ms "
          f"({predicted / total:.3f} of the kernels' sum)")


if __name__ == "__main__":
    main()
