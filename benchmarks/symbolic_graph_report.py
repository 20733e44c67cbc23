"""The graph half of dynamic shapes, timed: ONNX import + every graph pass for each zoo model with symbolic dims,
once symbolic (one graph for every size) beside the same model pinned to one static size (what a per-shape
recompile pays each time). Median of REPEATS, one process; the step before kernel lowering.

    python benchmarks/symbolic_graph_report.py [MODEL ...]      # default: kiln.zoo.dynamic_names()"""
from __future__ import annotations

import argparse
import statistics
import time

from kiln import zoo
from kiln.frontend.onnx import import_onnx
from kiln.graph.passes import run_graph_passes
from kiln.target import host

REPEATS = 3
PINS = {"batch": 1, "seq": 128}  # the static twin's size


def graph_time(model, **kw: object) -> tuple[float, int]:  # noqa: ANN001
    times, nodes = [], 0
    for _ in range(REPEATS):
        t = time.perf_counter()
        g = run_graph_passes(import_onnx(model, **kw), {}, host())
        times.append(time.perf_counter() - t)
        nodes = len(g.nodes)
    return statistics.median(times), nodes


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("models", nargs="*", default=zoo.dynamic_names())
    args = p.parse_args()
    print("| model | symbols (bounds) | symbolic import + passes, s | static (batch 1, seq 128), s | ratio | nodes |")
    print("|---|---|---|---|---|---|")
    for name in args.models:
        model = zoo.build(name)
        dims = {i.name: [d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim] for i in model.graph.input}
        pins = {k: tuple(PINS[d] if isinstance(d, str) else d for d in v) for k, v in dims.items()}
        dyn_s, dyn_n = graph_time(model)
        static_s, static_n = graph_time(model, input_shapes=pins)
        bounds = import_onnx(model).bounds
        print(f"| {name} | {bounds} | {dyn_s:.3f} | {static_s:.3f} | {dyn_s / static_s:.2f} | {dyn_n} / {static_n} |")


if __name__ == "__main__":
    main()
