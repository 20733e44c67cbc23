"""`kiln compile / run / explain / bench / tune / zoo` — the command line."""
from __future__ import annotations

import argparse
import sys
import time

import numpy as np


def _model(spec: str, args: argparse.Namespace | None = None):  # noqa: ANN202 - returns onnx.ModelProto
    """`zoo:NAME` builds a built-in model; anything else is a path to an .onnx file. With `--quantize int8`, the
    model kiln.quantize makes of it with the `--calibrate` samples."""
    from kiln.frontend.onnx import load_model

    if spec.startswith("zoo:"):
        from kiln import zoo
        model = zoo.build(spec[4:])
    else:
        model = load_model(spec)
    if args is None or not getattr(args, "quantize", None):
        return model
    import kiln
    return kiln.quantize(model, calibration_samples(getattr(args, "calibrate", None)), method=args.calib_method)


def calibration_samples(path: str | None) -> list[dict[str, np.ndarray]]:
    """Feeds from an .npz whose arrays are named after the model's inputs, each [N, *input shape]: N samples."""
    if not path:
        raise ValueError("--quantize int8 needs calibration data: --calibrate DATA.npz (arrays named after the "
                         "model's inputs, each with a leading sample axis)")
    try:
        data = dict(np.load(path))
    except (OSError, ValueError) as e:
        raise ValueError(f"--calibrate {path}: not a readable .npz file ({e})") from e
    counts = {k: len(v) for k, v in data.items() if v.ndim >= 1}
    if not counts or len(set(counts.values())) != 1 or len(counts) != len(data):
        raise ValueError(f"--calibrate {path}: every array needs the same leading sample axis, got "
                         f"{ {k: v.shape for k, v in data.items()} }")
    return [{k: v[i] for k, v in data.items()} for i in range(next(iter(counts.values())))]


def _feeds(exe, spec: str, inputs: list[str] | None, dims: str | None = None) -> dict[str, np.ndarray]:  # noqa: ANN001
    """Random seeded inputs, or .npy files `--input x.npy` / `name=x.npy`; symbolic dims sized by `--dims`."""
    from kiln.runtime.shapes import random_feeds
    feeds: dict[str, np.ndarray] = {}
    for i, item in enumerate(inputs or []):
        name, _, path = item.rpartition("=")
        feeds[name or exe.input_names[i]] = np.load(path)
    missing = [s for s in exe.inputs if s.name not in feeds]
    return {**feeds, **random_feeds(missing, np.random.default_rng(1), _dim_values(exe, dims))}


def _dim_values(exe, dims: str | None) -> dict[str, int]:  # noqa: ANN001
    """Sizes for a dynamic executable's symbolic dims: `--dims seq=77,batch=2`, else each at min(8, its upper
    bound)."""
    dyn = getattr(exe, "meta", {}).get("dynamic") or {}
    values = {name: min(8, hi) for name, (_, hi) in dyn.get("bounds", {}).items()}
    for item in filter(None, (dims or "").split(",")):
        name, sep, v = item.partition("=")
        if not sep or name not in values:
            raise ValueError(f"--dims wants NAME=SIZE for the symbolic dims {sorted(values)}, got {item!r}")
        values[name] = int(v)
    return values


def parse_bounds(text: str | None) -> dict[str, tuple[int, int]] | None:
    """`--bounds batch=1:4,seq=1:512` → {"batch": (1, 4), "seq": (1, 512)} (a symbolic model's dynamic_bounds)."""
    if not text:
        return None
    out = {}
    for item in text.split(","):
        name, sep, rng = item.partition("=")
        lo, colon, hi = rng.partition(":")
        if not sep or not colon or not lo.strip().isdigit() or not hi.strip().isdigit():
            raise ValueError(f"--bounds wants NAME=LO:HI for each symbolic dim, got {item!r}")
        out[name.strip()] = (int(lo), int(hi))
    return out


