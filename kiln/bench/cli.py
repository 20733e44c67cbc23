"""`kiln bench`: measure Kiln against the peers on a suite of workloads, then report.

    kiln bench --suite quick --systems kiln,onnxruntime --threads 2 --json out.json --html out.html
    python -m kiln.bench --suite kernels --strategy kiln=direct,ukernel --strategy iree=all

Exit code: 0 when the run completed, 1 when Kiln itself computed a wrong result, 2 on bad usage.
"""
from __future__ import annotations

import argparse
import datetime as dt
import os
import sys
from typing import Any

from . import workloads as wl
from .protocol import ProtocolConfig

DEFAULT_THREADS = min(2, os.cpu_count() or 1)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--suite", default="quick", choices=list(wl.SUITES), help="workload suite")
    p.add_argument("--workloads", help="comma-separated workload names (instead of the suite)")
    p.add_argument("--systems", help="comma-separated systems (default: kiln and every peer); "
                   "'pkg.module:Class' names a system outside the project")
    p.add_argument("--threads", type=int, default=DEFAULT_THREADS, help="threads for every system")
    p.add_argument("--json", metavar="F", help="write the records as JSON")
    p.add_argument("--html", metavar="F", help="write a self-contained HTML report")
    p.add_argument("--md", metavar="F", help="write the Markdown tables to a file too")
    p.add_argument("--ablate", action="store_true",
                   help="also measure Kiln with each of kiln.PASS_OPTIONS switched off in turn")
    p.add_argument("--tuned", action="store_true",
                   help="also measure Kiln with the tuned schedules of the tuning database (`kiln tune`; the "
                   "database is $KILN_CACHE_DIR/tuning.db): column kiln:tuned, beside the untuned default")
    p.add_argument("--tuned-widths", metavar="W1,W2", default="",
                   help="with --tuned: also Kiln built for these narrower x86 widths of the host (avx2, sse), "
                   "untuned and tuned (`kiln tune --target W`): columns kiln:direct@W and kiln:tuned@W, and the "
                   "width's own FMA peak for their %% of peak")
    p.add_argument("--strategy", action="append", default=[], metavar="SPEC",
                   help="'all' (every strategy of every system) or 'system=s1,s2' or 'system=all'; "
                   "repeatable. Default: every Kiln strategy, the first of each peer")
    p.add_argument("--repeat", type=int, default=10, help="interleaved timing rounds")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds allowed to prepare")
    p.add_argument("--settle", type=float, default=ProtocolConfig.settle_s,
                   help="seconds to pause between two systems' turns, so threads a runtime leaves spinning "
                   "after its run are not charged to the next system")
    p.add_argument("--no-roofline", action="store_true", help="skip measuring peak and bandwidth")
    p.add_argument("--isa", action="store_true",
                   help="add the ISA section: instruction counts by class per FLOP under QEMU, 1-D vector vs matrix "
                   "work, llvm-mca estimates (kiln/isa), per workload x target x Kiln strategy")
    p.add_argument("--isa-only", action="store_true", help="the ISA section only, no timing (implies --isa)")
    p.add_argument("--isa-targets", default="aarch64-sve,riscv64-rvv", metavar="T1,T2",
                   help="cross targets for --isa (the host always gets llvm-mca estimates)")
    p.add_argument("--isa-strategies", default="direct,ukernel", metavar="S1,S2", help="Kiln strategies for --isa")
    p.add_argument("--isa-vlen", type=int, metavar="BITS",
                   help="vector length for the emulated runs (default: the llvm-mca core's: SVE 256, RVV 512)")
    p.add_argument("--precision", default="fp32", metavar="P1,P2",
                   help="precisions to measure, of fp32,int8,bf16 (kiln/bench/precision.py): each system that has "
                   "the precision gets a row per precision, int8 quantized by its own tool on the same calibration "
                   "inputs, with its quality against its own fp32 build")
    p.add_argument("--calibration-inputs", type=int, default=ProtocolConfig.calibration_inputs, metavar="N",
                   help="int8: calibration inputs per workload")
    p.add_argument("--eval-inputs", type=int, default=ProtocolConfig.eval_inputs, metavar="N",
                   help="int8/bf16: evaluation inputs for the quality columns (0: none)")
    p.add_argument("--list", action="store_true", help="list suites, workloads and systems")
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def parse_strategies(specs: list[str]) -> tuple[bool, dict[str, list[str] | None]]:
    """(all_for_everyone, {system: [strategies] or None for all of them})."""
    every, per = False, {}
    for spec in specs:
        if spec.strip() == "all":
            every = True
            continue
        if "=" not in spec:
            raise ValueError(f"bad --strategy {spec!r}: expected 'all' or 'system=s1,s2'")
        system, values = spec.split("=", 1)
        names = [v.strip() for v in values.split(",") if v.strip()]
        per[system.strip()] = None if names == ["all"] else names
    return every, per


