"""strategy="auto": for each anchor node, the fastest way to build it, measured on the target at compile time.

For every MatMul/Conv marked "auto", the node alone (same input types, same constant weights) is compiled with
each available strategy — direct, ukernel (if the target has a microkernel), each installed library — and
timed in this process with the compile's thread count (warm-up, then the median of several runs). The winner
is written into the node's attrs; decisions are cached on disk next to the compile cache, keyed by the node's
signature (op, shapes, attributes, a hash of the weights' shapes), the target, the threads, the options and
the compiler's fingerprint, so identical layers (ResNet repeats most of its convs) are measured once and a
recompile measures nothing.

What it measures is the anchor with no epilogue: the epilogue costs differ between strategies (in registers
for direct, on the hot tile for ukernel, a separate pass for library), so "auto" slightly favours library on
layers with heavy epilogues. Only the host can be measured: for another target "auto" is an error. A node with
symbolic dims (`dynamic_bounds=`) is measured at its upper bounds — the size its buffers are laid out for; its
decision is keyed by the symbolic shapes and those bounds."""
from __future__ import annotations

import hashlib
import json
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from kiln.cachedir import atomic_path, cache_dir, compiler_fingerprint
from kiln.graph.ir import Graph, Node, TensorType, Value
from kiln.graph.ops import infer
from kiln.graph.symbolic import Bounds, upper
from kiln.strategy import LIBRARIES, strategy_of
from kiln.target import Target, host

RUNS = 7            # timed runs per candidate (after 2 warm-up runs)
MIN_SECONDS = 0.02  # …or more, until this much time has been spent

# compiles a graph for the target, threads and options of the compile that asked, and loads it (an Executable);
# handed in by kiln.compiler, which sits above this module
Build = Callable[[Graph], Any]


def candidates(target: Target) -> list[str]:
    """The strategies that can be built here: direct always; ukernel with a microkernel for the target;
    each library that loads."""
    out = ["direct"]
    try:
        from kiln.ukernels import ukernel_for
        if ukernel_for(target) is not None:
            out.append("ukernel")
    except ImportError:
        pass
    try:
        from kiln.library import available
        out += [f"library:{lib}" for lib in LIBRARIES if available(lib)[0]]
    except ImportError:
        pass
    return out


def signature(n: Node, bounds: Bounds | None = None) -> str:
    attrs = {k: repr(v) for k, v in sorted(n.attrs.items()) if k != "strategy"}
    ins = [(v.dtype, [str(d) for d in v.shape], v.const is not None) for v in n.inputs]
    return json.dumps([n.op, ins, attrs, sorted((bounds or {}).items())])


def single_node_graph(n: Node, strategy: str, bounds: Bounds | None = None) -> Graph:
    """The node alone: its variable inputs become graph inputs (symbolic dims at their upper bounds); constants stay
    constants."""
    inputs, args = [], []
    for i, v in enumerate(n.inputs):
        if v.const is not None:
            args.append(v)
        else:
            x = Value(f"in{i}", TensorType(v.dtype, tuple(upper(d, bounds) for d in v.shape)))
            inputs.append(x)
            args.append(x)
    node = Node(n.op, args, [], {**n.attrs, "strategy": strategy}, n.name)
    types = infer(n.op, [v.type for v in args], node.attrs, n.name)
    node.outputs = [Value(f"out{i}", t, producer=node) for i, t in enumerate(types)]
    return Graph(inputs, list(node.outputs), [node], name=f"auto_{n.op}", output_names=[v.name for v in node.outputs])


def time_strategy(n: Node, strategy: str, build: Build, bounds: Bounds | None = None) -> tuple[float, str]:
    """Median seconds of one run of the node built with `strategy`, and how it was actually built (a strategy
    that does not apply falls back to direct)."""
    exe = build(single_node_graph(n, strategy, bounds))
    rng = np.random.default_rng(0)
    feeds = {s.name: rng.standard_normal(s.shape).astype(s.dtype) for s in exe.inputs}
    for _ in range(2):
        exe.run(feeds)
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < RUNS or time.perf_counter() - start < MIN_SECONDS:
        t = time.perf_counter()
        exe.run(feeds)
        times.append(time.perf_counter() - t)
        if len(times) >= 50:
            break
    built = exe.meta["strategies"].get(n.name, "direct")
    return statistics.median(times), built


def _decisions_path(key: str) -> str:
    d = os.path.join(cache_dir(), "auto")
    os.makedirs(d, exist_ok=True)
    return os.path.join(d, key + ".json")


def choose(n: Node, target: Target, threads: int, options: dict[str, bool], build: Build,
           bounds: Bounds | None = None) -> dict:
    """{"best": strategy, "times": {strategy: seconds}} for one node, from the cache or measured (each candidate
    compiled by `build`)."""
    key = hashlib.sha256(json.dumps([signature(n, bounds), target.key, threads, sorted(options.items()),
                                     compiler_fingerprint()]).encode()).hexdigest()[:32]
    path = _decisions_path(key)
    if os.path.exists(path):
        try:
            with open(path) as f:
                return json.load(f)
        except (OSError, json.JSONDecodeError):
            pass
    times: dict[str, float] = {}
    for s in candidates(target):
        sec, built = time_strategy(n, s, build, bounds)
        if built == s:  # a fallback would only re-measure direct
            times[s] = sec
    decision = {"best": min(times, key=times.__getitem__), "times": times}
    with atomic_path(path) as tmp, open(tmp, "w") as f:
        json.dump(decision, f)
    return decision


def choose_strategies(g: Graph, target: Target, threads: int, options: dict[str, bool], build: Build) -> Graph:
    if target.triple != host().triple:
        raise ValueError(f"strategy='auto' measures on the machine it compiles on; target {target.name} is not "
                         "this host — pick a strategy explicitly")
    for n in g.nodes:
        if strategy_of(n.attrs) == "auto":
            n.attrs["strategy"] = choose(n, target, threads, options, build, g.bounds)["best"]
    return g
