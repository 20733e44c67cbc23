"""fuse_gelu (kiln/graph/passes/fuse_gelu.py): erf-GELU written as five elementwise nodes becomes one Gelu node,
which fusion then puts in the producing anchor's epilogue (kernel/build.py). Numerics against onnxruntime on the
unfused model; the rewrite itself checked on the graph and kernels."""
from __future__ import annotations

import math

import numpy as np
import onnx
import pytest
from onnx import helper

import kiln
from conftest import check, make_model, rand, run_ort
from kiln.compiler import lower
from kiln.target import resolve


def mlp(form: str, m: int = 33, k: int = 65, n: int = 129) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """MatMul → Add(bias) → GELU spelled out: "exporter" (x·(erf(x/√2) + 1))·½, "half-first" (x·½)·(erf(x·1/√2)
    + 1) with commuted operands, "leaky" the exporter form whose erf is also a graph output (must stay unfused)."""
    x = rand(m, k)
    consts = {"w": rand(k, n, lo=-0.3, hi=0.3, seed=1), "b": rand(n, seed=2),
              "sqrt2": np.array(math.sqrt(2), np.float32), "rsqrt2": np.array(1 / math.sqrt(2), np.float32),
              "one": np.array(1, np.float32), "half": np.array(0.5, np.float32)}
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Add", ["b", "h"], ["hb"])]
    outs = ["y"]
    if form in ("exporter", "leaky"):
        nodes += [helper.make_node("Div", ["hb", "sqrt2"], ["d"]), helper.make_node("Erf", ["d"], ["e"]),
                  helper.make_node("Add", ["e", "one"], ["e1"]), helper.make_node("Mul", ["hb", "e1"], ["p"]),
                  helper.make_node("Mul", ["p", "half"], ["y"])]
        outs += ["e"] if form == "leaky" else []
    else:
        nodes += [helper.make_node("Mul", ["rsqrt2", "hb"], ["d"]), helper.make_node("Erf", ["d"], ["e"]),
                  helper.make_node("Add", ["one", "e"], ["e1"]), helper.make_node("Mul", ["half", "hb"], ["p"]),
                  helper.make_node("Mul", ["e1", "p"], ["y"])]
    return make_model(nodes, {"x": x}, outs, consts), {"x": x}


@pytest.mark.parametrize("form", ["exporter", "half-first", "leaky"])
def test_gelu_chain(width: str, form: str) -> None:
    model, feeds = mlp(form)
    check(model, feeds, 1e-5, target=width)
    g = lower(model, resolve(width), 2, {}, stop_after="kernels").graph
    ops = [nd.op for nd in g.nodes]
    if form == "leaky":
        assert "Gelu" not in ops and "Erf" in ops
        return
    assert ops.count("Gelu") == 1 and not {"Erf", "Div"} & set(ops), ops
    kernels = lower(model, resolve(width), 2, {}, stop_after="kernels").program.kernels
    assert len(kernels) == 1, [kern.name for kern in kernels]  # MatMul + bias + GELU: one kernel, GELU its epilogue


def test_gelu_switch_off_keeps_the_chain() -> None:
    model, feeds = mlp("exporter")
    exe = kiln.compile(model, num_threads=2, fuse_gelu=False, cache=False)
    np.testing.assert_allclose(exe.run(feeds)[0], run_ort(model, feeds)[0], rtol=1e-5, atol=1e-5)
    assert len(exe.meta["kernels"]) == 2


def test_gelu_epilogue_bf16() -> None:
    """With precision="bf16" the GELU runs on the AMX C block (float32), rounded once for the output: within the
    bf16 bound of the MatMul (K = 65: ≤ 2·2⁻⁸·√65 relative, typically) times GELU's slope (≤ 1.13)."""
    model, feeds = mlp("exporter")
    exe = kiln.compile(model, num_threads=2, precision="bf16", cache=False)
    want = run_ort(model, feeds)[0]
    rel = np.abs(exe.run(feeds)[0] - want).max() / np.abs(want).max()
    assert 0 < rel < 1.13 * 2 * 2.0 ** -8 * math.sqrt(65), rel
    assert len(exe.meta["kernels"]) <= 2 and len(exe.meta["precision"]) == 1
