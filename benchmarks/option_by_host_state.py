"""A model built with and without one compiler option, both in one process, each batch labelled with the host's state
(kiln/runtime/coreprobe.py: the two vCPUs on one L3 or on two): median ms per build and state, and the named
kernels' times from the profile hook.

    python benchmarks/option_by_host_state.py resnet18 --off memory_reuse [--seconds 100]
        [--kernels k2_winogradinput,k15_winogradinput]

Issue 19.4: with `--off memory_reuse`, resnet18's Winograd input transforms stop growing on two L3s."""
from __future__ import annotations

import argparse
import time

import numpy as np

import kiln
from kiln import zoo
from kiln.runtime.coreprobe import host_state


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model")
    p.add_argument("--off", required=True, help="a kiln.PASS_OPTIONS switch to turn off in the second build")
    p.add_argument("--seconds", type=float, default=100.0)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--kernels", default="", help="comma-separated kernel names to report")
    a = p.parse_args()
    model, feeds = zoo.build(a.model), zoo.inputs(a.model)
    builds = {"default": kiln.compile(model, num_threads=a.threads, cache=False),
              f"{a.off} off": kiln.compile(model, num_threads=a.threads, cache=False, **{a.off: False})}
    runs: dict[str, dict[str, list[float]]] = {}
    kernels: dict[str, dict[str, dict[str, list[float]]]] = {}
    end = time.time() + a.seconds
    while time.time() < end:
        for name, exe in builds.items():
            time.sleep(0.2)           # the other build's pool spins down
            state = host_state()      # (before the warm-up: then the workers sleep)
            for _ in range(3):
                exe.run(feeds)
            prof: dict[str, float] = {}
            times = []
            for _ in range(10):
                t = time.perf_counter()
                exe.run(feeds, profile=prof)
                times.append(time.perf_counter() - t)
            runs.setdefault(state, {}).setdefault(name, []).append(float(np.median(times)))
            for k, v in prof.items():
                kernels.setdefault(state, {}).setdefault(name, {}).setdefault(k, []).append(v / 10)
    names = [k for k in a.kernels.split(",") if k]
    print(f"| {a.model} | " + " | ".join(f"{st}: {n} ms (batches)" for st in sorted(runs) for n in builds) + " |")
    print("|---|" + "---:|" * (len(runs) * len(builds)))
    cells = [f"{np.median(runs[st][n]) * 1e3:.2f} ({len(runs[st][n])})" if n in runs[st] else "–"
             for st in sorted(runs) for n in builds]
    print("| whole model | " + " | ".join(cells) + " |")
    for k in names:
        cells = [f"{np.median(kernels[st][n][k]) * 1e3:.3f}" if k in kernels.get(st, {}).get(n, {}) else "–"
                 for st in sorted(runs) for n in builds]
        print(f"| {k} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