def strategies_for(system: Any, every: bool, per: dict[str, list[str] | None]) -> list[str]:
    offered = list(getattr(system, "strategies", ()) or ("default",))
    if system.name in per:
        return per[system.name] or offered
    if every or system.name == "kiln":  # Kiln's strategies are the research question
        return offered
    return offered[:1]


def contestants(args: argparse.Namespace) -> list[Any]:
    from .kiln_system import KilnSystem, ablation_strategy, pass_options
    from .protocol import Contestant
    from .systems import select
    every, per = parse_strategies(args.strategy)
    precisions = precisions_of(args)
    out = [Contestant(s, st, p) for s in select(args.systems) for st in strategies_for(s, every, per)
           for p in precisions if p == "fp32" or p in getattr(s, "precisions", ("fp32",))]
    if args.ablate:
        opts = pass_options()
        if not any(c.name == "kiln" for c in out):
            print("--ablate: kiln is not among the systems; no ablations", file=sys.stderr)
        elif opts is None:
            print("--ablate: kiln.PASS_OPTIONS does not exist (yet); skipping ablations",
                  file=sys.stderr)
        else:
            out += [Contestant(KilnSystem(), ablation_strategy(o)) for o in opts]
    if getattr(args, "tuned", False):
        from .kiln_system import TUNED, WIDTH_SEP
        if not any(c.name == "kiln" for c in out):
            print("--tuned: kiln is not among the systems", file=sys.stderr)
        else:
            out.append(Contestant(KilnSystem(), TUNED))
            out += [Contestant(KilnSystem(), f"{base}{WIDTH_SEP}{w}") for w in tuned_widths(args)
                    for base in ("direct", TUNED)]
    return out


def tuned_widths(args: argparse.Namespace) -> list[str]:
    """--tuned-widths, checked: narrower x86 widths this host runs."""
    from kiln.target import X86_WIDTHS, resolve, runs_here
    widths = _csv(getattr(args, "tuned_widths", "") or "")
    for w in widths:
        if w not in X86_WIDTHS or not runs_here(resolve(w)):
            runs = [x for x in X86_WIDTHS if runs_here(resolve(x))]
            raise ValueError(f"--tuned-widths {w}: not an x86 width this host runs ({', '.join(runs) or 'none'})")
    return widths


def low_precision_tables(precisions: list[str]) -> dict[str, str]:
    """The ISA report's int8 / bf16 sections for the run's low precisions (Markdown tables: kiln/isa/int8.py, bf16.py):
    instructions per multiply-accumulate of each ISA's dot product, direct and microkernel."""
    out: dict[str, str] = {}
    if "int8" in precisions:
        from kiln.isa.int8 import markdown, report
        out["int8"] = markdown(report())
    if "bf16" in precisions:
        from kiln.isa.bf16 import format_table, table
        out["bf16"] = format_table(table())
    return out


def precisions_of(args: argparse.Namespace) -> list[str]:
    from .precision import check_precision
    return [check_precision(p) for p in _csv(getattr(args, "precision", "fp32") or "fp32")]


