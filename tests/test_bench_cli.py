"""`kiln bench` end to end with a fake system, Kiln as a system (with a fake compiler), and the
roofline kernels (that they compile, run and compute; their speed is not asserted)."""
from __future__ import annotations

import argparse
import json
import types

import numpy as np
import pytest

import kiln
from kiln.bench import cli, roofline
from kiln.bench.kiln_system import KilnSystem, compile_kwargs
from kiln.bench.report import RECORD_KEYS


class MatmulSystem:
    name = "matmul"
    kinds = frozenset({"gemm"})
    strategies = ("plain", "transposed")

    def available(self):
        return True, ""

    def version(self):
        return np.__version__

    def prepare(self, w, threads, strategy="default"):
        a, b = w.inputs["A"], w.gemm.b
        bt = np.ascontiguousarray(b.T)
        return (lambda: [a @ bt.T]) if strategy == "transposed" else (lambda: [a @ b])


def _args(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    cli.add_arguments(p)
    return p.parse_args(list(argv))


def test_cli_run_writes_reports(tmp_path, capsys):
    pytest.importorskip("matplotlib", reason="the bench extra is not installed")
    js, page, md = tmp_path / "r.json", tmp_path / "r.html", tmp_path / "r.md"
    rc = cli.main(["--workloads", "gemm_256", "--systems", "test_bench_cli:MatmulSystem",
                   "--strategy", "matmul=all", "--threads", "1", "--repeat", "2",
                   "--json", str(js), "--html", str(page), "--md", str(md), "--no-roofline",
                   "--quiet"])
    assert rc == 0
    data = json.loads(js.read_text())
    assert data["info"]["threads"] == 1 and data["info"]["workloads"] == ["gemm_256"]
    recs = data["records"]
    assert {r["strategy"] for r in recs} == {"plain", "transposed"}
    assert all(set(RECORD_KEYS) <= set(r) and r["ok"] for r in recs)
    out = capsys.readouterr().out
    assert "## gemm_256" in out and "matmul:transposed" in out
    assert "## gemm_256" in md.read_text()
    assert "<img" in page.read_text()


def test_cli_bad_usage():
    assert cli.main(["--workloads", "nope", "--no-roofline", "--quiet"]) == 2
    assert cli.main(["--strategy", "nonsense", "--no-roofline", "--quiet"]) == 2


def test_strategy_selection():
    sys_ = MatmulSystem()
    every, per = cli.parse_strategies([])
    assert cli.strategies_for(sys_, every, per) == ["plain"]  # a peer: its first
    assert cli.strategies_for(KilnSystem(), every, per) == list(KilnSystem().strategies)
    every, per = cli.parse_strategies(["all"])
    assert cli.strategies_for(sys_, every, per) == ["plain", "transposed"]
    every, per = cli.parse_strategies(["matmul=transposed", "kiln=all"])
    assert cli.strategies_for(sys_, every, per) == ["transposed"]


def test_ablate_uses_pass_options(monkeypatch, capsys):
    args = _args("--systems", "kiln", "--ablate")
    strategies = list(KilnSystem().strategies)  # every strategy this host can build (direct first)
    monkeypatch.delattr(kiln, "PASS_OPTIONS", raising=False)
    assert [c.strategy for c in cli.contestants(args)] == strategies
    assert "PASS_OPTIONS" in capsys.readouterr().err
    monkeypatch.setattr(kiln, "PASS_OPTIONS", ("fusion", "layout"), raising=False)
    got = [c.strategy for c in cli.contestants(args)]
    assert got == strategies + ["ablate:-fusion", "ablate:-layout"]


def test_kiln_system_calls_the_compiler(monkeypatch):
    from kiln.bench import workloads
    seen = {}

    def fake_compile(model, **kwargs):
        seen.update(kwargs)
        b = {t.name: t for t in model.graph.initializer}["B"]
        b = np.frombuffer(b.raw_data, np.float32).reshape(tuple(b.dims))
        return types.SimpleNamespace(run=lambda feeds: [feeds["A"] @ b])

    monkeypatch.setattr(kiln, "compile", fake_compile, raising=False)
    ks = KilnSystem()
    assert ks.available() == (True, "")
    w = workloads.gemm_workload("g", 8, 16, 4)
    out = ks.prepare(w, 3, strategy="ablate:-fusion")()
    assert seen == {"num_threads": 3, "fusion": False}
    np.testing.assert_allclose(out[0], w.gemm.a @ w.gemm.b, rtol=1e-6)
    assert compile_kwargs("direct", 2) == {"num_threads": 2}
    assert compile_kwargs("ukernel", 2) == {"num_threads": 2, "strategy": "ukernel"}
    monkeypatch.delattr(kiln, "compile")
    ok, why = ks.available()
    assert not ok and "compile" in why


def test_roofline_kernels_run():
    pytest.importorskip("llvmlite")
    assert "llvm.fma.v16f32" in roofline.fma_ir(8)
    assert roofline.default_accumulators("+avx2,+avx512f") == 12
    assert roofline.default_accumulators("+avx2,-avx512f") == 6
    assert roofline.default_accumulators("+sse4.2,-avx,-avx2") == 3  # SSE: 3 × 4 xmm of 16
    assert "llvm.fmuladd.v16f32" in roofline.fma_ir(3, fused=False)  # no FMA: a multiply and an add
    r = roofline.measure(1, quick=True)  # the triad checks its own results
    assert r.peak_gflops > 0 and r.bandwidth_gbs > 0 and r.l3_bandwidth_gbs > 0
    info = roofline.machine_info()
    assert info["cpu"] and info["cores"] >= 1
