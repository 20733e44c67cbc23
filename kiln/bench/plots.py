"""The figures of the HTML report, drawn with matplotlib (Agg) and returned as base64 PNG."""
from __future__ import annotations

import base64
import io
from typing import Any

from .report import label

KILN, ORT, OTHER, BAD = "#e66101", "#2c7bb6", "#9e9e9e", "#d7191c"


def _plt() -> Any:
    import matplotlib
    matplotlib.use("Agg")  # no display here; also keeps the backend choice out of users' way
    import matplotlib.pyplot as plt
    return plt


def png_b64(fig: Any) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=96, bbox_inches="tight")
    _plt().close(fig)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _color(rec: dict[str, Any]) -> str:
    return KILN if rec["system"] == "kiln" else ORT if rec["system"] == "onnxruntime" else OTHER


def workload_bars(name: str, recs: list[dict[str, Any]]) -> str | None:
    """Median ms per system (IQR as error bar), fastest on top; wrong systems are not drawn."""
    timed = sorted((r for r in recs if r["median_ms"] and r["ok"]), key=lambda r: r["median_ms"])
    if not timed:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7.5, 0.42 * len(timed) + 1.1))
    ys = range(len(timed))
    ms = [r["median_ms"] for r in timed]
    ax.barh(ys, ms, xerr=[(r["iqr_ms"] or 0) / 2 for r in timed], color=[_color(r) for r in timed],
            capsize=3)
    ax.set_yticks(list(ys), [label(r) for r in timed])
    ax.invert_yaxis()
    for y, r in zip(ys, timed):
        pct = f" · {r['pct_peak']:.0f}% peak" if r.get("pct_peak") else ""
        end = r["median_ms"] + (r["iqr_ms"] or 0) / 2  # right of the error bar
        ax.text(end, y, f"  {r['median_ms']:.3g} ms{pct}", va="center", fontsize=8)
    if max(ms) > 30 * min(ms):  # a very slow system would flatten every other bar: log scale
        ax.set_xscale("log")
        ax.set_xlim(min(ms) / 2, max(ms) * 8)
        ax.set_xlabel("median time per run, ms, log scale (lower is better)")
    else:
        ax.set_xlim(0, max(ms) * 1.45)
        ax.set_xlabel("median time per run, ms (lower is better)")
    ax.set_title(name, fontsize=10)
    return png_b64(fig)


def _best(recs: list[dict[str, Any]], kiln: bool) -> dict[str, Any] | None:
    pool = [r for r in recs if r["ok"] and r["gflops"] and (r["system"] == "kiln") == kiln
            and not str(r.get("strategy", "")).startswith("ablate:")]
    return max(pool, key=lambda r: r["gflops"], default=None)


def roofline_chart(by_wl: dict[str, list[dict[str, Any]]], peak: float | None,
                   bw: float | None, l3_bw: float | None) -> str | None:
    """Workloads placed by arithmetic intensity (FLOP per compulsory byte) under the roofs."""
    points = []
    for name, recs in by_wl.items():
        nbytes, flops = recs[0].get("bytes"), recs[0].get("flops")
        if not nbytes or not flops:
            continue
        points.append((name, flops / nbytes, _best(recs, True), _best(recs, False)))
    if not points:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, 5.2))
    xs = [p[1] for p in points]
    lo, hi = min(xs) / 2, max(xs) * 2
    grid = [lo * (hi / lo) ** (i / 200) for i in range(201)]
    if peak and bw:
        ax.plot(grid, [min(peak, bw * x) for x in grid], color="black", lw=1.5,
                label=f"roof: {peak:.0f} GFLOP/s, DRAM {bw:.0f} GB/s")
    if peak and l3_bw:
        ax.plot(grid, [min(peak, l3_bw * x) for x in grid], color="black", lw=1, ls="--",
                label=f"L3 {l3_bw:.0f} GB/s")
    for i, (name, x, k, p) in enumerate(points):
        if k:
            ax.scatter([x], [k["gflops"]], color=KILN, marker="o", zorder=3,
                       label="kiln (best strategy)" if i == 0 else None)
        if p:
            ax.scatter([x], [p["gflops"]], color=ORT, marker="^", zorder=3,
                       label="best peer" if i == 0 else None)
        top = max([r["gflops"] for r in (k, p) if r] or [peak or 1.0])
        ax.annotate(name, (x, top), fontsize=7, xytext=(3, 3), textcoords="offset points")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity, FLOP per byte of inputs + weights + outputs")
    ax.set_ylabel("GFLOP/s")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # outside: no point hidden
    return png_b64(fig)


def ablation_waterfall(name: str, base_ms: float, steps: list[tuple[str, float]]) -> str:
    """Start at Kiln with everything on; each bar adds what switching one option off costs
    (measured one option at a time, stacked as if the costs added up)."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(max(5.0, 1.1 * len(steps) + 3), 3.8))
    labels, bottoms, heights, colors = ["all on"], [0.0], [base_ms], [KILN]
    texts = [f"{base_ms:.3g}"]
    level = base_ms
    for opt, ms in steps:
        delta = ms - base_ms
        labels.append(f"−{opt}")
        bottoms.append(level if delta >= 0 else level + delta)
        heights.append(abs(delta))
        colors.append(BAD if delta >= 0 else "#1a9641")
        texts.append(f"{delta:+.3g}")
        level += delta
    labels.append("sum (if additive)")
    bottoms.append(0.0)
    heights.append(level)
    colors.append(OTHER)
    texts.append(f"{level:.3g}")
    xs = range(len(labels))
    ax.bar(xs, heights, bottom=bottoms, color=colors)
    for x, b, h, t in zip(xs, bottoms, heights, texts):
        ax.text(x, b + h, t, ha="center", va="bottom", fontsize=7)
    ax.set_xticks(list(xs), labels, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("ms (red: slower without the option)")
    ax.set_title(f"{name}: cost of switching each option off", fontsize=10)
    return png_b64(fig)


def strategy_chart(rows: list[tuple[str, dict[str, float | None]]], columns: list[str]) -> str | None:
    """Grouped bars: GFLOP/s per workload for each strategy column (missing = no bar)."""
    if not rows or not columns or not any(v for _, row in rows for v in row.values()):
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(max(6.0, 0.9 * len(rows) * max(1, len(columns)) / 2 + 2), 4))
    width = 0.8 / len(columns)
    cmap = plt.get_cmap("tab10")
    for j, col in enumerate(columns):
        xs = [i + (j - (len(columns) - 1) / 2) * width for i in range(len(rows))]
        vals = [row.get(col) or 0.0 for _, row in rows]
        ax.bar(xs, vals, width=width, label=col, color=cmap(j % 10))
    ax.set_xticks(range(len(rows)), [r[0] for r in rows], rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("GFLOP/s (higher is better)")
    ax.legend(fontsize=8, ncol=min(4, len(columns)), loc="lower center", bbox_to_anchor=(0.5, 1.0))
    ax.set_ylim(0, max(max((v or 0) for v in row.values()) for _, row in rows) * 1.1 or 1)
    return png_b64(fig)
