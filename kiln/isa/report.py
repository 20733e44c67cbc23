"""The ISA section of `kiln bench` reports (Markdown and HTML) from `run_isa`'s data (kept in the run's JSON as
info["isa"]): per workload one table, a row per target × strategy (direct and ukernel side by side), with
instruction counts by class per FLOP, the share of 1-D vector work, and llvm-mca's estimate of the hot loop."""
from __future__ import annotations

import html
from typing import Any

from kiln.isa import classify as ic
from kiln.isa.analysis import ISA_STRATEGIES, ISA_TARGETS, MATRIX, VECTOR_1D

# the per-FLOP columns, with short headers
CLASS_COLUMNS: tuple[tuple[str, str], ...] = (
    (ic.VEC_FMA, "vFMA"), (ic.VEC_ARITH, "vArith"), (ic.VEC_MEM, "vLd/St"), (ic.VEC_CONFIG, "vCfg/pred"),
    (ic.SME_OUTER, "SME"), (ic.SCALAR_INT, "sInt"), (ic.SCALAR_FP, "sFP"), (ic.SCALAR_MEM, "sLd/St"), (ic.BRANCH, "br"),
)
HEADER = (["target", "strategy", "status", "instr/FLOP"] + [h for _, h in CLASS_COLUMNS]
          + ["lanes/FMA", "1-D share (instr)", "1-D share (vector instr)", "matrix kernels outside FMA loops",
             "outside Kiln",
             "hot matrix loop (llvm-mca)", "hot 1-D loop (llvm-mca)"])

NOTES = (
    "Counts: dynamic, from one single-threaded run under QEMU with Kiln's TCG plugin (kiln/isa/plugin.c), only "
    "instructions inside Kiln's compiled code (kernels, microkernels, kiln_main); per FLOP = ÷ the workload's "
    "2·MACs. 'outside Kiln' = the C driver and libc (reading inputs, writing outputs). "
    "lanes/FMA = FLOPs ÷ (2 × vector FMAs in matrix kernels): the f32 lanes an FMA does useful work on. "
    "1-D share = instructions (resp. vector instructions) in kernels not anchored on MatMul/Conv: elementwise, "
    "softmax / normalization pieces, pooling, reductions. Epilogues fused into a MatMul/Conv run inside the matrix "
    "kernel: 'matrix kernels outside FMA loops' is the share of instructions the matrix kernels execute outside "
    "their innermost FMA loops (tile setup, packing, edge tiles, the fused epilogue, stores).",
    "llvm-mca: steady-state cycles per iteration of the kernel's hot loop (the innermost loop with the most FMAs) "
    "on the named core model; FLOP/cycle counts each FMA at the lanes/FMA measured in the run (host: at the "
    "register's width); it assumes L1 hits and predicted branches, and no model schedules SME. RVV: a vsetvli hoisted "
    "out of the loop is passed as LLVM-MCA-RISCV-LMUL/SEW comments, and an instruction is costed by its LMUL at "
    "the model's VLEN, whatever its vl (a loop using 8 lanes of an m2 group at VLEN 512 pays for 32). "
    "Host rows: llvm-mca only (no emulated run).",
)


def _f(x: Any, spec: str = ".3g") -> str:
    return "–" if x is None else format(x, spec)


def _pct(x: Any) -> str:
    return "–" if x is None else f"{100 * x:.1f}%"


def _mca_cell(rec: dict[str, Any], role: str) -> str:
    est = next((m for m in rec.get("mca") or [] if m["role"] == role), None)
    if est is None:
        return "–"
    flops = f", {est['flops_per_cycle']:.1f} FLOP/cyc" if role == MATRIX else ""
    return (f"{est['function']}: {est['cycles_per_iteration']:.1f} cyc/it, {est['instructions']} instr, "
            f"{est['fmas']} FMA{flops} ({est['cpu']})")


def _status(rec: dict[str, Any]) -> str:
    st = rec.get("status", "?")
    if st == "wrong":
        return f"WRONG (err {_f(rec.get('max_rel_err'), '.2g')})"
    return st


def row(rec: dict[str, Any]) -> list[str]:
    if rec.get("status") not in ("ok", "wrong"):
        per = [""] * (1 + len(CLASS_COLUMNS) + 5)
        return [rec["target"], rec["strategy"], _status(rec), *per, _mca_cell(rec, MATRIX), _mca_cell(rec, VECTOR_1D)]
    per_flop = rec.get("per_flop") or {}
    return [rec["target"], rec["strategy"], _status(rec), _f(rec.get("instructions_per_flop")),
            *(_f(per_flop.get(c)) for c, _ in CLASS_COLUMNS), _f(rec.get("lanes_per_fma"), ".2f"),
            _pct(rec.get("share_1d")), _pct(rec.get("share_1d_vector")),
            _pct(rec.get("share_matrix_outside_fma_loops")), _f(rec.get("outside_instructions"), ".3g"),
            _mca_cell(rec, MATRIX), _mca_cell(rec, VECTOR_1D)]


