"""Benchmark records and the reports made from them: JSON, a Markdown table, an HTML page.

A record is a plain dict with exactly the keys of RECORD_KEYS (plus optional extras such as
`kind`, `status`, `reason`, `flops`, `bytes`, `samples`). A run is saved as JSON:

    {"info": {"date", "suite", "threads", "machine": {...}, "roofline": {...}, "config": {...}},
     "records": [record, ...]}
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

RECORD_KEYS: tuple[str, ...] = (
    "workload", "system", "strategy", "threads", "version", "median_ms", "iqr_ms",
    "gflops", "pct_peak", "compile_s", "ok", "max_rel_err",
)
BASELINES = ("kiln", "onnxruntime")  # the Markdown table shows time ratios against these two


def make_record(workload: str, system: str, strategy: str, threads: int, version: str, *,
                median_ms: float | None = None, iqr_ms: float | None = None,
                flops: float | None = None, peak_gflops: float | None = None,
                compile_s: float | None = None, ok: bool = False,
                max_rel_err: float | None = None, **extra: Any) -> dict[str, Any]:
    gflops = flops / (median_ms * 1e6) if flops and median_ms else None
    pct = 100.0 * gflops / peak_gflops if gflops and peak_gflops else None
    rec = {"workload": workload, "system": system, "strategy": strategy, "threads": threads,
           "version": version, "median_ms": median_ms, "iqr_ms": iqr_ms, "gflops": gflops,
           "pct_peak": pct, "compile_s": compile_s, "ok": bool(ok), "max_rel_err": max_rel_err}
    if flops is not None:
        extra.setdefault("flops", flops)
    rec.update(extra)
    return rec


@dataclass
class RunReport:
    info: dict[str, Any] = field(default_factory=dict)
    records: list[dict[str, Any]] = field(default_factory=list)

    @property
    def peak_gflops(self) -> float | None:
        return self.info.get("roofline", {}).get("peak_gflops")

    @property
    def bandwidth_gbs(self) -> float | None:
        return self.info.get("roofline", {}).get("bandwidth_gbs")


def _finite(x: Any) -> Any:
    """JSON has no inf/nan: they become null (the record's status/reason says why)."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_finite(v) for v in x]
    return x


def to_json(report: RunReport) -> str:
    return json.dumps(_finite({"info": report.info, "records": report.records}), indent=1)


def write_json(report: RunReport, path: str | Path) -> None:
    Path(path).write_text(to_json(report) + "\n")


def load_json(path: str | Path) -> RunReport:
    data = json.loads(Path(path).read_text())
    if isinstance(data, list):  # a bare list of records is accepted too
        return RunReport(records=data)
    return RunReport(info=data.get("info", {}), records=data.get("records", []))


# ---- Markdown ---------------------------------------------------------------------------------

def label(rec: dict[str, Any]) -> str:
    strat = rec.get("strategy") or "default"
    base = rec["system"] if strat == "default" else f"{rec['system']}:{strat}"
    precision = rec.get("precision") or "fp32"
    return base if precision == "fp32" else f"{base}@{precision}"


def is_fp32(rec: dict[str, Any]) -> bool:
    return (rec.get("precision") or "fp32") == "fp32"


def _fmt(x: float | None, spec: str = ".3g") -> str:
    return "–" if x is None else format(x, spec)


def by_workload(records: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for rec in records:
        out.setdefault(rec["workload"], []).append(rec)
    return out


def baseline_ms(recs: list[dict[str, Any]], system: str) -> float | None:
    """The time of one system on one workload: kiln's default strategy first, else its best."""
    timed = [r for r in recs if r["system"] == system and r["ok"] and r["median_ms"] and is_fp32(r)
             and not str(r.get("strategy", "")).startswith("ablate:")]
    if not timed:
        return None
    preferred = [r for r in timed if r.get("strategy") in ("direct", "default")]
    return min(r["median_ms"] for r in (preferred or timed))


def _status(rec: dict[str, Any]) -> str:
    if rec["ok"]:
        return "ok"
    status = rec.get("status", "wrong")
    if status == "wrong" and rec.get("max_rel_err") is not None:
        return f"WRONG (err {rec['max_rel_err']:.2g})"
    return status.upper() if status in ("wrong", "crashed", "timeout", "error") else status


def _ms_cell(rec: dict[str, Any]) -> str:
    if rec["median_ms"] is None:
        return "–"
    return f"{rec['median_ms']:.4g} ± {_fmt(rec['iqr_ms'], '.2g')}"


def _ratio(ms: float | None, base: float | None) -> str:
    return "–" if ms is None or not base else f"{ms / base:.2f}"


def markdown_table(recs: list[dict[str, Any]]) -> list[str]:
    shown = [r for r in recs if r.get("status") not in ("unavailable", "skipped")]
    shown.sort(key=lambda r: (r["median_ms"] is None, r["median_ms"] or 0.0, label(r)))
    bases = {b: baseline_ms(recs, b) for b in BASELINES}
    lines = ["| system | ms (median ± IQR) | ÷ kiln | ÷ onnxruntime | GFLOP/s | % peak | compile s | ok |",
             "|---|---:|---:|---:|---:|---:|---:|---|"]
    for r in shown:
        lines.append(
            f"| {label(r)} | {_ms_cell(r)} | {_ratio(r['median_ms'], bases['kiln'])} "
            f"| {_ratio(r['median_ms'], bases['onnxruntime'])} | {_fmt(r['gflops'], '.1f')} "
            f"| {_fmt(r['pct_peak'], '.0f')} | {_fmt(r['compile_s'], '.2f')} | {_status(r)} |")
    return lines


def _notes(recs: list[dict[str, Any]]) -> list[str]:
    """One line per system that was not timed, with its reason."""
    notes = []
    for r in recs:
        if not r["ok"] and r.get("reason"):
            notes.append(f"- {label(r)}: {r.get('status', 'not timed')} — {r['reason']}")
    return notes


def _header(info: dict[str, Any]) -> list[str]:
    roof, machine = info.get("roofline", {}), info.get("machine", {})
    lines = [f"# kiln bench — suite {info.get('suite', '?')}, {info.get('threads', '?')} threads, "
             f"{info.get('date', '')}"]
    if machine:
        lines.append(f"Machine: {machine.get('cpu', '?')}, {machine.get('cores', '?')} cores.")
    if roof:
        lines.append(f"Measured peak {_fmt(roof.get('peak_gflops'), '.1f')} GFLOP/s fp32, "
                     f"DRAM triad {_fmt(roof.get('bandwidth_gbs'), '.1f')} GB/s.")
        if roof.get("host_busy"):
            lines.append(busy_warning(roof))
    lines.append("Ratios are time ÷ baseline time (below 1 = faster than the baseline); "
                 "systems whose outputs are wrong are not timed.")
    return lines


def busy_warning(roof: dict[str, Any]) -> str:
    return (f"**The host was busy** while measuring (only {_fmt(roof.get('peak_gflops_wall'), '.0f')}"
            f" of {_fmt(roof.get('peak_gflops'), '.0f')} GFLOP/s on the wall clock): absolute "
            "times are noisy, compare systems by their ratios within this run.")


def overview_table(records: list[dict[str, Any]]) -> list[str]:
    """One line per workload, one column per system (median ms; '✗' wrong, '·' not run): the run at a glance."""
    systems: list[str] = []
    for r in records:
        if label(r) not in systems and not str(r.get("strategy", "")).startswith("ablate:"):
            systems.append(label(r))
    lines = ["| workload | " + " | ".join(systems) + " | kiln ÷ onnxruntime |",
             "|---|" + "---:|" * (len(systems) + 1)]
    for workload, recs in by_workload(records).items():
        cells = []
        for s in systems:
            r = next((x for x in recs if label(x) == s), None)
            cells.append("·" if r is None or r.get("status") in ("unavailable", "skipped")
                         else ("✗" if not r["ok"] else (f"{r['median_ms']:.4g}" if r["median_ms"] else "–")))
        lines.append(f"| {workload} | " + " | ".join(cells) + " | "
                     f"{_ratio(baseline_ms(recs, 'kiln'), baseline_ms(recs, 'onnxruntime'))} |")
    return lines


def strategy_table(records: list[dict[str, Any]]) -> list[str]:
    """Kiln's strategies side by side (median ms, ÷ direct, ÷ onnxruntime): the research question at a glance."""
    strategies: list[str] = []
    for r in records:
        s = str(r.get("strategy"))
        if r["system"] == "kiln" and not s.startswith("ablate:") and s not in strategies:
            strategies.append(s)
    if len(strategies) < 2:
        return []
    lines = ["| workload | " + " | ".join(f"{s} ms" for s in strategies) + " | onnxruntime ms | "
             + " | ".join(f"{s} ÷ direct" for s in strategies[1:]) + " | best ÷ onnxruntime |",
             "|---|" + "---:|" * (2 * len(strategies) + 1)]
    for workload, recs in by_workload(records).items():
        ms = {s: next((r["median_ms"] for r in recs if r["system"] == "kiln" and r.get("strategy") == s
                       and r["ok"] and r["median_ms"]), None) for s in strategies}
        ort = baseline_ms(recs, "onnxruntime")
        direct = ms.get("direct")
        best = min((v for v in ms.values() if v), default=None)
        lines.append(f"| {workload} | " + " | ".join(_fmt(ms[s], ".4g") for s in strategies)
                     + f" | {_fmt(ort, '.4g')} | " + " | ".join(_ratio(ms[s], direct) for s in strategies[1:])
                     + f" | {_ratio(best, ort)} |")
    return lines


def tuning_table(records: list[dict[str, Any]], peaks: dict[str, float] | None = None) -> list[str]:
    """`kiln bench --tuned`: what tuning contributes — the untuned default (direct) against the tuned build, per
    workload and x86 width ("tuned@avx2" beside "direct@avx2", `--tuned-widths`), and each width's geometric mean.
    `peaks` (width → GFLOP/s; "" the host's): the tuned build's % of its own width's FMA peak."""
    rows, ratios = [], {}
    for workload, recs in by_workload(records).items():
        kiln = {r.get("strategy"): r for r in recs if r["system"] == "kiln" and r["ok"] and r["median_ms"]}
        ort = baseline_ms(recs, "onnxruntime")
        for strategy in sorted(s for s in kiln if s.partition("@")[0] == "tuned"):   # "tuned" (the host) first
            width = strategy.partition("@")[2]
            direct = kiln.get("direct" + (f"@{width}" if width else ""))
            if direct is None:
                continue
            tuned_ms, direct_ms = kiln[strategy]["median_ms"], direct["median_ms"]
            ratios.setdefault(width, []).append(tuned_ms / direct_ms)
            peak, gflops = (peaks or {}).get(width), kiln[strategy].get("gflops")
            pct = 100.0 * gflops / peak if peak and gflops else None
            rows.append(f"| {workload} | {width or 'host'} | {direct_ms:.4g} | {tuned_ms:.4g} | "
                        f"{ratios[width][-1]:.3f} | {_fmt(pct, '.0f')} | {_ratio(tuned_ms, ort)} |")
    if not rows:
        return []
    geo = [f"| geometric mean | {w or 'host'} | | | {math.exp(sum(map(math.log, r)) / len(r)):.3f} | | |"
           for w, r in ratios.items()]
    return ["| workload | width | default ms | tuned ms | tuned ÷ default | tuned % of the width's peak | "
            "tuned ÷ onnxruntime |", "|---|---|---:|---:|---:|---:|---:|", *rows, *geo]


# How each column builds its kernels, in the order the strategy section lists them (kiln.bench.systems.approach).
APPROACHES: tuple[str, ...] = ("direct emission", "hand-written microkernels", "synthesized kernels",
                               "scheduled kernels (DSL)", "vendor libraries")


def approach_table(records: list[dict[str, Any]]) -> list[str]:
    """Per workload, every fp32 column grouped by how it builds its kernels: Kiln's direct emission, hand-written
    microkernels (Kiln's ukernel strategy, BLIS, XNNPACK), synthesized kernels (Exo), scheduled (Halide), vendor
    libraries (Kiln's library strategy, MKL, OpenBLAS, oneDNN); median ms, and the best ÷ kiln:direct."""
    shown = [a for a in APPROACHES if any(r.get("approach") == a and r["ok"] for r in records)]
    if len(shown) < 2:
        return []
    lines = ["| workload | " + " | ".join(shown) + " | " + " | ".join(f"best {a} ÷ direct" for a in shown[1:])
             + " |", "|---|" + "---|" * len(shown) + "---:|" * (len(shown) - 1)]
    for workload, recs in by_workload(records).items():
        cells, best = [], {}
        for a in shown:
            timed = sorted((r for r in recs if r.get("approach") == a and r["ok"] and r["median_ms"] and is_fp32(r)),
                           key=lambda r: r["median_ms"])
            cells.append(", ".join(f"{label(r)} {r['median_ms']:.4g}" for r in timed) or "·")
            best[a] = timed[0]["median_ms"] if timed else None
        direct = best.get("direct emission")
        lines.append(f"| {workload} | " + " | ".join(cells) + " | "
                     + " | ".join(_ratio(best[a], direct) for a in shown[1:]) + " |")
    return lines


def precision_table(records: list[dict[str, Any]]) -> list[str]:
    """Every low-precision row beside its own fp32 row and onnxruntime's: time ratios and quality."""
    low = [r for r in records if not is_fp32(r)]
    if not low:
        return []
    lines = ["| workload | system | precision | ms | ÷ own fp32 | ÷ onnxruntime fp32 | top-1 agreement | "
             "SNR dB | max rel err | status |", "|---|---|---|---:|---:|---:|---:|---:|---:|---|"]
    for workload, recs in by_workload(records).items():
        ort = baseline_ms(recs, "onnxruntime")
        for r in (x for x in recs if not is_fp32(x)):
            own = next((x["median_ms"] for x in recs if x["system"] == r["system"] and is_fp32(x) and x["ok"]
                        and x.get("strategy") == r.get("strategy")), None)
            top1 = r.get("top1_agreement")
            lines.append(f"| {workload} | {r['system']}:{r.get('strategy')} | {r['precision']} | "
                         f"{_fmt(r['median_ms'], '.4g')} | {_ratio(r['median_ms'], own)} "
                         f"| {_ratio(r['median_ms'], ort)} "
                         f"| {'–' if top1 is None else f'{100 * top1:.1f}%'} | {_fmt(r.get('snr_db'), '.1f')} "
                         f"| {_fmt(r.get('quality_max_rel_err'), '.2g')} | {_status(r)} |")
    return lines


HOST_STATES = ("one L3", "two L3s")


def host_state_rows(records: list[dict[str, Any]]) -> list[list[str]]:
    """[workload, system, one L3 cell, two L3s cell] per timed record — median ms (samples) per host state, as the
    protocol probed it before every turn (kiln/runtime/coreprobe.py) — when the run saw both states: a virtualized
    host that moves the vCPUs between one L3 and two moves every system's times. Else []."""
    seen = {st for r in records for st in (r.get("host_states") or {})}
    if not set(HOST_STATES) <= seen:
        return []
    rows = []
    for r in records:
        by = r.get("host_states") or {}
        if r.get("ok") and by:
            rows.append([r["workload"], label(r), *(f"{_fmt(by[st]['median_ms'], '.4g')} ({by[st]['samples']})"
                                                     if st in by else "–" for st in HOST_STATES)])
    return rows


HOST_STATE_HEADER = ["workload", "system", *(f"{st}: median ms (samples)" for st in HOST_STATES)]


def host_state_table(records: list[dict[str, Any]]) -> list[str]:
    rows = host_state_rows(records)
    if not rows:
        return []
    return ["| " + " | ".join(HOST_STATE_HEADER) + " |", "|---|---|" + "---:|" * len(HOST_STATES),
            *("| " + " | ".join(r) + " |" for r in rows)]


def not_run_lines(info: dict[str, Any]) -> list[str]:
    return [f"- {name}: {why}" for name, why in (info.get("not_run") or {}).items()]


def to_markdown(report: RunReport) -> str:
    lines = _header(report.info)
    if report.records:   # none after `--isa-only`
        lines += ["", "## Overview (median ms)", "", *overview_table(report.records)]
    strat = strategy_table(report.records)
    if strat:
        lines += ["", "## Kiln's strategies: direct emission vs microkernels vs libraries", "", *strat]
    roof = report.info.get("roofline", {})
    tuned = tuning_table(report.records, {"": roof.get("peak_gflops"), **roof.get("peak_gflops_by_width", {})})
    if tuned:
        lines += ["", "## What tuning contributes (kiln tune; default = the untuned direct build)", "", *tuned, "",
                  "Each build runs in its own worker process: where the host alone moves a process's times by a few "
                  "percent (vCPUs placed on one L3 or two), `python benchmarks/tuned_vs_default.py MODEL ...` compares "
                  "the two builds in one process."]
    by_approach = approach_table(report.records)
    if by_approach:
        lines += ["", "## How the kernels are built: direct emission, hand-written microkernels, synthesized, "
                  "libraries (median ms)", "", *by_approach]
    low = precision_table(report.records)
    if low:
        lines += ["", "## Low precision (quality against the same system's fp32 build, "
                  f"{report.info.get('config', {}).get('eval_inputs', '?')} evaluation inputs)", "", *low]
    states = host_state_table(report.records)
    if states:
        lines += ["", "## By host state (the two vCPUs on one L3 or on two, probed before every turn)", "", *states]
    if not_run_lines(report.info):
        lines += ["", "## Systems not run here", "", *not_run_lines(report.info)]
    for workload, recs in by_workload(report.records).items():
        kind = recs[0].get("kind", "")
        flops = recs[0].get("flops")
        gf = f", {flops / 1e9:.3g} GFLOP" if flops else ""
        lines += ["", f"## {workload} ({kind}{gf})", "", *markdown_table(recs)]
        notes = _notes(recs)
        if notes:
            lines += ["", *notes]
    if report.info.get("isa"):   # `kiln bench --isa`
        from kiln.isa.report import to_markdown as isa_markdown
        lines += ["", *isa_markdown(report.info["isa"])]
    return "\n".join(lines) + "\n"


def write_markdown(report: RunReport, path: str | Path) -> None:
    Path(path).write_text(to_markdown(report))