def workload_names(args: argparse.Namespace) -> list[str]:
    if args.workloads:
        names = [n.strip() for n in args.workloads.split(",") if n.strip()]
        unknown = [n for n in names if n not in wl.factories()]
        if unknown:
            raise ValueError(f"unknown workloads {unknown}; see --list")
        return names
    return wl.names(args.suite)


def _csv(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def _list() -> int:
    from .systems import default_systems, not_run_systems
    for suite, names in wl.SUITES.items():
        print(f"suite {suite}: {', '.join(names)}")
    for s in default_systems():
        print(f"system {s.name}: kinds {', '.join(sorted(s.kinds))}; "
              f"strategies {', '.join(s.strategies)}; precisions {', '.join(getattr(s, 'precisions', ('fp32',)))}")
    for name, why in not_run_systems().items():
        print(f"not run {name}: {why}")
    return 0


def _info(args: argparse.Namespace, names: list[str], cfg: Any) -> dict[str, Any]:
    from dataclasses import asdict

    from .roofline import machine_info, measure
    from .systems import not_run_systems
    info: dict[str, Any] = {
        "date": dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        "suite": args.suite if not args.workloads else "custom", "workloads": names,
        "threads": args.threads, "machine": machine_info(), "config": asdict(cfg),
        "precisions": precisions_of(args), "not_run": not_run_systems(),
    }
    if not args.no_roofline:
        print(f"measuring the roofline on {args.threads} threads ...", file=sys.stderr)
        info["roofline"] = measure(args.threads).to_dict()
        widths = tuned_widths(args) if getattr(args, "tuned", False) else []
        if widths:
            from kiln.target import resolve

            from .roofline import measure_peak
            # each width's own FMA peak: % of peak of an AVX2 build is against what AVX2 code can reach
            info["roofline"]["peak_gflops_by_width"] = {
                w: measure_peak(args.threads, features=resolve(w).features)[0] for w in widths}
    return info


def run(args: argparse.Namespace) -> int:
    from .progress import Progress
    from .protocol import ProtocolConfig
    from .protocol import run as run_protocol
    from .report import RunReport, to_markdown, write_json, write_markdown
    if args.list:
        return _list()
    try:
        names = workload_names(args)
        people = contestants(args)
    except (ValueError, KeyError) as exc:
        print(f"kiln bench: {exc}", file=sys.stderr)
        return 2
    cfg = ProtocolConfig(threads=args.threads, rounds=args.repeat, prepare_timeout_s=args.timeout,
                         settle_s=args.settle, calibration_inputs=args.calibration_inputs,
                         eval_inputs=args.eval_inputs)
    if args.isa_only:
        args.no_roofline = True   # nothing is timed: no peak to compare with
    report = RunReport(info=_info(args, names, cfg))
    bar = Progress(len(names), enabled=not args.quiet)

    def done(name: str) -> None:
        bar.step(name)
        if args.json:  # a long run is saved workload by workload
            write_json(report, args.json)

    records = report.records
    if args.isa or args.isa_only:
        from kiln.isa.analysis import run_isa
        report.info["isa"] = run_isa([wl.factories()[n]() for n in names], _csv(args.isa_targets),
                                     _csv(args.isa_strategies), args.isa_vlen, progress=bar.say)
        report.info["isa"].update(low_precision_tables(precisions_of(args)))
    try:
        if not args.isa_only:
            run_protocol([wl.factories()[n] for n in names], people, cfg,
                         peak=report.peak_gflops, progress=bar.say, on_workload=done,
                         sink=records)
    finally:
        bar.close()
    print(to_markdown(report))
    for path, write in ((args.json, write_json), (args.md, write_markdown), (args.html, _write_html)):
        if path:
            write(report, path)
            print(f"wrote {path}", file=sys.stderr)
    wrong = [r for r in records if r["system"] == "kiln" and r.get("status") == "wrong"]
    wrong += [r for r in report.info.get("isa", {}).get("records", []) if r.get("status") == "wrong"]
    return 1 if wrong else 0


def _write_html(report: Any, path: str) -> None:
    from .htmlreport import write_html  # matplotlib is heavy: only when a page is asked for
    write_html(report, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kiln bench", description=__doc__.split("\n")[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))