def by_workload(isa: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """Records grouped per workload, each group ordered target, then strategy (so strategies sit side by side)."""
    out: dict[str, list[dict[str, Any]]] = {}
    for rec in isa.get("records", []):
        out.setdefault(rec["workload"], []).append(rec)
    seen_t = [r["target"] for r in isa.get("records", [])]
    seen_s = [r["strategy"] for r in isa.get("records", [])]
    targets = list(dict.fromkeys([t for t in ISA_TARGETS if t in seen_t] + [t for t in seen_t if t != "host"]
                                 + ["host"]))
    strategies = list(dict.fromkeys([s for s in ISA_STRATEGIES if s in seen_s] + seen_s))
    for recs in out.values():
        recs.sort(key=lambda r: (targets.index(r["target"]), strategies.index(r["strategy"])))
    return out


def reasons(recs: list[dict[str, Any]]) -> list[str]:
    return [f"{r['target']} / {r['strategy']}: {r['status']} — {r['reason']}" for r in recs
            if r.get("status") not in ("ok", "static") and r.get("reason")]


def summary_lines(isa: dict[str, Any]) -> list[str]:
    """One sentence per counted record: how much of Kiln's work is 1-D vector work."""
    out = []
    for r in isa.get("records", []):
        if r.get("status") == "ok" and r.get("share_1d") is not None:
            out.append(f"{r['workload']} on {r['target']} ({r['strategy']}): 1-D kernels execute "
                       f"{_pct(r['share_1d'])} of Kiln's instructions and {_pct(r.get('share_1d_vector'))} of its "
                       f"vector instructions, matrix kernels outside their FMA loops "
                       f"{_pct(r.get('share_matrix_outside_fma_loops'))}; "
                       f"{_f(r.get('instructions_per_flop'))} instructions per FLOP, "
                       f"{_f(r.get('lanes_per_fma'), '.2f')} useful lanes per FMA (VLEN {r.get('vlen')}).")
    return out


def vlen_note(isa: dict[str, Any]) -> str:
    v = isa.get("vlen")
    which = ", ".join(f"{k} {b}" for k, b in v.items()) if isinstance(v, dict) else f"{v}"
    return f"Vector length of the emulated runs (bits): {which}."


def to_markdown(isa: dict[str, Any]) -> list[str]:
    lines = ["## ISA analysis (instruction counts per FLOP, 1-D vector vs matrix work, llvm-mca)", ""]
    for note in (*NOTES, vlen_note(isa)):
        lines += [note, ""]
    for workload, recs in by_workload(isa).items():
        flops = recs[0].get("flops")
        lines += [f"### {workload}" + (f" ({flops / 1e9:.3g} GFLOP)" if flops else ""), "",
                  "| " + " | ".join(HEADER) + " |", "|---|---|---|" + "---:|" * (len(HEADER) - 5) + "---|---|"]
        lines += ["| " + " | ".join(row(r)) + " |" for r in recs]
        why = reasons(recs)
        lines += [""] + [f"- {w}" for w in why] + ([""] if why else [])
    summary = summary_lines(isa)
    if summary:
        lines += ["### 1-D vector work vs matrix work", ""] + [f"- {s}" for s in summary]
    for key, title in LOW_PRECISION:
        if isa.get(key):
            lines += ["", f"### {title}", "", isa[key]]
    return lines


# the low-precision sections (`kiln bench --isa --precision int8,bf16`): Markdown tables from kiln/isa/int8.py, bf16.py
LOW_PRECISION = (
    ("int8", "int8: instructions per 8-bit multiply-accumulate, direct vs microkernel (python -m kiln.isa.int8)"),
    ("bf16", "bf16: multiply-accumulates per instruction (python -m kiln.isa.bf16)"))


def table_html(markdown: str) -> str:
    """A Markdown table (header, rule, rows) as an HTML table."""
    e = html.escape
    rows = [[c.strip() for c in ln.strip().strip("|").split("|")] for ln in markdown.splitlines() if ln.strip()]
    head = "".join(f"<th>{e(c)}</th>" for c in rows[0])
    body = "".join("<tr>" + "".join(f"<td>{e(c)}</td>" for c in r) + "</tr>" for r in rows[2:])
    return f'<div class="wide"><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>'


def to_html(isa: dict[str, Any]) -> str:
    e = html.escape
    parts = ["<section><h2>ISA analysis</h2>"] + [f'<p class="note">{e(n)}</p>' for n in (*NOTES, vlen_note(isa))]
    for workload, recs in by_workload(isa).items():
        flops = recs[0].get("flops")
        parts.append(f"<h3>{e(workload)}" + (f" ({flops / 1e9:.3g} GFLOP)" if flops else "") + "</h3>")
        head = "".join(f"<th>{e(h)}</th>" for h in HEADER)
        body = "".join("<tr>" + "".join(f"<td>{e(c)}</td>" for c in row(r)) + "</tr>" for r in recs)
        parts.append(f'<div class="wide"><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>')
        why = reasons(recs)
        if why:
            parts.append("<ul>" + "".join(f'<li class="note">{e(w)}</li>' for w in why) + "</ul>")
    summary = summary_lines(isa)
    if summary:
        parts.append("<h3>1-D vector work vs matrix work</h3><ul>"
                     + "".join(f"<li>{e(s)}</li>" for s in summary) + "</ul>")
    for key, title in LOW_PRECISION:
        if isa.get(key):
            parts.append(f"<h3>{e(title)}</h3>" + table_html(isa[key]))
    return "".join(parts) + "</section>"
