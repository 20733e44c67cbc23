"""`kiln.tune.tune(model, budget_s=…)` and `kiln tune MODEL --budget-s N`: tune every distinct kernel of a model.

    1. lower the model to kernels (import, strategies, graph passes, fusion — as kiln.compile does) and group them
       by workload signature: ResNet's repeated blocks, and kernels already tuned for this target, once
    2. build and measure each workload's default schedule: its time × its count is its share of the model
    3. give each workload a slice of the budget by that share (at most `per_kernel_s`, none for a negligible
       share), largest first, re-dividing what is left after each; search it (tune/search.py)
    4. every measurement is in the database as it happens; each workload's best when its search ends
    5. the model built with this target's records and without, run interleaved: records that make it slower
       there go back to their defaults (tune/verify.py; `verify=False` skips it)

A progress bar (tqdm) shows the workloads done and, for the current one, its best GFLOP/s against the
default's. Ctrl-C stops the search: what was measured stays in the database, the current workload's best is
written if it clearly beat the default, and the report says the run was interrupted."""
from __future__ import annotations

import os
import random
import signal
import sys
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import onnx

from kiln.target import Target, host, resolve
from kiln.tune.database import TuningDatabase
from kiln.tune.measure import Measurer
from kiln.tune.search import POLICIES, SearchContext, WorkloadResult, WorkloadSearch
from kiln.tune.workload import Workload, definition, target_description, target_key, tunable, workloads_of

MIN_SHARE = 0.004     # workloads under this share of the model's time are not searched (their default stays)
MIN_SLICE_S = 4.0     # a searched workload gets at least this long
# the part of the budget kept for step 5 (the model built twice and timed: resnet50 ~20 s, bert_base ~30 s when a
# record has to go back), so that `--budget-s 900` ends within 15 minutes
VERIFY_RESERVE = 0.05


@dataclass
class TuneReport:
    model: str
    target: str
    threads: int
    db: str
    results: list[WorkloadResult] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)   # (sig, why)
    seconds: float = 0.0
    interrupted: bool = False
    workers: str = ""
    flops: dict[str, float] = field(default_factory=dict, repr=False)   # per signature
    counts: dict[str, int] = field(default_factory=dict, repr=False)    # kernels of the model per signature
    in_model: Any = None     # tune/verify.py: InModel, the model with and without its records

    def table(self) -> str:
        lines = ["| kernel class | sig | × | default ms | tuned ms | speedup | GFLOP/s default → tuned | trials | s |",
                 "|---|---|---:|---:|---:|---:|---|---:|---:|"]
        for r in self.results:
            if r.default_s is None:
                lines.append(f"| {r.klass} | {r.sig[:8]} | | failed | | | | {r.trials} | {r.seconds:.0f} |")
                continue
            best = r.best_s or r.default_s
            flops = self.flops.get(r.sig, 0.0)
            gflops = f"{flops / r.default_s / 1e9:.0f} → {flops / best / 1e9:.0f}" if flops else "—"  # no FMAs
            lines.append(f"| {r.klass} | {r.sig[:8]} | {self.counts.get(r.sig, 1)} | {r.default_s * 1e3:.4g} | "
                         f"{best * 1e3:.4g} | {r.default_s / best:.2f} | {gflops} | {r.trials} | {r.seconds:.0f} |")
        if self.in_model is not None:
            lines.append(self.in_model.line())
        return "\n".join(lines)



def kernels_of(model: onnx.ModelProto | str | bytes, target: Target, threads: int, options: dict[str, bool],
               strategy: str = "direct", input_shapes: dict[str, Sequence[int]] | None = None,
               precision: str = "fp32", dynamic_bounds: dict[str, tuple[int, int]] | None = None) -> list:
    """The unscheduled kernels kiln.compile would build (steps 1–3 of compiler.lower) — for a model with symbolic
    dims, its shape-generic kernels (max layouts, run-time extents), as one compilation serves every size."""
    from kiln.frontend.onnx import import_onnx
    from kiln.graph.passes import run_graph_passes
    from kiln.graph.passes.precision import assign_precision
    from kiln.kernel.build import build_program
    from kiln.kernel.compact import compact_trailing
    from kiln.kernel.dynamic import DynamicDims
    from kiln.strategy import assign_strategies

    if strategy not in ("direct", "ukernel"):
        raise ValueError(f"kiln tune builds strategy 'direct' (which searches the microkernel too) or 'ukernel', "
                         f"not {strategy!r}")
    graph = assign_precision(assign_strategies(import_onnx(model, input_shapes, dynamic_bounds), strategy), precision)
    graph = run_graph_passes(graph, options, target)
    prog = build_program(graph, options, DynamicDims.of(graph))
    if options.get("compact_rows", True):
        compact_trailing(prog)
    return prog.kernels


