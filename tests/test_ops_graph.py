"""Operator chains that exercise fusion (Conv → BN → Relu → residual Add → Relu; MatMul → Add → Gelu-erf;
Div → Softmax attention; a decomposed LayerNorm), every pipeline switch, unsupported operators, and a check
that every ONNX operator Kiln imports is covered by a test_ops_* file.

Tolerance: 1e-4 relative (the chains contain convolutions, matrix products and transcendental functions)."""
from __future__ import annotations

import math
import pathlib
import re

import numpy as np
import onnx
import pytest
from onnx import helper

import kiln
from conftest import check, make_model, op_model, rand
from kiln.frontend.importers import IMPORTERS

TOL = 1e-4


def _n(op: str, ins: list[str], outs: list[str], **attrs) -> onnx.NodeProto:  # noqa: ANN003
    return helper.make_node(op, ins, outs, name=f"{op}_{outs[0]}", **attrs)


def resblock(c: int = 16, hw: int = 33) -> tuple[onnx.ModelProto, dict]:
    """Conv → BN → Relu → Conv → BN → Add(x) → Relu: BN folds into Conv, the rest fuses as epilogues.
    Big enough (16×33×33) that its kernels run in parallel by default."""
    x = rand(1, c, hw, hw)
    consts = {}
    nodes = []
    src = "x"
    for i in range(2):
        consts.update({f"w{i}": rand(c, c, 3, 3, lo=-0.3, hi=0.3, seed=10 + i), f"b{i}": rand(c, seed=20 + i),
                       f"g{i}": rand(c, lo=0.5, hi=1.5, seed=30 + i), f"be{i}": rand(c, seed=40 + i),
                       f"m{i}": rand(c, seed=50 + i), f"v{i}": rand(c, lo=0.5, hi=2, seed=60 + i)})
        nodes += [_n("Conv", [src, f"w{i}", f"b{i}"], [f"c{i}"], pads=[1, 1, 1, 1]),
                  _n("BatchNormalization", [f"c{i}", f"g{i}", f"be{i}", f"m{i}", f"v{i}"], [f"n{i}"])]
        if i == 0:
            nodes.append(_n("Relu", ["n0"], ["r0"]))
            src = "r0"
    nodes += [_n("Add", ["n1", "x"], ["s"]), _n("Relu", ["s"], ["y"])]
    return make_model(nodes, {"x": x}, ["y"], consts), {"x": x}


def mlp_gelu(m: int = 33, k: int = 65, n: int = 129) -> tuple[onnx.ModelProto, dict]:
    """MatMul → Add → Gelu as PyTorch exports it (Div √2 → Erf → Add 1 → Mul x → Mul ½)."""
    x = rand(m, k)
    consts = {"w": rand(k, n, lo=-0.3, hi=0.3, seed=1), "b": rand(n, seed=2),
              "sqrt2": np.array(math.sqrt(2), np.float32), "one": np.array(1, np.float32),
              "half": np.array(0.5, np.float32)}
    nodes = [_n("MatMul", ["x", "w"], ["h"]), _n("Add", ["h", "b"], ["hb"]),
             _n("Div", ["hb", "sqrt2"], ["d"]), _n("Erf", ["d"], ["e"]), _n("Add", ["e", "one"], ["e1"]),
             _n("Mul", ["hb", "e1"], ["p"]), _n("Mul", ["p", "half"], ["y"])]
    return make_model(nodes, {"x": x}, ["y"], consts), {"x": x}


def attention(b: int = 2, s: int = 17, d: int = 33) -> tuple[onnx.ModelProto, dict]:
    """softmax(Q Kᵀ / √d) V, with the scale as a Div before the Softmax."""
    q, k, v = rand(b, s, d, seed=1), rand(b, s, d, seed=2), rand(b, s, d, seed=3)
    nodes = [_n("Transpose", ["k"], ["kt"], perm=[0, 2, 1]), _n("MatMul", ["q", "kt"], ["qk"]),
             _n("Div", ["qk", "scale"], ["logits"]), _n("Softmax", ["logits"], ["p"], axis=-1),
             _n("MatMul", ["p", "v"], ["y"])]
    feeds = {"q": q, "k": k, "v": v}
    return make_model(nodes, feeds, ["y"], {"scale": np.array(math.sqrt(d), np.float32)}), feeds


def layernorm_decomposed(rows: int = 17, d: int = 65) -> tuple[onnx.ModelProto, dict]:
    """LayerNorm as older exporters write it: ReduceMean, Sub, Pow, ReduceMean, Add ε, Sqrt, Div, Mul γ,
    Add β."""
    x = rand(2, rows, d, lo=-2, hi=4)
    consts = {"two": np.array(2, np.float32), "eps": np.array(1e-5, np.float32),
              "g": rand(d, lo=0.5, hi=1.5, seed=1), "be": rand(d, seed=2)}
    nodes = [_n("ReduceMean", ["x"], ["mu"], axes=[-1]), _n("Sub", ["x", "mu"], ["xc"]),
             _n("Pow", ["xc", "two"], ["sq"]), _n("ReduceMean", ["sq"], ["var"], axes=[-1]),
             _n("Add", ["var", "eps"], ["ve"]), _n("Sqrt", ["ve"], ["sd"]), _n("Div", ["xc", "sd"], ["xn"]),
             _n("Mul", ["xn", "g"], ["xg"]), _n("Add", ["xg", "be"], ["y"])]
    return make_model(nodes, {"x": x}, ["y"], consts), {"x": x}


