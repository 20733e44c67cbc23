"""A model built with and without one compiler option, both in one process, each batch labelled with the host's state
(kiln/runtime/coreprobe.py: the two vCPUs on one L3 or on two): median ms per build and state, and the named
kernels' times from the profile hook.

    python benchmarks/option_by_host_state.py resnet18 --off memory_reuse [--rounds 60]
        [--kernels k2_winogradinput,k15_winogradinput] [--precision fp32|bf16|int8]

`--precision int8`: the model quantized first (kiln.quantize, min/max over 8 zoo inputs, seeds 100..); bf16: built
with precision="bf16".

Issue 19.4: with `--off memory_reuse`, resnet18's Winograd input transforms stop growing on two L3s."""
from __future__ import annotations

import argparse

import kiln
from kiln import zoo
from kiln.tune.verify import compare


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model")
    p.add_argument("--off", required=True, help="a kiln.PASS_OPTIONS switch to turn off in the second build")
    p.add_argument("--rounds", type=int, default=60, help="interleaved rounds (each: one batch of every build)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--kernels", default="", help="comma-separated kernel names to report")
    p.add_argument("--precision", default="fp32", choices=("fp32", "bf16", "int8"))
    a = p.parse_args()
    model, feeds = zoo.build(a.model), zoo.inputs(a.model)
    if a.precision == "int8":
        model = kiln.quantize(model, [zoo.inputs(a.model, seed=100 + i) for i in range(8)])
    kw = {"num_threads": a.threads, "cache": False, "precision": "bf16" if a.precision == "bf16" else "fp32"}
    off = f"{a.off} off"
    builds = {"default": kiln.compile(model, **kw), off: kiln.compile(model, **kw, **{a.off: False})}
    # kiln tune's step-5 comparison: idle gap and state probe before each batch, order reversed every other round
    c = compare(builds, feeds, rounds=a.rounds, profile=True, max_rounds=a.rounds)
    states = c.seen()
    count = {st: {n: sum(r[n][0] == st for r in c.rounds) for n in builds} for st in states}
    print(f"| {a.model} | " + " | ".join(f"{st}: {n} ms (batches)" for st in states for n in builds) + " |")
    print("|---|" + "---:|" * (len(states) * len(builds)))
    cells = [f"{c.seconds(n, st) * 1e3:.2f} ({count[st][n]})" if count[st][n] else "–" for st in states for n in builds]
    print("| whole model | " + " | ".join(cells) + " |")
    for k in (k for k in a.kernels.split(",") if k):
        cells = [f"{c.kernels[st][n][k] * 1e3:.3f}" if k in c.kernels.get(st, {}).get(n, {}) else "–"
                 for st in states for n in builds]
        print(f"| {k} | " + " | ".join(cells) + " |")
    print(f"paired {off} ÷ default: all rounds {c.ratio(off, 'default'):.3f}"
          + "".join(f", {st} {c.ratio(off, 'default', st):.3f} ({c.paired(st)} rounds)" for st in c.judged()))


if __name__ == "__main__":
    main()