def _bar(total: int, enabled: bool) -> Any:
    if not enabled:
        return None
    from tqdm import tqdm
    return tqdm(total=total, unit="kernel", file=sys.stderr, dynamic_ncols=True, leave=True)


def tune(model: onnx.ModelProto | str | bytes | os.PathLike, budget_s: float = 900.0, db: str | None = None,
         per_kernel_s: float = 120.0, target: str | Target = "host", num_threads: int | None = None,
         strategy: str = "direct", ray_address: str | None = None, workers: str = "ray", progress: bool = True,
         seed: int = 0, retune: bool = False, input_shapes: dict[str, Sequence[int]] | None = None,
         measure_timeout_s: float = 30.0, max_trials: int | None = None, precision: str = "fp32",
         verify: bool = True, search: str = "evolutionary",
         dynamic_bounds: dict[str, tuple[int, int]] | None = None, **options: bool) -> TuneReport:
    """Tune a model's kernels for `target` (this machine, or a narrower x86 width of it) within `budget_s`
    seconds, recording into the tuning database `db` (default: $KILN_CACHE_DIR/tuning.db); `max_trials`: at most
    that many candidates per workload, whatever time is left (a trial budget, as MetaSchedule's). Returns a report;
    `kiln.compile(model)` then applies the best records (tuning="auto"). `precision="bf16"` tunes the kernels of
    `kiln.compile(model, precision="bf16")` (its anchors' vdpbf16ps / emulated tiles); a quantized (QDQ) model's
    integer anchors are tuned as they are. `search`: how each round proposes candidates, a name in
    `kiln.tune.search.POLICIES` (the others are there to be compared with the default:
    benchmarks/search_policies.py). A model with symbolic dims is tuned as it compiles — once, its shape-generic
    kernels each measured over a distribution of sizes within `dynamic_bounds` (tune/sizes.py) — unless
    `input_shapes` pins them."""
    from kiln.frontend.onnx import load_model
    from kiln.tune.distributed import make_pool

    t_start = time.perf_counter()
    if search not in POLICIES:
        raise ValueError(f"unknown search policy {search!r}; one of {', '.join(POLICIES)}")
    tgt = resolve(target)
    if tgt.triple != host().triple:
        raise ValueError(f"tuning measures on this machine; {tgt.name} is another ISA")
    from kiln.target import missing_features
    if missing_features(tgt):
        raise ValueError(f"this CPU cannot run {tgt.name} code ({', '.join(missing_features(tgt))} missing)")
    threads = int(num_threads) if num_threads else (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                                                    else os.cpu_count() or 1)
    opts = {k: bool(v) for k, v in options.items()}
    proto = load_model(model)
    kernels = kernels_of(proto, tgt, threads, opts, strategy, input_shapes, precision, dynamic_bounds)
    tkey = target_key(tgt, threads)
    database = TuningDatabase(db)
    report = TuneReport(proto.graph.name or "model", tgt.name, threads, database.path)
    database.add_target(tkey, target_description(tgt, threads))
    work: list[Workload] = []
    for w in workloads_of(kernels):
        report.flops[w.sig], report.counts[w.sig] = w.flops, w.count
        if not tunable(w.kernel):
            report.skipped.append((w.sig, "non-float arguments"))
            continue
        if not retune and database.best(w.sig, tkey) is not None:
            report.skipped.append((w.sig, "already tuned for this target"))
            continue
        database.add_workload(w.sig, w.klass, definition(w.kernel), w.flops)
        work.append(w)
    run = uuid.uuid4().hex[:12]
    measurer = Measurer(timeout_s=measure_timeout_s)
    pool = make_pool(workers, ray_address)
    report.workers = pool.name if not ray_address else f"ray@{ray_address}"
    bar = _bar(len(work), progress)
    ctx = SearchContext(tgt, threads, opts, database, tkey, measurer, pool, run, random.Random(seed),
                        max_trials=max_trials, policy=search)
    ctx.training = _training_data(database, tkey)

    def on_measure(w: Workload, default_s: float, best_s: float) -> None:
        if bar is not None:
            speed = (f"{w.flops / default_s / 1e9:.0f} → {w.flops / best_s / 1e9:.0f} GFLOP/s" if w.flops
                     else f"{default_s * 1e3:.3g} → {best_s * 1e3:.3g} ms")
            bar.set_postfix_str(f"{w.klass} ×{w.count}: {speed}")
    ctx.on_measure = on_measure
    current: WorkloadSearch | None = None
    search_s = budget_s * (1 - VERIFY_RESERVE) if verify else budget_s
    restore_sigint = _flag_ctrl_c(ctx)
    try:
        searches = [WorkloadSearch(w, ctx) for w in work]
        shares = _default_shares(searches)
        waiting = sum(shares.values())
        for s in sorted(searches, key=lambda s: -shares[s.w.sig]):
            current = s
            left = search_s - (time.perf_counter() - t_start)
            share = shares[s.w.sig]
            slice_s = min(per_kernel_s, left * share / waiting) if waiting > 0 and left > 0 else 0.0
            waiting -= share
            if share < MIN_SHARE or left <= 0:
                s.result.note = "negligible share: default kept" if left > 0 else "out of time: default kept"
                report.results.append(s.result)
            else:
                report.results.append(s.run(max(slice_s, min(MIN_SLICE_S, left))))
            current = None
            if bar is not None:
                bar.update(1)
    except KeyboardInterrupt:
        report.interrupted = True
        if current is not None:
            report.results.append(current.result)
    finally:
        if bar is not None:
            bar.close()
        measurer.close()
        pool.close()
        try:
            if verify and not report.interrupted and sys.exc_info()[0] is None:   # 5. (on a quiet machine)
                from kiln.tune.verify import model_builder, verify_in_model
                build = model_builder(proto, target=tgt, num_threads=threads, input_shapes=input_shapes,
                                      strategy=strategy, precision=precision, dynamic_bounds=dynamic_bounds, **opts)
                report.in_model = verify_in_model(build, database, tkey, run, deadline=t_start + budget_s)
        except KeyboardInterrupt:
            report.interrupted = True
        finally:
            restore_sigint()
            database.close()
        report.seconds = time.perf_counter() - t_start
    return report