def _options(args: argparse.Namespace) -> dict:
    """Compile keywords from the common flags: pass switches, the strategy and per-node overrides."""
    opts: dict = {name: False for name in (args.disable or [])}
    if getattr(args, "strategy", None):
        opts["strategy"] = args.strategy
    overrides = {}
    for item in getattr(args, "strategy_for", None) or []:
        key, sep, val = item.partition("=")
        if not sep:
            raise ValueError(f"--strategy-for wants NODE_OR_OP=STRATEGY, got {item!r}")
        overrides[key] = val
    if overrides:
        opts["strategies"] = overrides
    if getattr(args, "bounds_check", False):
        opts["bounds_check"] = True
    if getattr(args, "tuning", None):
        opts["tuning"] = args.tuning
    if getattr(args, "precision", "fp32") != "fp32":
        opts["precision"] = args.precision
    if getattr(args, "bounds", None):
        opts["dynamic_bounds"] = parse_bounds(args.bounds)
    return opts


def _cross_target(args: argparse.Namespace):  # noqa: ANN202 - kiln.target.Target | None
    """The --target/--cpu target when it is another ISA (built with kiln/cross), else None (the host)."""
    if not getattr(args, "target", None) and not getattr(args, "cpu", None):
        return None
    from kiln.target import host, resolve, runs_here

    t = resolve(args.target or "host", cpu=args.cpu)
    if t.triple != host().triple and getattr(args, "bounds_check", False):
        raise ValueError(f"--bounds-check builds run on the host only, not on {args.target or args.cpu}")
    # another ISA, or an x86 width this CPU cannot execute (AVX-512 on an AVX2 host): objects only
    return None if t.triple == host().triple and runs_here(t) else t


def _host_triple() -> str:
    from kiln.target import host
    return host().triple


def cmd_compile(args: argparse.Namespace) -> int:
    import kiln

    cross = _cross_target(args)
    if cross is not None:
        from kiln.cross.cli import compile_cross
        return compile_cross(args, _model(args.model, args), cross, {name: False for name in (args.disable or [])},
                             precision=args.precision)
    t = time.perf_counter()
    exe = kiln.compile(_model(args.model, args), target=args.target or "host", num_threads=args.threads,
                       cache=not args.no_cache, **_options(args))
    exe.save(args.output)
    print(f"compiled {args.model} in {time.perf_counter() - t:.2f} s → {args.output} "
          f"({len(exe.kernel_names)} kernels, arena {exe.meta['arena_bytes'] / 2**20:.1f} MiB)")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    import kiln

    cross = _cross_target(args)
    if cross is not None and cross.triple == _host_triple():
        from kiln.target import missing_features
        print(f"target {cross.name} needs {', '.join(missing_features(cross))}, which this CPU lacks: "
              f"`kiln compile {args.model} --target {cross.name} -o FILE.o` emits its object", file=sys.stderr)
        return 2
    if cross is not None:
        from kiln.cross.cli import run_cross
        return run_cross(args, _model(args.model, args), cross, {name: False for name in (args.disable or [])},
                         lambda binary: _feeds(binary, args.model, args.input), precision=args.precision)
    t = time.perf_counter()
    if args.model.endswith(".kiln"):
        exe, proto = kiln.load(args.model, num_threads=args.threads), None
    else:
        proto = _model(args.model, args)
        exe = kiln.compile(proto, target=args.target or "host", num_threads=args.threads, cache=not args.no_cache,
                           **_options(args))
    compile_s = time.perf_counter() - t
    feeds = _feeds(exe, args.model, args.input, getattr(args, 'dims', None))
    outs = exe.run(feeds)
    times = []
    for _ in range(args.repeat):
        t = time.perf_counter()
        exe.run(feeds)
        times.append(time.perf_counter() - t)
    print(f"{args.model}: compile/load {compile_s:.2f} s, run median {np.median(times) * 1e3:.3f} ms "
          f"over {args.repeat} runs ({exe.num_threads} threads)")
    for name, o in zip(exe.output_names, outs):
        print(f"  {name}: {o.dtype}{list(o.shape)}  mean {o.mean():.6g}  std {o.std():.6g}")
    if args.output:
        np.save(args.output, outs[0])
    status = 0
    if args.check:
        if proto is None:
            print("--check needs the ONNX model, not a .kiln file", file=sys.stderr)
            return 2
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.intra_op_num_threads = exe.num_threads
        ref = ort.InferenceSession(proto.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, feeds)
        from kiln.checking import check_outputs

        status |= check_outputs(exe.output_names, outs, ref, args.rtol)
    if args.profile:
        prof: dict[str, float] = {}
        for _ in range(args.repeat):
            exe.run(feeds, profile=prof)
        total = sum(prof.values())
        flops = dict(zip(exe.kernel_names, exe.meta.get("flops", [])))
        print(f"  profile ({args.repeat} runs, per run): total {total / args.repeat * 1e3:.3f} ms")
        for name, sec in sorted(prof.items(), key=lambda kv: -kv[1])[:args.top]:
            per = sec / args.repeat
            gf = flops.get(name, 0) / per / 1e9 if per > 0 else 0
            rate = f"  {gf:7.1f} GFLOP/s" if gf else ""
            print(f"    {name:32s} {per * 1e3:9.3f} ms  {100 * sec / total:5.1f}%{rate}")
    return status


