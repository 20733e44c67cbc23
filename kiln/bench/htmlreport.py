"""A self-contained HTML page for one run: figures inlined as base64 PNG, no external URLs."""
from __future__ import annotations

import html
from pathlib import Path
from typing import Any

from . import plots
from .kiln_system import ABLATE_PREFIX, PLANNED_STRATEGIES
from .report import (
    HOST_STATE_HEADER,
    RunReport,
    _fmt,
    _ratio,
    _status,
    baseline_ms,
    busy_warning,
    by_workload,
    host_state_rows,
    label,
)

CSS = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1100px; color: #222; }
table { border-collapse: collapse; margin: 0.6em 0 1.2em; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 3px 8px; text-align: right; white-space: nowrap; }
th:first-child, td:first-child, td.text { text-align: left; }
td.text { white-space: normal; max-width: 22em; font-size: 0.9em; }
th { background: #f3f3f3; }
tr.kiln td { background: #fff1e6; }
td.bad { color: #d7191c; font-weight: bold; }
img { max-width: 100%; display: block; margin: 0.5em 0; }
.note { color: #666; font-size: 0.9em; }
section { margin-bottom: 2.5em; }
div.wide { overflow-x: auto; }
"""

Rec = dict[str, Any]


def _e(x: Any) -> str:
    return html.escape(str(x))


def _img(b64: str | None, alt: str) -> str:
    if b64 is None:
        return f'<p class="note">No timed record to plot for {_e(alt)}.</p>'
    return f'<img alt="{_e(alt)}" src="data:image/png;base64,{b64}">'


def _table(header: list[str], rows: list[list[str]], classes: list[str] | None = None) -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in header)
    head = f"<thead><tr>{head}</tr></thead>" if any(header) else ""
    body = []
    for i, row in enumerate(rows):
        cls = f' class="{classes[i]}"' if classes and classes[i] else ""
        body.append(f"<tr{cls}>" + "".join(row) + "</tr>")
    return f'<div class="wide"><table>{head}<tbody>{"".join(body)}</tbody></table></div>'


def _td(x: Any, bad: bool = False, text: bool = False) -> str:
    cls = " ".join(c for c, on in (("bad", bad), ("text", text)) if on)
    return f'<td class="{cls}">{_e(x)}</td>' if cls else f"<td>{_e(x)}</td>"


# ---- sections -----------------------------------------------------------------------------------

def _machine(report: RunReport) -> str:
    info, roof = report.info, report.info.get("roofline", {})
    m = info.get("machine", {})
    rows = [
        ("date", info.get("date", "?")), ("suite", info.get("suite", "?")),
        ("threads (every system)", info.get("threads", "?")),
        ("CPU", f"{m.get('model', '')} (LLVM cpu {m.get('cpu', '?')}), {m.get('cores', '?')} cores"),
        ("features", ", ".join(m.get("features", []))), ("memory", f"{m.get('memory_gib', '?')} GiB"),
        ("software", f"python {m.get('python', '?')}, LLVM {m.get('llvm', '?')}, "
                     f"numpy {m.get('numpy', '?')}; {m.get('platform', '')}"),
    ]
    if roof:
        rows += [
            ("peak fp32 (measured)", f"{_fmt(roof.get('peak_gflops'), '.1f')} GFLOP/s on "
             f"{roof.get('threads')} threads, {_fmt(roof.get('peak_gflops_1t'), '.1f')} on one"),
            ("bandwidth (triad)", f"DRAM {_fmt(roof.get('bandwidth_gbs'), '.1f')} GB/s, "
             f"L3 {_fmt(roof.get('l3_bandwidth_gbs'), '.1f')} GB/s"),
        ]
    else:
        rows.append(("roofline", "not measured in this run (--no-roofline)"))
    warn = ""
    if roof.get("host_busy"):
        warn = f'<p class="note">{_e(busy_warning(roof)).replace("**", "")}</p>'
    return "<h2>Machine</h2>" + _table(["", ""], [[_td(k), _td(v, text=True)] for k, v in rows]) + warn


def _summary(groups: dict[str, list[Rec]]) -> str:
    rows, classes = [], []
    for name, recs in groups.items():
        timed = [r for r in recs if r["ok"] and r["median_ms"]
                 and not str(r.get("strategy")).startswith(ABLATE_PREFIX)]
        best = min(timed, key=lambda r: r["median_ms"], default=None)
        k, o = baseline_ms(recs, "kiln"), baseline_ms(recs, "onnxruntime")
        kiln_bad = any(r["system"] == "kiln" and r.get("status") == "wrong" for r in recs)
        rows.append([_td(name), _td(recs[0].get("kind", "")),
                     _td(label(best) if best else "–"), _td(_fmt(best and best["median_ms"], ".4g")),
                     _td(_fmt(k, ".4g") if not kiln_bad else "WRONG", bad=kiln_bad),
                     _td(_fmt(o, ".4g")), _td(_ratio(k, o))])
        classes.append("")
    return "<h2>Summary</h2>" + _table(
        ["workload", "kind", "fastest", "ms", "kiln ms", "onnxruntime ms", "kiln ÷ onnxruntime"],
        rows, classes) + '<p class="note">Ratios are time ÷ time: below 1, Kiln is faster.</p>'


def _workload_table(recs: list[Rec]) -> str:
    recs = sorted(recs, key=lambda r: (r["median_ms"] is None, r["median_ms"] or 0, label(r)))
    kb, ob = baseline_ms(recs, "kiln"), baseline_ms(recs, "onnxruntime")
    rows, classes = [], []
    for r in recs:
        rows.append([
            _td(label(r)), _td(r.get("version", ""), text=True),
            _td(_fmt(r["median_ms"], ".4g")), _td(_fmt(r["iqr_ms"], ".2g")),
            _td(_ratio(r["median_ms"], kb)), _td(_ratio(r["median_ms"], ob)),
            _td(_fmt(r["gflops"], ".1f")), _td(_fmt(r["pct_peak"], ".0f")),
            _td(_fmt(r["compile_s"], ".2f")), _td(_fmt(r["max_rel_err"], ".1e")),
            _td(_status(r), bad=not r["ok"]), _td(r.get("reason", "") or "", text=True),
        ])
        classes.append("kiln" if r["system"] == "kiln" else "")
    return _table(["system", "version", "median ms", "IQR ms", "÷ kiln", "÷ onnxruntime", "GFLOP/s",
                   "% peak", "compile s", "max rel err", "status", "reason"], rows, classes)


def _workloads(groups: dict[str, list[Rec]]) -> str:
    parts = ["<h2>Per workload</h2>"]
    for name, recs in groups.items():
        flops = recs[0].get("flops")
        gf = f", {flops / 1e9:.3g} GFLOP" if flops else ""
        shown = [r for r in recs if not str(r.get("strategy")).startswith(ABLATE_PREFIX)]
        parts.append(f'<section id="wl-{_e(name)}"><h3>{_e(name)} ({_e(recs[0].get("kind", ""))}{gf})'
                     f"</h3>{_img(plots.workload_bars(name, shown), name)}{_workload_table(recs)}"
                     "</section>")
    return "".join(parts)


def _roofline(report: RunReport, groups: dict[str, list[Rec]]) -> str:
    roof = report.info.get("roofline", {})
    fig = plots.roofline_chart(groups, roof.get("peak_gflops"), roof.get("bandwidth_gbs"),
                               roof.get("l3_bandwidth_gbs"))
    note = "" if roof else '<p class="note">No roof: the roofline was not measured in this run.</p>'
    return ("<h2>Roofline</h2><p>Each workload at its arithmetic intensity (FLOPs over the bytes it "
            "must at least move: inputs, weights, outputs), Kiln's best strategy and the best "
            f"peer.</p>{note}{_img(fig, 'roofline')}")


def _ablations(groups: dict[str, list[Rec]]) -> str:
    parts = ["<h2>Ablations</h2>"]
    found = False
    for name, recs in groups.items():
        base = baseline_ms(recs, "kiln")
        abl = [r for r in recs if r["system"] == "kiln"
               and str(r.get("strategy")).startswith(ABLATE_PREFIX)]
        if not abl:
            continue
        found = True
        steps = [(r["strategy"][len(ABLATE_PREFIX):], r["median_ms"]) for r in abl if r["median_ms"]]
        rows = [[_td(r["strategy"][len(ABLATE_PREFIX):]), _td(_fmt(r["median_ms"], ".4g")),
                 _td(_ratio(r["median_ms"], base)), _td(_status(r), bad=not r["ok"])] for r in abl]
        fig = plots.ablation_waterfall(name, base, steps) if base and steps else None
        parts.append(f"<h3>{_e(name)}</h3>{_img(fig, f'ablation {name}')}"
                     + _table(["option switched off", "ms", "÷ kiln (all on)", "status"], rows))
    if not found:
        parts.append('<p class="note">No ablation records in this run '
                     "(run <code>kiln bench --ablate</code>).</p>")
    return "".join(parts)


def _strategy_columns(records: list[Rec]) -> tuple[list[str], list[str]]:
    """(columns with records, Kiln strategies still without any)."""
    seen = {(r["system"], r.get("strategy")) for r in records}
    kiln_seen = sorted({str(s) for sys_, s in seen if sys_ == "kiln" and not str(s).startswith(ABLATE_PREFIX)},
                       key=lambda s: (PLANNED_STRATEGIES.index(s.split(":")[0]) if s.split(":")[0] in
                                      PLANNED_STRATEGIES else 9, s))
    kiln_cols = [f"kiln:{s}" for s in kiln_seen]
    missing = [f"kiln:{s}" for s in PLANNED_STRATEGIES if not any(k.split(":")[0] == s for k in kiln_seen)]
    iree = sorted({f"iree:{s}" for sys_, s in seen if sys_ == "iree"})
    return kiln_cols + iree, missing


def _strategies(report: RunReport, groups: dict[str, list[Rec]]) -> str:
    cols, missing = _strategy_columns(report.records)
    parts = ["<h2>Microkernel vs direct emission</h2><p>The same operators built by Kiln three ways "
             "(direct vector code, hand-written microkernels, vendor libraries) beside IREE's "
             "variants (e.g. data tiling with and without its mmt4d microkernel), GFLOP/s.</p>"]
    for m in missing:
        parts.append(f'<p class="note"><b>{_e(m)}</b>: no records yet.</p>')
    if not any(c.startswith("iree:") for c in cols):
        parts.append('<p class="note"><b>iree</b>: no records yet '
                     "(<code>--systems kiln,iree --strategy iree=all</code>).</p>")
    rows: list[tuple[str, dict[str, float | None]]] = []
    for name, recs in groups.items():
        row = {f"{r['system']}:{r.get('strategy')}": (r["gflops"] if r["ok"] else None)
               for r in recs}
        row = {c: row.get(c) for c in cols}
        if any(v is not None for v in row.values()):
            rows.append((name, row))
    if not rows:
        return "".join(parts) + '<p class="note">Nothing to compare in this run.</p>'
    table = _table(["workload", *cols],
                   [[_td(n), *(_td(_fmt(row[c], ".1f")) for c in cols)] for n, row in rows])
    return "".join(parts) + _img(plots.strategy_chart(rows, cols), "strategies") + table


def _host_states(report: RunReport) -> str:
    """Each system's median per host state (vCPUs on one L3 or two), when the run saw both."""
    rows = host_state_rows(report.records)
    if not rows:
        return ""
    return ("<h2>By host state</h2><p class=\"note\">Probed before every turn: one cache line bounced between the "
            "first two CPUs (~55 ns on one L3, ~330 ns on two on a virtualized Zen 4).</p>"
            + _table(HOST_STATE_HEADER, [[_td(r[0], text=True), _td(r[1], text=True), *map(_td, r[2:])]
                                         for r in rows]))


def _isa(report: RunReport) -> str:
    """The ISA section (`kiln bench --isa`), when the run has one."""
    if not report.info.get("isa"):
        return ""
    from kiln.isa.report import to_html
    return to_html(report.info["isa"])


def render_html(report: RunReport) -> str:
    groups = by_workload(report.records)
    title = f"kiln bench — {report.info.get('suite', 'run')} — {report.info.get('date', '')}"
    body = "".join([
        f"<h1>{_e(title)}</h1>",
        '<p class="note">Every system runs with the same inputs and thread count, in its own '
        "process; outputs are checked against a reference before any timing, and a wrong system "
        "is not timed. Timings are interleaved rounds; median and interquartile range.</p>",
        _machine(report), _summary(groups), _roofline(report, groups),
        _strategies(report, groups), _ablations(groups), _host_states(report), _workloads(groups), _isa(report),
    ])
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{_e(title)}</title>'
            f"<style>{CSS}</style></head><body>{body}</body></html>\n")


def write_html(report: RunReport, path: str | Path) -> None:
    Path(path).write_text(render_html(report))