def _flag_ctrl_c(ctx: SearchContext) -> Callable[[], None]:
    """While tuning, Ctrl-C also sets `ctx.interrupted`, which the search checks before each measurement: the
    KeyboardInterrupt alone is lost when it lands in a finalizer or an import's lock callback (the cost model's
    first fit imports XGBoost mid-search), and the run then went on to the end of its budget. Only in the main
    thread, only over Python's own handler; returns the function that puts that back."""
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        return lambda: None

    def on_sigint(signum: int, frame: object) -> None:
        ctx.interrupted = True
        raise KeyboardInterrupt
    signal.signal(signal.SIGINT, on_sigint)
    return lambda: signal.signal(signal.SIGINT, signal.default_int_handler)


def _default_shares(searches: list[WorkloadSearch]) -> dict[str, float]:
    """Every workload's default, built in one parallel batch and measured: its share = time × count / total."""
    if not searches:
        return {}
    c = searches[0].ctx
    built = c.pool.build_jobs([(s.w.sig, s.w.kernel, s.space.default) for s in searches], c.target, c.threads,
                              c.options)
    by_sig: dict[str, float] = {}
    for s, b in zip(searches, built):
        s.result.default_s = s.measure(b, is_default=True)
        by_sig[s.w.sig] = (s.result.default_s or 0.0) * s.w.count
    total = sum(by_sig.values()) or 1.0
    c.model_s = total
    return {k: v / total for k, v in by_sig.items()}


def _training_data(db: TuningDatabase, tkey: str) -> dict[str, list[tuple[list[list[float]], list[float]]]]:
    """Earlier runs' measurements on this target, grouped by kernel class and workload (the cost model's warm
    start)."""
    groups: dict[tuple[str, str], tuple[list, list]] = {}
    classes = {sig: klass for sig, klass, _ in db.workloads()}
    for m in db.measurements(tkey=tkey, status="ok"):
        if m.features is None or m.seconds is None:
            continue
        g = groups.setdefault((classes.get(m.sig, "?"), m.sig), ([], []))
        g[0].append(m.features)
        g[1].append(m.seconds)
    out: dict[str, list] = {}
    for (klass, _), g in groups.items():
        out.setdefault(klass, []).append(g)
    return out