def cmd_explain(args: argparse.Namespace) -> int:
    from kiln.explain import explain

    opts = _options(args)
    if opts.get("strategy") == "all":  # one node built every available way, side by side
        from kiln.explain import compare_strategies
        opts.pop("strategy")
        opts.pop("strategies", None)
        print(compare_strategies(_model(args.model, args), args.node, num_threads=args.threads, **opts))
        return 0
    print(explain(_model(args.model, args), node=args.node, stages=args.stage, num_threads=args.threads, **opts))
    return 0


def cmd_tune(args: argparse.Namespace) -> int:
    """`kiln tune MODEL --budget-s N`, or `kiln tune --report` (the cost model's quality on the database)."""
    from kiln.tune.database import TuningDatabase

    if args.report:
        from kiln.target import resolve
        from kiln.tune.report import model_quality, quality_table
        from kiln.tune.workload import target_key

        with TuningDatabase(args.db, create=False) as db:
            keys = db.tkeys() if args.all_targets else [target_key(resolve(args.target or "host"),
                                                                   args.threads or _default_threads())]
            for tkey in keys:
                print(f"target {tkey}\n{quality_table(model_quality(db, tkey))}\n")
        return 0
    if not args.model:
        print("kiln tune: a MODEL is required (or --report)", file=sys.stderr)
        return 2
    from kiln.tune import tune

    opts = {name: False for name in (args.disable or [])}
    try:
        report = tune(_model(args.model), budget_s=args.budget_s, db=args.db, per_kernel_s=args.per_kernel_s,
                      target=args.target or "host", num_threads=args.threads, strategy=args.strategy or "direct",
                      ray_address=args.ray_address, workers=args.workers, progress=not args.quiet, seed=args.seed,
                      retune=args.retune, max_trials=args.max_trials, precision=args.precision,
                      verify=not args.no_verify, search=args.search, dynamic_bounds=parse_bounds(args.bounds),
                      **opts)
    except KeyboardInterrupt:  # Ctrl-C during tune()'s own clean-up (closing the pools): every row is committed
        print("kiln tune: interrupted; the measurements made so far are in the database", file=sys.stderr)
        return 130
    print(f"tuned {args.model} for {report.target} on {report.threads} threads in {report.seconds:.0f} s "
          f"(compiles: {report.workers}) → {report.db}" + ("  [interrupted]" if report.interrupted else ""))
    print(report.table())
    for sig, why in report.skipped:
        print(f"  skipped {sig[:8]}: {why}")
    return 130 if report.interrupted else 0


def _default_threads() -> int:
    from kiln.compiler import default_threads
    return default_threads()


