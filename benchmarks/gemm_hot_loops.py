"""Why the GEMM peers differ: llvm-mca on the hot (K) loop of each one's register tile, side by side.

    python benchmarks/gemm_hot_loops.py [--workload gemm_1024] [--cpu sapphirerapids] [--json out.json]

Rows: Kiln's direct emission and ukernel strategy (the busiest matrix kernel of the workload, built for this
host: kiln/isa/analysis.py:analyze_host), Exo's synthesized tiles (the full MR×NR kernel of each ISA schedule,
C from kiln/bench/peers/_exo_gemm.py compiled to assembly with the peer's gcc flags), and BLIS's microkernels
(disassembled from the `blis` wheel's extension: the kernel its CPU dispatch picks on this host, and the
AVX-512 one it does not). Per row: instructions and FMAs per iteration, FLOP per iteration, llvm-mca cycles per
iteration on `--cpu` and FLOP/cycle — the tile's ceiling, before packing, memory and threads (kiln/isa/mca.py
states the caveats: every load hits L1, every branch is predicted). perf's hardware counters are not exposed on
this VM (`perf stat -e instructions true` reports <not supported>), hence the static analysis."""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

TRIPLE = "x86_64-unknown-linux-gnu"


def kiln_rows(workload: Any, cpu: str) -> list[dict[str, Any]]:
    from kiln.isa.analysis import analyze_host
    rows = []
    for strategy in ("direct", "ukernel"):
        rec = analyze_host(workload, strategy, mca_cpu=cpu)
        matrix = [m for m in rec.get("mca", []) if m["role"] == "matrix"]
        if matrix:
            rows.append({"system": f"kiln:{strategy}", **matrix[0]})
        else:
            rows.append({"system": f"kiln:{strategy}", "note": rec.get("reason", "no matrix kernel loop")})
    return rows


def exo_rows(cpu: str) -> list[dict[str, Any]]:
    from kiln.bench.peers import _cc
    from kiln.bench.peers._exo_gemm import ISAS, generate
    from kiln.bench.peers.exo import FLAGS, host_isas
    from kiln.isa.mca import estimate
    rows = []
    for isa in host_isas():
        c, h, names = generate(isa, (ISAS[isa].mr,))
        with tempfile.TemporaryDirectory(prefix="kiln-exo-asm-") as d:
            (Path(d) / "exo_gemm.c").write_text(c)
            (Path(d) / "exo_gemm.h").write_text(h)
            cc = _cc.compiler() or "cc"
            subprocess.run([cc, *FLAGS, *ISAS[isa].cflags, "-S", "-I", d, "-o", f"{d}/exo_gemm.s",
                            f"{d}/exo_gemm.c"], check=True, capture_output=True, text=True)
            asm = (Path(d) / "exo_gemm.s").read_text()
        est = estimate(asm, names[ISAS[isa].mr], TRIPLE, cpu)
        rows.append({"system": f"exo:{isa} ({ISAS[isa].mr}x{ISAS[isa].nr})", **(est.to_dict() if est else {})})
    return rows


_OBJDUMP_LINE = re.compile(r"^\s*([0-9a-f]+):\s+(.*)$")
_TARGET = re.compile(r"\b([0-9a-f]+) <[^>]*>")


def objdump_function(binary: str, symbol: str) -> str:
    """One function of a binary as assembly llvm-mca reads: AT&T text, a label per address, branch targets as
    those labels, wrapped in `.type symbol,@function` / `symbol:` so kiln.isa.mca.functions() finds it."""
    out = subprocess.run(["objdump", "-d", "--no-show-raw-insn", f"--disassemble={symbol}", binary],
                         check=True, capture_output=True, text=True).stdout
    lines = [f"\t.type {symbol},@function", f"{symbol}:"]
    for line in out.splitlines():
        m = _OBJDUMP_LINE.match(line)
        if not m or not m.group(2).strip():
            continue
        insn = _TARGET.sub(lambda t: f".L{t.group(1)}", m.group(2)).strip()
        lines += [f".L{m.group(1)}:", f"\t{insn}"]
    if len(lines) == 2:
        raise KeyError(f"{symbol} not found in {binary}")
    return "\n".join(lines) + "\n"


def blis_rows(cpu: str) -> list[dict[str, Any]]:
    import importlib.util

    from kiln.isa.mca import estimate
    from kiln.library import blis as blis_lib
    spec = importlib.util.find_spec("blis.cy")
    if spec is None or spec.origin is None:
        return [{"system": "blis", "note": "the blis package is not installed"}]
    picked = blis_lib.arch()
    rows = []
    for arch, symbol in (("haswell", "bli_sgemm_haswell_asm_6x16"), ("skx", "bli_sgemm_skx_asm_32x12_l2")):
        est = estimate(objdump_function(spec.origin, symbol), symbol, TRIPLE, cpu)
        used = "used on this host" if arch == picked else f"not used: BLIS {blis_lib.version()} dispatches {picked}"
        rows.append({"system": f"blis:{symbol}", **(est.to_dict() if est else {}), "note": used})
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workload", default="gemm_1024", help="a GEMM workload of kiln.bench.workloads (Kiln's rows)")
    p.add_argument("--cpu", default="sapphirerapids", help="llvm-mca core model")
    p.add_argument("--json", help="write the rows as JSON")
    a = p.parse_args()
    from kiln.bench.workloads import get as get_workload
    rows = kiln_rows(get_workload(a.workload), a.cpu) + exo_rows(a.cpu) + blis_rows(a.cpu)
    print(f"llvm-mca -mcpu={a.cpu}, hot loop of each GEMM register tile (Kiln: {a.workload})\n")
    print("| system | instructions | FMAs | FLOP/iter | cycles/iter | FLOP/cycle | note |")
    print("|---|---:|---:|---:|---:|---:|---|")
    for r in rows:
        if "cycles_per_iteration" not in r:
            print(f"| {r['system']} | | | | | | {r.get('note', '')} |")
            continue
        print(f"| {r['system']} | {r['instructions']} | {r['fmas']} | {r['flops_per_iteration']:.0f} | "
              f"{r['cycles_per_iteration']:.2f} | {r['flops_per_cycle']:.1f} | {r.get('note', '')} |")
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    sys.exit(main())