def multi_output() -> tuple[onnx.ModelProto, dict]:
    """An intermediate that is also a graph output, read by two consumers; a Reshape view as an output."""
    x = rand(3, 17)
    nodes = [_n("Sigmoid", ["x"], ["s"]), _n("Mul", ["x", "s"], ["silu"]), _n("Exp", ["s"], ["e"]),
             _n("Reshape", ["silu", "shape"], ["flat"]), _n("Add", ["e", "silu"], ["y"])]
    return make_model(nodes, {"x": x}, ["y", "s", "flat"], {"shape": np.array([-1], np.int64)}), {"x": x}


def mixed_fusion() -> tuple[onnx.ModelProto, dict]:
    """Producers inlined at broadcast, transposed, strided, padded and concatenated indices."""
    a, b = rand(1, 17), rand(5, 17, seed=1)
    nodes = [_n("Sigmoid", ["a"], ["sa"]), _n("Mul", ["sa", "b"], ["m"]),       # (1,17)·(5,17) → (5,17)
             _n("Transpose", ["m"], ["mt"]), _n("Tanh", ["mt"], ["t"]),          # (17,5)
             _n("Slice", ["t", "zero", "n17", "zero", "two"], ["s"]),            # rows 0, 2, … → (9,5)
             _n("Pad", ["s", "pads"], ["p"], mode="edge"),                        # (10,8)
             _n("Exp", ["b"], ["eb"]), _n("Slice", ["eb", "zero", "n10", "one"], ["ebs"]),  # (5,10)
             _n("Transpose", ["ebs"], ["ebt"]), _n("Pad", ["ebt", "pads0"], ["ebp"]),       # (10,8)
             _n("Sub", ["p", "ebp"], ["d"]), _n("Concat", ["d", "p"], ["c"], axis=0),      # (20,8)
             _n("Relu", ["c"], ["r"]), _n("ReduceMax", ["r"], ["mx"], axes=[1], keepdims=1),
             _n("Div", ["r", "mx"], ["y"])]
    i64 = {k: np.array(v, np.int64) for k, v in {"zero": [0], "one": [1], "two": [2], "n10": [10],
                                                "n17": [17], "pads": [1, 0, 0, 3],
                                                "pads0": [0, 0, 0, 3]}.items()}
    return make_model(nodes, {"a": a, "b": b}, ["y"], i64, 13), {"a": a, "b": b}


CHAINS = {"resblock": resblock, "mlp_gelu": mlp_gelu, "attention": attention,
          "layernorm_decomposed": layernorm_decomposed, "multi_output": multi_output,
          "mixed_fusion": mixed_fusion}


@pytest.mark.parametrize("name", list(CHAINS))
def test_chain(name: str) -> None:
    model, feeds = CHAINS[name]()
    check(model, feeds, rtol=TOL)


def test_resblock_folds_batchnorm_and_fuses() -> None:
    """The default pipeline removes both BatchNorms and leaves one kernel per Conv (epilogues inlined)."""
    from kiln.compiler import lower
    from kiln.target import host
    model, _ = resblock(c=4, hw=9)
    c = lower(model, host(), 2, {}, stop_after="kernels")
    assert not [n for n in c.graph.nodes if n.op == "BatchNormalization"]
    assert len(c.program.kernels) == 2, [k.name for k in c.program.kernels]


OPTIONS = [{"vectorize": False}, {"parallel": False}, {"fusion": False}, {"fold_batchnorm": False},
           {"num_threads": 1}, {"fold_constants": False}, {"fuse_elementwise": False},
           {"fuse_epilogue": False}, {"memory_reuse": False},
           {"vectorize": False, "parallel": False, "fusion": False, "num_threads": 1}]


@pytest.mark.parametrize("options", OPTIONS, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()))
@pytest.mark.parametrize("name", list(CHAINS))
def test_chain_with_pipeline_switches(name: str, options: dict) -> None:
    model, feeds = CHAINS[name]()
    check(model, feeds, rtol=TOL, **options)


SWITCH_OPS = [  # single ops whose schedules differ most with vectorization / parallelism / fusion
    ("Conv", [rand(1, 8, 33, 33), rand(9, 8, 3, 3, seed=1)], {"pads": [1, 0, 1, 2], "strides": [1, 2]}),
    ("MaxPool", [rand(1, 16, 65, 65)],
     {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "ceil_mode": 1, "strides": [2, 2]}),
    ("Softmax", [rand(33, 1025)], {"axis": 1}),
    ("Transpose", [rand(4, 33, 257)], {"perm": [2, 0, 1]}),
    ("Gather", [rand(100, 257), np.array([[5, -1, 99, 0]] * 33, np.int64)], {"axis": 0}),
]