def cmd_zoo(args: argparse.Namespace) -> int:
    from kiln import zoo

    for name in zoo.names():
        print(name)
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="kiln", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)

    def common(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("model", help="path to an .onnx file, or zoo:NAME (see `kiln zoo`)")
        sp.add_argument("--threads", type=int, default=None, help="threads (default: all cores)")
        sp.add_argument("--disable", action="append", metavar="OPTION",
                        help="switch a pass/schedule option off (repeatable); see kiln.PASS_OPTIONS")
        sp.add_argument("--no-cache", action="store_true", help="do not use the on-disk compile cache")
        sp.add_argument("--strategy", default=None, metavar="S",
                        help="how MatMul/Conv are built: direct (default), ukernel, library[:mkl|openblas|onednn], "
                             "auto; `explain --strategy all` compares them for one node")
        sp.add_argument("--precision", default="fp32", choices=["fp32", "bf16"],
                        help="bf16: MatMul/Conv multiply bfloat16 operands, accumulate float32 (AMX tiles, "
                             "AVX512_BF16 vdpbf16ps or Arm BF16 where the CPU has them; without any, float32 — "
                             "emulated with --disable native_bf16_only); exe.meta['precision'] says how each "
                             "anchor ran; int8 is --quantize int8")
        sp.add_argument("--strategy-for", action="append", metavar="NODE=S",
                        help="per node name or op type override, e.g. Conv=ukernel (repeatable)")
        sp.add_argument("--quantize", choices=["int8"],
                        help="quantize first (kiln.quantize: QDQ, per-channel int8 weights), then compile")
        sp.add_argument("--calibrate", metavar="DATA.npz",
                        help="calibration samples for --quantize: arrays named after the inputs, [N, *shape] each")
        sp.add_argument("--calib-method", default="minmax", choices=["minmax", "percentile", "entropy"],
                        help="how --quantize chooses activation ranges (default minmax)")

    c = sub.add_parser("compile", help="compile a model to a .kiln file")
    common(c)
    c.add_argument("-o", "--output", required=True, help="FILE.kiln, or FILE.o (and FILE.s) for --target")
    c.add_argument("--target", help="host (default), avx512, avx2, or a cross target: aarch64-neon, aarch64-sve, "
                                    "aarch64-sve2, aarch64-sme, riscv64-rvv (NAME:CPU picks the CPU)")
    c.add_argument("--cpu", help="CPU of a cross target, e.g. neoverse-v1, sifive-x280")
    c.add_argument("--bounds-check", action="store_true",
                   help="debug build: check every memory access; a run that goes out of bounds fails with BoundsError")
    c.add_argument("--bounds", help="a symbolic model's bounds: NAME=LO:HI,... (default 1:512 each)")
    c.add_argument("--tuning", metavar="auto|off|DB", help="apply tuned schedules: auto (default: the cache "
                   "directory's tuning.db), off, or a tuning database file")
    c.set_defaults(fn=cmd_compile)

    r = sub.add_parser("run", help="compile (or load a .kiln) and run on random or given inputs")
    common(r)
    r.add_argument("--input", action="append", help="x.npy or name=x.npy (repeatable)")
    r.add_argument("--dims", help="sizes of a dynamic model's symbolic dims for the random inputs: seq=77,batch=2")
    r.add_argument("--output", help="save the first output as .npy")
    r.add_argument("--check", action="store_true", help="compare with onnxruntime")
    r.add_argument("--target", help="a cross target (aarch64-sve, riscv64-rvv, ...): build it and run it under qemu")
    r.add_argument("--cpu", help="CPU of the cross target")
    r.add_argument("--vlen", action="append", metavar="BITS",
                   help="vector lengths to run a cross target at, e.g. 128,512 (default: min, 2×, 4×)")
    r.add_argument("--rtol", type=float, default=1e-3, help="--check tolerance: max abs err / max |ref|")
    r.add_argument("--repeat", type=int, default=10)
    r.add_argument("--profile", action="store_true", help="per-kernel time")
    r.add_argument("--top", type=int, default=25, help="kernels shown by --profile")
    r.add_argument("--bounds-check", action="store_true",
                   help="debug build: check every memory access; a run that goes out of bounds fails with BoundsError")
    r.add_argument("--bounds", help="a symbolic model's bounds: NAME=LO:HI,... (default 1:512 each)")
    r.add_argument("--tuning", metavar="auto|off|DB", help="apply tuned schedules: auto (default), off, or a "
                   "tuning database file")
    r.set_defaults(fn=cmd_run)

    e = sub.add_parser("explain", help="print the IR at every stage (graph, kernels, LLVM) for one node")
    common(e)
    e.add_argument("--node", help="node name (or op type) whose kernel and LLVM IR to show; default: the first")
    e.add_argument("--stage", action="append", choices=["graph", "kernel", "llvm", "asm"],
                   help="stages to print (repeatable; default: all)")
    e.set_defaults(fn=cmd_explain)

    t = sub.add_parser("tune", help="search the schedules of a model's kernels on this machine (tuning database)")
    t.add_argument("model", nargs="?", help="path to an .onnx file, or zoo:NAME")
    t.add_argument("--budget-s", type=float, default=900.0, help="seconds for the whole model (default 900)")
    t.add_argument("--per-kernel-s", type=float, default=120.0, help="at most this long per distinct kernel")
    t.add_argument("--db", help="tuning database (default: tuning.db in $KILN_CACHE_DIR or ~/.cache/kiln)")
    t.add_argument("--ray-address", help="join this Ray cluster (HOST:PORT) to compile candidates; default: a "
                   "local Ray instance on 127.0.0.1")
    t.add_argument("--workers", choices=["ray", "local"], default="ray",
                   help="where candidates compile: Ray (default) or this process")
    t.add_argument("--target", help="host (default) or a narrower x86 width of it (avx2, sse): tuned separately")
    t.add_argument("--threads", type=int, default=None, help="threads (default: all cores)")
    t.add_argument("--strategy", choices=["direct", "ukernel"], help="the model's strategy (direct searches the "
                   "microkernel too)")
    t.add_argument("--disable", action="append", metavar="OPTION", help="compile option off (as kiln compile)")
    t.add_argument("--bounds", help="a symbolic model's bounds, as kiln compile --bounds: its shape-generic "
                   "kernels are tuned once, over sizes drawn from them")
    t.add_argument("--retune", action="store_true", help="search kernels that already have a record again")
    t.add_argument("--precision", choices=["fp32", "bf16"], default="fp32",
                   help="tune the kernels of `kiln compile --precision bf16` (a QDQ model's int8 anchors are tuned "
                   "as they are)")
    t.add_argument("--max-trials", type=int, metavar="N", help="at most N candidates per distinct kernel (a trial "
                   "budget, as MetaSchedule's), within the time budget")
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--search", default="evolutionary", metavar="POLICY",
                   help="how each round proposes candidates: evolutionary (default), random, model-random, local "
                        "(benchmarks/search_policies.py compares them)")
    t.add_argument("--no-verify", action="store_true", help="skip step 5: the model built with and without its "
                   "records, records that make it slower put back to their defaults")
    t.add_argument("--quiet", action="store_true", help="no progress bar")
    t.add_argument("--report", action="store_true",
                   help="no tuning: the cost model's rank correlation on held-out candidates, per kernel class")
    t.add_argument("--all-targets", action="store_true", help="--report for every target in the database")
    t.set_defaults(fn=cmd_tune)

    z = sub.add_parser("zoo", help="list the built-in models")
    z.set_defaults(fn=cmd_zoo)

    try:
        from kiln.bench import cli as bench_cli
    except ImportError:
        bench_cli = None
    if bench_cli is not None:
        b = sub.add_parser("bench", help="benchmark Kiln against other systems")
        bench_cli.add_arguments(b)
        b.set_defaults(fn=bench_cli.run)

    args = p.parse_args(argv)
    from kiln.errors import KilnError

    try:
        return args.fn(args)
    except (KilnError, ValueError, FileNotFoundError) as e:
        print(f"kiln: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
