"""The strategy plumbing (kiln/strategy.py, kiln/autostrategy.py, `explain --strategy all`, kiln/asm.py):
names are checked, overrides reach the nodes they name, `auto` measures once and caches, and the asm reader
finds the hot loop and classifies it. The strategies' own numerics are in test_strategy_ukernel.py and
test_strategy_library.py."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import kiln
from conftest import rand
from kiln import autostrategy
from kiln.asm import Insn, classify, hot_loop, mix, parse, vector_spills
from kiln.bench.report import strategy_table
from kiln.strategy import check_strategy


def _two_layer_model() -> onnx.ModelProto:
    """x[8, 64] → MatMul(w1) → Relu → MatMul(w2) → y[8, 48], node names mm1, mm2."""
    w1, w2 = rand(64, 96, seed=1), rand(96, 48, seed=2)
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"], name="mm1"),
             helper.make_node("Relu", ["h"], ["hr"], name="relu"),
             helper.make_node("MatMul", ["hr", "w2"], ["y"], name="mm2")]
    g = helper.make_graph(nodes, "two", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 64])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8, 48])],
                          [onnx.numpy_helper.from_array(w1, "w1"), onnx.numpy_helper.from_array(w2, "w2")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _reference(x: np.ndarray) -> np.ndarray:
    m = _two_layer_model()
    w = {t.name: onnx.numpy_helper.to_array(t) for t in m.graph.initializer}
    return np.maximum(x @ w["w1"], 0) @ w["w2"]


def test_check_strategy_names() -> None:
    for ok in ("direct", "ukernel", "library", "auto", "library:mkl", "library:openblas", "library:onednn"):
        assert check_strategy(ok) == ok
    with pytest.raises(ValueError, match="unknown strategy 'fast'.*direct, ukernel"):
        check_strategy("fast")
    with pytest.raises(ValueError, match="library:eigen"):
        check_strategy("library:eigen")
    with pytest.raises(ValueError, match="unknown strategy"):
        kiln.compile(_two_layer_model(), strategy="vectorized", cache=False)


def test_unknown_override_names_the_anchors() -> None:
    with pytest.raises(ValueError, match=r"\['mm3'\].*mm1, mm2"):
        kiln.compile(_two_layer_model(), strategies={"mm3": "direct"}, cache=False)


def test_meta_records_how_each_anchor_was_built() -> None:
    exe = kiln.compile(_two_layer_model(), cache=False, num_threads=2)
    assert exe.meta["strategies"] == {"mm1": "direct", "mm2": "direct"}
    x = rand(8, 64, seed=3)
    np.testing.assert_allclose(exe.run({"x": x})[0], _reference(x), rtol=1e-4, atol=1e-4)


def test_auto_measures_once_then_reads_its_cache(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:  # noqa: ANN001
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path))
    measured: list[str] = []
    real = autostrategy.time_strategy

    def spy(n, s, *a):  # noqa: ANN001, ANN202
        measured.append(f"{n.name}:{s}")
        return real(n, s, *a)
    monkeypatch.setattr(autostrategy, "time_strategy", spy)
    exe = kiln.compile(_two_layer_model(), strategy="auto", cache=False, num_threads=2)
    cands = autostrategy.candidates(kiln.target.host())
    assert len(measured) == 2 * len(cands) and set(exe.meta["strategies"].values()) <= set(cands)
    x = rand(8, 64, seed=4)
    np.testing.assert_allclose(exe.run({"x": x})[0], _reference(x), rtol=1e-4, atol=1e-4)
    measured.clear()
    kiln.compile(_two_layer_model(), strategy="auto", cache=False, num_threads=2)
    assert measured == []  # decisions came from the cache


def test_auto_with_symbolic_dims(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:  # noqa: ANN001
    """A model with a symbolic batch (dynamic_bounds): each anchor is measured in a static single-node build at the
    bound's upper end (6 rows), and the executable takes every batch within the bounds. (It was a TypeError: the
    decision's cache key serialized the symbolic shape.)"""
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path))
    m = _two_layer_model()
    m.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "n"
    m.graph.output[0].type.tensor_type.shape.dim[0].dim_param = "n"
    built: list[tuple[int, ...]] = []
    real = autostrategy.single_node_graph

    def spy(n, s, bounds=None):  # noqa: ANN001, ANN202
        g = real(n, s, bounds)
        built.append(g.inputs[0].shape)
        return g
    monkeypatch.setattr(autostrategy, "single_node_graph", spy)
    exe = kiln.compile(m, strategy="auto", cache=False, num_threads=2, dynamic_bounds={"n": (1, 6)})
    assert set(built) == {(6, 64), (6, 96)}
    assert set(exe.meta["strategies"]) == {"mm1", "mm2"}
    for rows in (1, 5):
        x = rand(rows, 64, seed=rows)
        np.testing.assert_allclose(exe.run({"x": x})[0], _reference(x), rtol=1e-4, atol=1e-4)