@pytest.mark.parametrize("options", OPTIONS[:5], ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()))
@pytest.mark.parametrize("op,args,attrs", SWITCH_OPS, ids=[s[0] for s in SWITCH_OPS])
def test_ops_with_pipeline_switches(op: str, args: list, attrs: dict, options: dict) -> None:
    model, feeds = op_model(op, args, attrs)
    check(model, feeds, rtol=TOL, **options)


# -- what Kiln refuses, and how ------------------------------------------------------------------------------
@pytest.mark.parametrize("op,args,attrs,n_out", [
    ("NonZero", [rand(3, 4)], {}, 1),                                   # data-dependent output shape
    ("TopK", [rand(3, 4), np.array([2], np.int64)], {}, 2),
    ("Resize", [rand(1, 1, 4, 4), None, np.array([1, 1, 2, 2], np.float32)], {}, 1),
    ("Unique", [rand(3, 4)], {}, 1),                                     # data-dependent output shape
    ("CumSum", [rand(3, 4), np.array(1, np.int64)], {}, 1),
], ids=lambda v: v if isinstance(v, str) else "")
def test_unsupported_operator_names_the_op(op: str, args: list, attrs: dict, n_out: int) -> None:
    model, _ = op_model(op, args, attrs, n_out=n_out)
    with pytest.raises(kiln.UnsupportedOperator) as info:
        kiln.compile(model, num_threads=2, cache=False)
    assert info.value.op_type == op and op in str(info.value) and info.value.node_name


def test_unsupported_domain() -> None:
    x = rand(3, 4)
    node = helper.make_node("FusedMatMul", ["x", "x"], ["y"], domain="com.microsoft", name="fused")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", 1, [3, 4])],
                              [helper.make_tensor_value_info("y", 1, None)])
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    model = helper.make_model(graph, opset_imports=opsets)
    with pytest.raises(kiln.UnsupportedOperator, match="FusedMatMul"):
        kiln.compile(model, num_threads=2, cache=False)
    _ = x


def test_dropout_training_mode_is_unsupported() -> None:
    from conftest import C, expect_unsupported
    expect_unsupported("Dropout", [rand(3, 5), C(np.array(0.5, np.float32)), C(np.array(True))],
                       match="training")


def test_constant_folded_unknown_op_uses_reference() -> None:
    """An op Kiln has no importer for, with constant inputs only, is evaluated at import (onnx.reference)."""
    from conftest import C
    x = rand(3, 4)
    model, feeds = op_model("CumSum", [C(rand(3, 4)), C(np.array(1, np.int64))])
    nodes = list(model.graph.node) + [_n("Add", ["y0", "x"], ["z"])]
    consts = {i.name: onnx.numpy_helper.to_array(i) for i in model.graph.initializer}
    check(make_model(nodes, {"x": x}, ["z"], consts), {"x": x}, rtol=1e-5)


# -- coverage ------------------------------------------------------------------------------------------------
def test_every_imported_operator_has_a_test() -> None:
    here = pathlib.Path(__file__).parent
    files = sorted(here.glob("test_ops*.py")) + [here / "test_backend_ops.py"]
    text = "\n".join(p.read_text() for p in files)
    quoted = set(re.findall(r'"([A-Z][A-Za-z0-9]+)"', text))
    missing = sorted(set(IMPORTERS) - quoted)
    assert not missing, f"operators with an importer but no test in test_ops_*/test_backend_ops: {missing}"


@pytest.mark.parametrize("each", ["1", "0"])
def test_a_pass_that_breaks_the_graph_is_caught(each: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Graph.verify after every pass with $KILN_VERIFY_EACH_PASS=1 (the suite's default: the error names the
    pass), else once after the last pass — still a ModelError, never a silently wrong graph."""
    from kiln.errors import ModelError
    from kiln.frontend.onnx import import_onnx
    from kiln.graph import passes
    from kiln.target import host

    def scramble_order(g):  # noqa: ANN001, ANN202 — a broken pass: consumers before their producers
        g.nodes.reverse()
        return g
    model = helper.make_model(helper.make_graph(
        [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Neg", ["a"], ["y"])], "g",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [4])]),
        opset_imports=[helper.make_opsetid("", 17)])
    monkeypatch.setenv("KILN_VERIFY_EACH_PASS", each)
    monkeypatch.setattr(passes, "GRAPH_PASSES", [passes.GRAPH_PASSES[1], ("scramble", scramble_order),
                                                 *passes.GRAPH_PASSES[2:]])
    where = "scramble_order" if each == "1" else r"the graph passes \(the last: materialize_outputs"
    with pytest.raises(ModelError, match=rf"after {where}.*Neg.*reads %\S*, which is not defined before it"):
        passes.run_graph_passes(import_onnx(model), {}, host())
