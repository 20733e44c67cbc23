"""Tuned ÷ default per model, both builds in ONE process, interleaved (kiln/tune/verify.py's comparison: idle gap
before each batch, medians over rounds), so that what the host does to a process — which vCPUs, one L3 or two —
hits both builds alike. `kiln bench --tuned` measures each build in its own worker process; on a host whose vCPUs
move between L3s, two processes running the *same* code differ by several percent (conv_dw 1.07×, mlp 1.03× with
no tuned kernel at all), which hides a tuning gain or loss of that size.

    python benchmarks/tuned_vs_default.py resnet50 mobilenetv2 ... [--target host|avx2|sse] [--rounds 15]
        [--db FILE] [--threads 2]

Each batch is labelled with the host's state just before it (kiln/runtime/coreprobe.py: the two vCPUs on one L3 or
on two); the last column is tuned ÷ default within each state seen in at least 3 rounds of both builds.

A model without a tuned kernel (every record the default, or none) is listed with its builds identical."""
from __future__ import annotations

import argparse
import math

from kiln import compile as kiln_compile
from kiln import zoo
from kiln.tune.verify import compare


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("models", nargs="+")
    p.add_argument("--target", default="host")
    p.add_argument("--db", default="auto", help="tuning database (default: $KILN_CACHE_DIR/tuning.db)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=15)
    a = p.parse_args()
    print("| model | width | kernels tuned | default ms | tuned ms | tuned ÷ default | per host state (rounds) |\n"
          "|---|---|---:|---:|---:|---:|---|")
    ratios = []
    for name in a.models:
        model = zoo.build(name)
        build = {t: kiln_compile(model, target=a.target, num_threads=a.threads, cache=False, tuning=t)
                 for t in ("off", a.db)}
        tuned = len(build[a.db].meta.get("tuned") or {})
        if not tuned:
            print(f"| {name} | {a.target} | 0 | | | (identical builds) | |", flush=True)
            continue
        c = compare({"default": build["off"], "tuned": build[a.db]}, zoo.inputs(name), rounds=a.rounds,
                    max_rounds=2 * a.rounds)
        t, r = c.overall, c.ratio("tuned", "default")
        ratios.append(r)
        print(f"| {name} | {a.target} | {tuned} | {t['default'] * 1e3:.4g} | {t['tuned'] * 1e3:.4g} | {r:.3f} | "
              f"{c.states_text('tuned', 'default')} |", flush=True)
    if ratios:
        geo = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
        print(f"| geometric mean ({len(ratios)} models with tuned kernels) | | | | | {geo:.3f} | |")


if __name__ == "__main__":
    main()
