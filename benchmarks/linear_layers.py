"""BERT-base's linear layers alone: Kiln's packed GEMM (+ bias) against MKL's packed linear (what inductor's freezing
calls: torch.ops.mkl._mkl_linear) and torch's F.linear (oneDNN), at M = batch·seq, hot and cold.

    python benchmarks/linear_layers.py [--m 128] [--threads 2] [--rounds 15] [--kiln default prefetch=0 ...]

"cold" evicts the caches (a 512 MiB write) before the timed call: inside the 340 MB model every layer's weights
arrive from memory, as here; "hot" repeats the call. Each `--kiln` variant overrides knob defaults of the schedule
(kiln/schedule/config.py; "default" = none), e.g. `prefetch=0` (no panel prefetch), `pack=0`, `mr=8`. Interleaved
rounds, medians; run it under `flock /tmp/kiln-measure.lock` on a shared machine."""
from __future__ import annotations

import argparse
import contextlib
import time
from collections.abc import Iterator

import numpy as np

SHAPES = ((768, 768), (768, 3072), (3072, 768))  # (K, N): Q/K/V/O, FFN up, FFN down


@contextlib.contextmanager
def knob_defaults(overrides: dict[str, str]) -> Iterator[None]:
    """Schedules built inside take these knob values as their defaults (a tuning record without the database)."""
    from kiln.schedule import config
    real = config.Decisions.knob

    def knob(self: config.Decisions, name: str, default: config.Value, domain: object) -> config.Value:
        if name in overrides:
            v = overrides[name]
            default = (v == "1") if isinstance(default, bool) else type(default)(v)
        return real(self, name, default, domain)  # type: ignore[arg-type]
    config.Decisions.knob = knob  # type: ignore[method-assign]
    try:
        yield
    finally:
        config.Decisions.knob = real  # type: ignore[method-assign]


def linear_model(m: int, k: int, n: int):  # noqa: ANN201
    from kiln.zoo.builder import GraphBuilder
    b = GraphBuilder(0)
    x = b.input("x", (1, m, k))
    w, bias = b.normal("w", (k, n), 0.02), b.normal("b", (n,), 0.02)
    b.op("Add", "add", [b.op("MatMul", "mm", [x, w]), bias], out="y")
    b.output("y", (1, m, n))
    return b.model("linear"), b.value("w"), b.value("b")


def systems(m: int, k: int, n: int, threads: int, variants: list[str]) -> dict:  # noqa: ANN201
    """name → a call running one (M, K, N) linear layer, each checked against torch first."""
    import torch

    import kiln
    model, w, bias = linear_model(m, k, n)
    x = np.random.default_rng(1).standard_normal((1, m, k), dtype=np.float32)
    xt, wt, bt = torch.from_numpy(x).reshape(m, k), torch.from_numpy(np.ascontiguousarray(w.T)), torch.from_numpy(bias)
    want = torch.nn.functional.linear(xt, wt, bt).numpy().reshape(1, m, n)
    calls = {}
    for v in variants:
        over = dict(p.split("=") for p in v.split(";") if "=" in p)
        with knob_defaults(over):
            exe = kiln.compile(model, num_threads=threads, cache=False)
        got = exe.run({"x": x})[0]
        assert np.abs(got - want).max() <= 1e-4 * np.abs(want).max(), f"kiln {v}: wrong result"
        calls[f"kiln {v}"] = lambda e=exe: e.run({"x": x})
    try:
        mkl_w = torch.ops.mkl._mkl_reorder_linear_weight(wt, m)
        calls["mkl packed linear"] = lambda: torch.ops.mkl._mkl_linear(xt, mkl_w, wt, bt, m)
    except (AttributeError, RuntimeError) as e:
        print(f"  (MKL packed linear unavailable: {e})")
    calls["torch F.linear"] = lambda: torch.nn.functional.linear(xt, wt, bt)
    return calls


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--m", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--kiln", nargs="+", default=["default"], help="knob overrides per variant: default, prefetch=0")
    args = ap.parse_args()
    import torch
    torch.set_num_threads(args.threads)
    junk = np.ones(128 << 20, np.float32)
    print(f"M={args.m}, {args.threads} threads, median ms (GFLOP/s); cold = caches evicted before the call")
    for k, n in SHAPES:
        calls = systems(args.m, k, n, args.threads, args.kiln)
        hot: dict[str, list[float]] = {c: [] for c in calls}
        cold: dict[str, list[float]] = {c: [] for c in calls}
        with torch.no_grad():
            for _ in range(args.rounds):
                for name, f in calls.items():
                    f()
                    f()
                    t = time.perf_counter()
                    f()
                    hot[name].append(time.perf_counter() - t)
                    junk += 1.0
                    t = time.perf_counter()
                    f()
                    cold[name].append(time.perf_counter() - t)
        gf = 2.0 * args.m * k * n / 1e9
        print(f"K={k} N={n}:")
        for name in calls:
            h, c = float(np.median(hot[name])), float(np.median(cold[name]))
            print(f"  {name:28s} hot {h * 1e3:7.3f} ({gf / h:4.0f})   cold {c * 1e3:7.3f} ({gf / c:4.0f})")


if __name__ == "__main__":
    main()
