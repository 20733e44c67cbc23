"""Write the README's two charts from a `kiln bench --json` report (the same figures the HTML report embeds).

    python benchmarks/readme_charts.py docs/bench-quick.json docs/bench-quick   # → …-resnet18.png, …-roofline.png
"""
from __future__ import annotations

import base64
import sys

from kiln.bench import plots
from kiln.bench.report import by_workload, load_json


def main(report_path: str, prefix: str, workload: str = "resnet18") -> None:
    report = load_json(report_path)
    groups = by_workload(report.records)
    roof = report.info.get("roofline", {})
    charts = {f"{prefix}-{workload}.png": plots.workload_bars(workload, groups[workload]),
              f"{prefix}-roofline.png": plots.roofline_chart(groups, roof.get("peak_gflops"),
                                                             roof.get("bandwidth_gbs"), roof.get("l3_bandwidth_gbs"))}
    for path, b64 in charts.items():
        if b64 is None:
            raise SystemExit(f"{path}: nothing to draw in {report_path}")
        with open(path, "wb") as f:
            f.write(base64.b64decode(b64))
        print("wrote", path)


if __name__ == "__main__":
    main(*sys.argv[1:])
