"""Reports of kiln bench: record keys, JSON, Markdown, and the HTML page as Chromium renders it."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from kiln.bench.htmlreport import write_html
from kiln.bench.report import (
    RECORD_KEYS,
    RunReport,
    load_json,
    make_record,
    to_markdown,
    write_json,
)

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
PEAK = 230.0


def _rec(workload: str, system: str, ms: float | None, strategy: str = "default", ok: bool = True,
         **extra: object) -> dict:
    flops = {"gemm_1024": 2.0 * 1024**3, "conv_dw": 8.1e6, "resnet18": 3.63e9}[workload]
    kind = {"gemm_1024": "gemm", "conv_dw": "conv", "resnet18": "network"}[workload]
    nbytes = {"gemm_1024": 12.6e6, "conv_dw": 3.6e6, "resnet18": 47e6}[workload]
    extra.setdefault("status", "ok" if ok else "wrong")
    return make_record(workload, system, strategy, 2, "1.0", median_ms=ms,
                       iqr_ms=None if ms is None else ms * 0.05, flops=flops, peak_gflops=PEAK,
                       compile_s=0.5, ok=ok, max_rel_err=1e-6 if ok else 0.3, kind=kind,
                       bytes=nbytes, **extra)


def sample_report() -> RunReport:
    recs = [
        _rec("gemm_1024", "kiln", 11.0, "direct"),
        _rec("gemm_1024", "kiln", 10.0, "ukernel"),
        _rec("gemm_1024", "onnxruntime", 10.8),
        _rec("gemm_1024", "iree", 9.95, "data-tiling+ukernel"),
        _rec("gemm_1024", "iree", 10.6, "data-tiling"),
        _rec("gemm_1024", "tvm", None, ok=False, status="crashed", reason="worker died (SIGSEGV)"),
        _rec("gemm_1024", "kiln", 14.0, "ablate:-fusion"),
        _rec("gemm_1024", "kiln", 19.0, "ablate:-layout"),
        _rec("conv_dw", "kiln", 0.3, "direct"),
        _rec("conv_dw", "onnxruntime", 0.24),
        _rec("conv_dw", "jax", None, ok=False, reason="max relative error 0.3 > 0.001"),
        _rec("resnet18", "kiln", None, "direct", ok=False, status="error",
             reason="NotImplementedError: op Resize"),
        _rec("resnet18", "onnxruntime", 17.7),
        _rec("resnet18", "openvino", 16.1),
        _rec("resnet18", "xla", None, ok=False, status="unavailable", reason="cannot import jax"),
    ]
    info = {"date": "2026-11-21T10:00:00+00:00", "suite": "quick", "threads": 2,
            "machine": {"cpu": "znver4", "model": "AMD EPYC", "cores": 2, "features": ["avx512f"]},
            "roofline": {"peak_gflops": PEAK, "peak_gflops_1t": 117.0, "bandwidth_gbs": 40.0,
                         "l3_bandwidth_gbs": 150.0, "threads": 2}}
    return RunReport(info=info, records=recs)


def test_record_has_exactly_the_keys():
    rec = make_record("w", "s", "default", 2, "v")
    assert tuple(rec) == RECORD_KEYS
    rec = _rec("gemm_1024", "kiln", 10.0, "direct")
    assert set(RECORD_KEYS) <= set(rec)
    assert rec["gflops"] == pytest.approx(2.0 * 1024**3 / 10e-3 / 1e9)
    assert rec["pct_peak"] == pytest.approx(100 * rec["gflops"] / PEAK)


def test_json_round_trip(tmp_path):
    rep = sample_report()
    rep.records.append(make_record("conv_dw", "nan", "default", 2, "", ok=False,
                                   max_rel_err=float("inf"), status="wrong"))
    path = tmp_path / "run.json"
    write_json(rep, path)
    data = json.loads(path.read_text())  # strict JSON: inf became null
    assert set(data) == {"info", "records"}
    for rec in data["records"]:
        assert set(RECORD_KEYS) <= set(rec)
    back = load_json(path)
    assert back.records[0]["system"] == "kiln" and back.peak_gflops == PEAK
    assert back.records[-1]["max_rel_err"] is None


def test_markdown_sorted_with_ratios():
    md = to_markdown(sample_report())
    section = md.split("## gemm_1024")[1].split("## ")[0]
    rows = [ln for ln in section.splitlines() if ln.startswith("| ") and "---" not in ln][1:]
    names = [r.split("|")[1].strip() for r in rows]
    assert names[:3] == ["iree:data-tiling+ukernel", "kiln:ukernel", "iree:data-tiling"]
    assert names[-1] == "tvm"  # not timed: last
    ort_row = next(r for r in rows if r.startswith("| onnxruntime "))
    cells = [c.strip() for c in ort_row.split("|")]
    assert cells[3] == f"{10.8 / 11.0:.2f}"  # ÷ kiln uses kiln's direct strategy
    assert cells[4] == "1.00"
    assert "CRASHED" in section and "SIGSEGV" in section
    assert "WRONG" in md.split("## conv_dw")[1]
    assert "xla" not in md.split("## resnet18")[1].split("\n\n")[1]  # unavailable: only a note


def _chromium(args: list[str], tmp: Path) -> subprocess.CompletedProcess:
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
           "--no-first-run", "--disable-background-networking", "--disable-component-update",
           "--disable-sync", "--disable-dev-shm-usage", f"--user-data-dir={tmp / 'profile'}", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "HOME": str(tmp)})


# Runs in the page, writes what it measured into the DOM that --dump-dom prints.
PROBE = """<script>
window.addEventListener('load', () => {
  const imgs = [...document.images].map(i => [i.naturalWidth, i.naturalHeight, i.width, i.height]);
  const tables = [...document.querySelectorAll('table')].map(t => [t.rows.length, t.offsetWidth]);
  const out = document.createElement('pre');
  out.id = 'probe';
  out.textContent = JSON.stringify({imgs, tables});
  document.body.appendChild(out);
});
</script></body>"""


@pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed (apt-get install chromium)")
def test_html_renders_in_chromium(tmp_path):
    pytest.importorskip("matplotlib", reason="the bench extra is not installed")
    page = tmp_path / "report.html"
    write_html(sample_report(), page)
    text = page.read_text()
    assert "http://" not in text and "https://" not in text  # self-contained
    for needle in ("Roofline", "Ablations", "Microkernel vs direct emission",
                   "kiln:library</b>: no records yet", "230.0 GFLOP/s"):
        assert needle in text, needle
    probed = tmp_path / "probed.html"
    probed.write_text(text.replace("</body>", PROBE))
    res = _chromium(["--virtual-time-budget=5000", "--dump-dom", probed.as_uri()], tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    dom = res.stdout
    probe = json.loads(dom.split('<pre id="probe">')[1].split("</pre>")[0])
    # per-workload bars (3) + roofline + strategies + one ablation waterfall
    assert len(probe["imgs"]) >= 6
    for nat_w, nat_h, w, h in probe["imgs"]:
        assert nat_w > 50 and nat_h > 50 and w > 50 and h > 50
    assert len(probe["tables"]) >= 6
    assert all(rows >= 2 and width > 100 for rows, width in probe["tables"])
    shot = tmp_path / "shot.png"
    res = _chromium(["--window-size=1200,2400", f"--screenshot={shot}", page.as_uri()], tmp_path)
    assert res.returncode == 0 and shot.stat().st_size > 10_000


def test_markdown_groups_columns_by_how_kernels_are_built():
    """The strategy section places BLIS/XNNPACK beside Kiln's ukernel, Exo as synthesized, MKL with libraries;
    the systems that are never run are listed with their reasons."""
    recs = [
        _rec("gemm_1024", "kiln", 11.0, "direct", approach="direct emission"),
        _rec("gemm_1024", "kiln", 10.0, "ukernel", approach="hand-written microkernels"),
        _rec("gemm_1024", "blis", 12.5, approach="hand-written microkernels"),
        _rec("gemm_1024", "xnnpack", 9.0, approach="hand-written microkernels"),
        _rec("gemm_1024", "exo", 13.2, "avx512", approach="synthesized kernels"),
        _rec("gemm_1024", "mkl", 8.8, approach="vendor libraries"),
        _rec("gemm_1024", "halide", None, "hand", ok=False, approach="scheduled kernels (DSL)"),
    ]
    info = {**sample_report().info, "not_run": {"tensorrt": "GPU-only (NVIDIA CUDA)"}}
    md = to_markdown(RunReport(info=info, records=recs))
    section = md.split("## How the kernels are built")[1].split("\n## ")[0]
    header = next(line for line in section.splitlines() if line.startswith("| workload"))
    assert header.split(" | ")[1:4] == ["direct emission", "hand-written microkernels", "synthesized kernels"]
    assert "scheduled kernels (DSL)" not in header   # no column that ran nothing
    row = next(line for line in section.splitlines() if line.startswith("| gemm_1024"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[1:4] == ["kiln:direct 11", "xnnpack 9, kiln:ukernel 10, blis 12.5", "exo:avx512 13.2"]
    assert cells[-3:] == ["0.82", "1.20", "0.80"]   # best of each group ÷ kiln:direct (9/11, 13.2/11, 8.8/11)
    assert "## Systems not run here" in md and "- tensorrt: GPU-only (NVIDIA CUDA)" in md


def test_markdown_splits_times_by_host_state_when_both_were_seen():
    """A run that saw the vCPUs on one L3 and on two gets a table of each system's median in each state."""
    from kiln.bench.report import host_state_table, label
    rep = sample_report()
    rep.records[0]["host_states"] = {"one L3": {"median_ms": 9.5, "samples": 30},
                                     "two L3s": {"median_ms": 12.25, "samples": 10}}
    rows = host_state_table(rep.records)
    assert any("| 9.5 (30) | 12.25 (10) |" in r and label(rep.records[0]) in r for r in rows), rows
    assert "## By host state" in to_markdown(rep)
    from kiln.bench.htmlreport import render_html
    page = render_html(rep)
    assert "<h2>By host state</h2>" in page and "<td>9.5 (30)</td><td>12.25 (10)</td>" in page
    rep.records[0]["host_states"] = {"one L3": {"median_ms": 9.5, "samples": 40}}
    assert host_state_table(rep.records) == [] and "## By host state" not in to_markdown(rep)