def test_auto_refuses_a_target_it_cannot_run() -> None:
    from kiln.frontend.onnx import import_onnx
    from kiln.target import Target
    other = Target("other", "aarch64-unknown-linux-gnu", "generic", "+neon", 128, 32)
    g = import_onnx(_two_layer_model())
    kiln.strategy.assign_strategies(g, "auto")
    with pytest.raises(ValueError, match="measures on the machine it compiles on"):
        autostrategy.choose_strategies(g, other, 1, {}, lambda _: pytest.fail("nothing is built for another target"))


def test_explain_compares_strategies_with_an_instruction_mix() -> None:
    from kiln.explain import compare_strategies
    out = compare_strategies(_two_layer_model(), "mm1", num_threads=1)
    assert "== strategy direct (built: mm1: direct)" in out
    table = out.split("instruction mix of each hot loop")[1].splitlines()
    direct = next(line for line in table if line.startswith("direct"))
    from kiln.target import host
    fma = host().has_fma  # (an SSE-only host multiplies and adds apart: "vector other")
    assert int(direct.split()[1 if fma else 4]) > 0  # the direct GEMM tile's hot loop: vector FMAs (mulps, addps)
    head = next(line for line in table if line.startswith("strategy"))
    assert head.split()[-1] == "spills" and direct.split()[-1] == "0"  # and fits the registers


ASM = """\
kern:
\tmovq\t%rdi, %rax
.LBB0_1:
\tvbroadcastss\t(%rsi,%rcx,4), %zmm2
\tvmovups\t(%rdx), %zmm3
\tvfmadd231ps\t%zmm3, %zmm2, %zmm0
\tvfmadd231ps\t64(%rdx), %zmm2, %zmm1
\taddq\t$1, %rcx
\tcmpq\t%r8, %rcx
\tjne\t.LBB0_1
\tvmovups\t%zmm0, (%rdi)
\tvaddss\t%xmm0, %xmm1, %xmm1
.LBB0_2:
\tincq\t%rax
\tjne\t.LBB0_2
\tretq
"""


def test_asm_hot_loop_and_classes() -> None:
    loop = hot_loop(ASM)
    assert [i.mnemonic for i in loop][0] == "vbroadcastss" and loop[-1].mnemonic == "jne"
    counts = mix(loop)
    assert counts["vector FMA"] == 2 and counts["vector load"] == 2 and counts["branch"] == 1
    assert counts["scalar int"] == 2 and counts["vector store"] == 0
    insns = [x for x in parse(ASM) if not isinstance(x, str)]
    by = {i.text: classify(i) for i in insns}
    assert by["vmovups\t%zmm0, (%rdi)"] == "vector store"
    assert by["vaddss\t%xmm0, %xmm1, %xmm1"] == "scalar FP"
    # the dot products are multiply-accumulates too (an int8 / bf16 kernel's hot loop is chosen by them)
    for mnemonic in ("vpdpbusd", "vpdpwssd", "vdpbf16ps", "vpmaddwd", "vpmaddubsw"):
        assert classify(Insn(mnemonic, "%zmm1, %zmm2, %zmm3")) == "vector FMA", mnemonic
    assert classify(Insn("vpermd", "%zmm1, %zmm2, %zmm3")) == "vector other"


def test_asm_vector_spills() -> None:
    """kiln.asm.vector_spills counts a spill, a reload and a reload folded into an FMA — not a store to memory
    elsewhere, a scalar stack access or a broadcast from the heap."""
    spilled = [Insn("vmovups", "%zmm3, 400(%rsp)"), Insn("vmovups", "-112(%rsp), %zmm1"),
               Insn("vfmadd231ps", "272(%rsp), %zmm19, %zmm17"), Insn("vmovups", "%zmm0, (%rdi)"),
               Insn("movq", "-72(%rsp), %rsi"), Insn("vbroadcastss", "524(%r13,%rdx), %zmm20")]
    assert vector_spills(spilled) == 3
    assert vector_spills(hot_loop(ASM)) == 0


def test_bench_strategy_table() -> None:
    def rec(system: str, strategy: str, ms: float) -> dict:
        return {"workload": "g", "system": system, "strategy": strategy, "ok": True, "median_ms": ms}
    lines = strategy_table([rec("kiln", "direct", 10.0), rec("kiln", "ukernel", 12.0),
                            rec("onnxruntime", "default", 8.0)])
    assert lines[0].startswith("| workload | direct ms | ukernel ms | onnxruntime ms | ukernel ÷ direct")
    assert lines[2] == "| g | 10 | 12 | 8 | 1.20 | 1.25 |"
    assert strategy_table([rec("kiln", "direct", 1.0)]) == []  # one strategy: nothing to compare
