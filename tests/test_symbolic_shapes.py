"""Symbolic dimensions from ONNX import through every graph pass (the graph half of dynamic shapes).

The check on whole models: a model with symbolic dims imported once, and the same model imported with its dims
pinned (input_shapes) at several sizes, must give the same graph after the passes — the same nodes, and every
value's shape and every attribute (Reshape's shape, Slice's ends, ...) of the symbolic graph evaluated at those
sizes equal to the static graph's. The static imports are themselves checked against onnxruntime by the op and
model tests; test_symbolic_ops.py checks each op's rule against NumPy."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
import sympy
from onnx import TensorProto, helper, numpy_helper

import kiln.zoo as zoo
from kiln.compiler import _cache_key
from kiln.errors import KilnError, ModelError
from kiln.frontend.onnx import import_onnx
from kiln.graph import symbolic
from kiln.graph.ir import Graph, Node
from kiln.graph.passes import run_graph_passes
from kiln.graph.passes.precision import assign_precision
from kiln.target import host, resolve

seq, batch = symbolic.symbol("seq"), symbolic.symbol("batch")


# -- kiln/graph/symbolic.py ---------------------------------------------------------------------------------------
def test_symbols_normalize_and_evaluate() -> None:
    h = symbolic.symbol("h")
    assert symbolic.symbol("h") is h and h.is_integer and h.is_positive
    assert symbolic.normalize(sympy.Integer(7)) == 7 and type(symbolic.normalize(sympy.Integer(7))) is int
    assert type(symbolic.normalize(np.int64(3))) is int
    assert symbolic.normalize(seq * 2 // 2) == seq and symbolic.normalize(seq + 1 - 1) == seq
    conv = (h - 1) // 2 + 1
    assert symbolic.evaluate(conv, {"h": 224}) == 112 and symbolic.evaluate(conv, {"h": 7}) == 4
    assert symbolic.evaluate(seq * seq, {"seq": 9}) == 81
    assert symbolic.is_static(5) and not symbolic.is_static(seq) and symbolic.is_static((1, 2))
    assert symbolic.free_symbols((batch, seq * 3, 768)) == {"batch", "seq"} and symbolic.free_symbols(4) == set()
    assert symbolic.dim_str(3 * seq) == "3*seq" and symbolic.shape_str((batch, 4)) == "[batch,4]"
    with pytest.raises(ValueError, match="seq"):
        symbolic.evaluate(seq + batch, {"batch": 1})
    with pytest.raises(TypeError, match="not a dimension"):
        symbolic.normalize("seq")


def test_upper_and_lower_over_the_bound_box() -> None:
    h = symbolic.symbol("h")
    bounds = {"h": (3, 224), "seq": (1, 512), "batch": (2, 8)}
    assert (symbolic.lower((h - 1) // 2 + 1, bounds), symbolic.upper((h - 1) // 2 + 1, bounds)) == (2, 112)
    assert (symbolic.lower(3 * seq, bounds), symbolic.upper(3 * seq, bounds)) == (3, 1536)
    assert symbolic.upper(seq * seq, bounds) == 512 * 512 and symbolic.upper(batch * seq, bounds) == 8 * 512
    assert symbolic.lower(batch * seq, bounds) == 2
    assert symbolic.upper(seq) == symbolic.DEFAULT_BOUND  # unbounded: (1, DEFAULT_BOUND)
    assert symbolic.upper(17, bounds) == 17
    with symbolic.using_bounds({"seq": (4, 9)}):
        assert symbolic.upper(seq) == 9 and symbolic.decide(sympy.Gt(seq, 3))
        with pytest.raises(TypeError, match="cannot decide"):
            symbolic.decide(sympy.Gt(seq, 5))
    assert symbolic.decide(sympy.Eq(seq, -1)) is False  # symbols are positive
    assert symbolic.substitute({"shape": (batch, seq, 12), "k": [seq - 1]}, {"batch": 2, "seq": 5}) == \
        {"shape": (2, 5, 12), "k": [4]}


# -- whole models: symbolic vs pinned static imports ---------------------------------------------------------------
def _key(n: Node, seen: dict) -> tuple:
    k = (n.name, n.op)
    seen[k] = seen.get(k, -1) + 1
    return k + (seen[k],)


def _same_attr(dyn: object, static: object, values: dict[str, int]) -> bool:
    if isinstance(static, np.ndarray) or isinstance(static, Graph):
        return True  # packed weights and sub-graphs: equal by construction (same weights)
    return symbolic.substitute(dyn, values) == static


def assert_matches_static(dyn: Graph, static: Graph, values: dict[str, int]) -> int:
    """Every node of the static graph has its twin in the symbolic one (same ONNX node, op, order), whose shapes and
    attributes evaluate at `values` to the static ones; the symbolic graph's extra nodes are only those computed
    from constants alone in run-time shapes (Range, a mask Slice, the position embeddings of a Range), which the
    static import folds."""
    seen_d: dict = {}
    seen_s: dict = {}
    dyn_nodes = {_key(n, seen_d): n for n in dyn.nodes}
    matched = 0
    for n in static.nodes:
        d = dyn_nodes.pop(_key(n, seen_s), None)
        if d is None and n.op == "Gather":
            # one negative index into a symbolic axis (x[:, -1]) imports as a Slice from n − k and a Reshape
            # (importers/shape.py: _gather_symbolic_axis): the Reshape's output is the Gather's
            sl = dyn_nodes.pop(_key(Node("Slice", [], [], {}, n.name), seen_s), None)
            d = dyn_nodes.pop(_key(Node("Reshape", [], [], {}, n.name), seen_s), None)
            assert sl is not None and d is not None and d.inputs[0] is sl.outputs[0], \
                f"{n.name} (Gather) has no twin in the symbolic graph"
            assert symbolic.evaluate_shape(d.outputs[0].shape, values) == n.outputs[0].shape, n.name
            # a graph output made by that Reshape (a view) gets materialize_outputs' copy, which the Gather did not
            for k in [k for k, c in dyn_nodes.items() if c.op == "Identity" and c.inputs[0] is d.outputs[0]
                      and any(v is c.outputs[0] for v in dyn.outputs)]:
                del dyn_nodes[k]
            matched += 1
            continue
        assert d is not None, f"{n.name} ({n.op}) has no twin in the symbolic graph"
        for vd, vs in zip(d.inputs + d.outputs, n.inputs + n.outputs):
            assert symbolic.evaluate_shape(vd.shape, values) == vs.shape, (n.name, str(vd.type), str(vs.type))
        assert set(d.attrs) == set(n.attrs), n.name
        for k in n.attrs:
            assert _same_attr(d.attrs[k], n.attrs[k], values), (n.name, k, d.attrs[k], n.attrs[k])
        matched += 1
    extra = {id(v) for n in dyn_nodes.values() for v in n.outputs}
    for n in dyn_nodes.values():  # computed from constants only (folded in the static graph), in run-time shapes
        assert all(v.const is not None or id(v) in extra for v in n.inputs), f"{n.name} ({n.op}) is only in the " \
            "symbolic graph"
        assert not all(v.type.is_static for v in n.inputs + n.outputs), n.name
    return matched


def assert_no_shape_code(g: Graph) -> None:
    """No node computes a shape at run time: none reads shape values, every int64 node is data (Range, Gather of
    token ids, ...), never Shape arithmetic."""
    for n in g.nodes:
        for v in n.inputs:
            assert v.const is None or not symbolic.is_symbolic_array(v.const), (n.name, n.op)
        if n.outputs[0].dtype == "int64":
            assert n.op in ("Range", "ArgReduce", "MaxPoolIndex", "TopKIndex", "Cast", "Gather"), (n.name, n.op)


def _dims_of(model: onnx.ModelProto) -> dict[str, list]:
    return {i.name: [d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim] for i in model.graph.input}


def check_against_static(model: onnx.ModelProto, sizes: list[dict[str, int]], bounds: dict | None = None,
                         target: str = "host", precision: str = "fp32", options: dict | None = None) -> Graph:
    tgt = host() if target == "host" else resolve(target)
    opts = options or {}
    dyn = run_graph_passes(assign_precision(import_onnx(model, dynamic_bounds=bounds), precision), opts, tgt)
    assert_no_shape_code(dyn)
    for values in sizes:
        pins = {k: tuple(values[d] if isinstance(d, str) else d for d in dims) for k, dims in _dims_of(model).items()}
        static = run_graph_passes(assign_precision(import_onnx(model, input_shapes=pins), precision), opts, tgt)
        assert not static.bounds
        assert assert_matches_static(dyn, static, values) == len(static.nodes)
    return dyn


def test_gpt_decoder_symbolic_import() -> None:
    model = zoo.build("gpt_decoder")
    g = import_onnx(model)
    assert g.bounds == {"batch": (1, symbolic.DEFAULT_BOUND), "seq": (1, symbolic.DEFAULT_BOUND)}
    assert g.inputs[0].shape == (batch, seq) and g.outputs[0].shape == (batch, seq, 1000)
    ranges = [n for n in g.nodes if n.op == "Range"]
    assert len(ranges) == 1 and ranges[0].attrs["limit"] == seq and ranges[0].outputs[0].shape == (seq,)
    masks = [n for n in g.nodes if n.op == "Slice" and n.outputs[0].dtype == "bool"]
    assert masks and all(m.outputs[0].shape == (1, 1, seq, seq) and m.attrs["ends"][2:] == (seq, seq) for m in masks)
    reshapes = [n.attrs["shape"] for n in g.nodes if n.op == "Reshape"]
    assert (batch, seq, 4, 64) in reshapes and (batch, seq, 256) in reshapes
    assert "symbols batch in [1, 512], seq in [1, 512]" in str(g)


def test_gpt_decoder_passes_match_static_at_three_sizes() -> None:
    check_against_static(zoo.build("gpt_decoder"), [{"batch": 1, "seq": 1}, {"batch": 4, "seq": 77},
                                                    {"batch": 2, "seq": 512}])


def test_resnet18_symbolic_batch_matches_static() -> None:
    g = check_against_static(zoo.build("resnet18_dynamic"), [{"batch": 1}, {"batch": 2}, {"batch": 8}],
                             bounds={"batch": (1, 8)})
    ops = {n.op for n in g.nodes}
    assert {"WinogradProduct", "PackedConv", "PackedMatMul"} <= ops  # batch is not in their decisions
    assert g.bounds == {"batch": (1, 8)} and g.inputs[0].shape == (batch, 3, 224, 224)


@pytest.mark.parametrize("target", ["avx2", "sse"])
def test_resnet18_symbolic_batch_other_widths_and_bf16(target: str) -> None:
    check_against_static(zoo.build("resnet18_dynamic"), [{"batch": 3}], bounds={"batch": (1, 8)}, target=target)
    check_against_static(zoo.build("resnet18_dynamic"), [{"batch": 2}], bounds={"batch": (1, 8)},
                         precision="bf16")


@pytest.mark.slow
def test_resnet50_symbolic_batch_matches_static() -> None:
    check_against_static(zoo.build("resnet50_dynamic"), [{"batch": 1}, {"batch": 2}, {"batch": 8}],
                         bounds={"batch": (1, 8)})


@pytest.mark.slow
def test_bert_base_symbolic_batch_and_seq_match_static() -> None:
    g = check_against_static(zoo.build("bert_base_dynamic"), [{"batch": 1, "seq": 1}, {"batch": 4, "seq": 77},
                                                              {"batch": 1, "seq": 512}])
    assert g.inputs[0].shape == (batch, seq, 768)


@pytest.mark.slow
def test_bert_base_dynamic_is_bert_base_with_dim_params() -> None:
    static, dyn = zoo.build("bert_base"), zoo.build("bert_base_dynamic")
    assert _dims_of(dyn) == {"embeddings": ["batch", "seq", 768]}
    assert [n.op_type for n in static.graph.node] == [n.op_type for n in dyn.graph.node]
    assert all(np.array_equal(numpy_helper.to_array(a), numpy_helper.to_array(b))
               for a, b in zip(static.graph.initializer[:4], dyn.graph.initializer[:4]))
    g = import_onnx(dyn, dynamic_bounds={"seq": (1, 384), "batch": (1, 4)})
    assert g.bounds == {"batch": (1, 4), "seq": (1, 384)}
    scores = [n for n in g.nodes if n.name.endswith("attn.scores")]
    assert len(scores) == 12 and scores[0].outputs[0].shape == (batch, 12, seq, seq)


def test_symbolic_spatial_dims_run_every_pass() -> None:
    """A symbolic H×W: blocked layout and packing still apply; Winograd skips those convs (its tile count would
    be a run-time extent)."""
    model = zoo.build("resnet18_dynamic")
    d = model.graph.input[0].type.tensor_type.shape.dim
    d[2].dim_param, d[3].dim_param = "h", "w"
    bounds = {"batch": (1, 2), "h": (32, 96), "w": (32, 96)}
    g = run_graph_passes(import_onnx(model, dynamic_bounds=bounds), {}, host())
    ops = {n.op for n in g.nodes}
    assert "PackedConv" in ops and "WinogradProduct" not in ops
    h = symbolic.symbol("h")
    conv1 = next(n for n in g.nodes if n.name == "conv1")
    assert symbolic.equal(conv1.outputs[0].shape[2], (h - 1) // 2 + 1)
    check_against_static(model, [{"batch": 1, "h": 32, "w": 95}, {"batch": 2, "h": 64, "w": 64}], bounds,
                         options={"winograd": False})  # the static graphs would take Winograd


# -- import: symbols, pins, bounds -------------------------------------------------------------------------------
def _two_input_model(a_dims: list, b_dims: list, op: str = "Add") -> onnx.ModelProto:
    g = helper.make_graph([helper.make_node(op, ["a", "b"], ["y"], name="the_node")], "g",
                          [helper.make_tensor_value_info("a", TensorProto.FLOAT, a_dims),
                           helper.make_tensor_value_info("b", TensorProto.FLOAT, b_dims)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_unnamed_dims_get_fresh_symbols_and_pins_are_static_everywhere() -> None:
    model = _two_input_model(["n", None], ["n", 1])
    model.graph.input[0].type.tensor_type.shape.dim[1].Clear()  # no dim_value, no dim_param
    g = import_onnx(model)
    assert g.inputs[0].shape == (symbolic.symbol("n"), symbolic.symbol("a_dim1"))
    assert set(g.bounds) == {"n", "a_dim1"}
    with pytest.raises(ModelError, match="a_dim1, 4|4, a_dim1"):  # a_dim1 with 4: not provably equal
        import_onnx(_two_input_model(["n", "a_dim1"], ["n", 4]))
    pinned = import_onnx(_two_input_model(["n", 4], ["n", 4]), input_shapes={"a": (3, 4)})
    assert pinned.inputs[1].shape == (3, 4) and pinned.bounds == {}  # the pin of n reaches input b too
    with pytest.raises(ValueError, match="two values"):
        import_onnx(_two_input_model(["n", 4], ["n", 4]), input_shapes={"a": (3, 4), "b": (5, 4)})


@pytest.mark.parametrize("bounds, match", [({"sequence": (1, 8)}, "unknown symbol"), ({"n": (9, 8)}, "lo ≤ hi"),
                                           ({"n": (0, 8)}, "1 ≤ lo"), ({"n": (1.5, 8)}, "two ints")])
def test_bad_bounds_are_value_errors(bounds: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        import_onnx(_two_input_model(["n", 4], ["n", 4]), dynamic_bounds=bounds)


def test_symbol_conflicts_name_node_and_dims() -> None:
    with pytest.raises(ModelError, match=r"the_node.*(n, m|m, n)"):
        import_onnx(_two_input_model(["n", 4], ["m", 4]))
    with pytest.raises(ModelError, match=r"the_node.*MatMul inner dimensions differ: \[2,k\] @ \[j,3\]"):
        import_onnx(_two_input_model([2, "k"], ["j", 3], op="MatMul"))
    with pytest.raises(ModelError, match=r"the_node.*\[n,4\].*\[8,4\]|the_node.*n, 8|the_node.*8, n"):
        import_onnx(_two_input_model(["n", 4], [8, 4]))  # a symbol against a static 8: not provably equal
    g = import_onnx(_two_input_model(["n", 4], [1, 4]))  # n with 1: n
    assert g.outputs[0].shape == (symbolic.symbol("n"), 4)
    g = import_onnx(_two_input_model(["n", 4], [8, 4]), dynamic_bounds={"n": (8, 8)})  # bounds force n == 8
    assert g.outputs[0].shape in ((8, 4), (symbolic.symbol("n"), 4))


def _model(nodes: list, inputs: list, inits: list | None = None, opset: int = 17) -> onnx.ModelProto:
    g = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          inits or [])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def _i64(name: str, v: list) -> onnx.TensorProto:
    return numpy_helper.from_array(np.array(v, dtype=np.int64), name)


X_SEQ = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", "seq", 8])


def test_ops_that_cannot_take_a_symbolic_dim_name_op_node_and_dim() -> None:
    topk = _model([helper.make_node("Shape", ["x"], ["s"], name="shape"),
                   helper.make_node("Gather", ["s", "one"], ["k"], name="k", axis=0),
                   helper.make_node("Unsqueeze", ["k", "zero"], ["k1"], name="k1"),
                   helper.make_node("TopK", ["x", "k1"], ["y", "i"], name="topk", axis=1)],
                  [X_SEQ], [_i64("one", 1), _i64("zero", [0])])
    with pytest.raises(KilnError, match=r"topk.*'K'.*\[seq\].*symbolic.*\['seq'\]"):
        import_onnx(topk)
    w = helper.make_tensor_value_info("w", TensorProto.FLOAT, [4, 8, "k"])
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, "seq"])
    conv = _model([helper.make_node("Conv", ["x", "w"], ["y"], name="conv")], [x, w])
    with pytest.raises(ModelError, match=r"conv.*kernel size \(k\)"):
        import_onnx(conv)
    resize = _model([helper.make_node("Resize", ["x4", "", "scales"], ["y"], name="resize", mode="nearest")],
                    [helper.make_tensor_value_info("x4", TensorProto.FLOAT, [1, 3, "h", 8])],
                    [numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales")])
    with pytest.raises(ModelError, match=r"resize.*Resize.*\['h'\]"):
        import_onnx(resize)


def test_data_dependent_shapes_and_shape_values_used_as_data_are_clear_errors() -> None:
    target = helper.make_tensor_value_info("target", TensorProto.INT64, [3])
    reshape = _model([helper.make_node("Reshape", ["x", "target"], ["y"], name="reshape")], [X_SEQ, target])
    with pytest.raises(KilnError, match=r"reshape.*'shape' \(a graph input\) is computed at run time"):
        import_onnx(reshape)
    as_data = _model([helper.make_node("Shape", ["x"], ["s"], name="shape"),
                      helper.make_node("Gather", ["s", "one"], ["n"], name="seq", axis=0),
                      helper.make_node("Cast", ["n"], ["f"], name="cast", to=TensorProto.FLOAT),
                      helper.make_node("Mul", ["x", "f"], ["y"], name="scale")], [X_SEQ], [_i64("one", 1)])
    with pytest.raises(ModelError, match=r"scale.*shape values computed from symbolic dimensions"):
        import_onnx(as_data)


def test_shape_subgraphs_fold_into_attributes() -> None:
    """torch's exporter idiom: Reshape(x, Concat(Shape(x)[0], Shape(x)[1] * 2, -1)), an Expand to
    Where(Equal(shape, -1), 1, shape), ConstantOfShape of a symbolic shape, a Slice to seq - 1."""
    nodes = [helper.make_node("Shape", ["x"], ["s"], name="shape"),
             helper.make_node("Gather", ["s", "zero_s"], ["b"], name="b", axis=0),
             helper.make_node("Gather", ["s", "one_s"], ["n"], name="n", axis=0),
             helper.make_node("Mul", ["n", "two_s"], ["half"], name="half"),
             helper.make_node("Unsqueeze", ["b", "zero"], ["b1"], name="b1"),
             helper.make_node("Unsqueeze", ["half", "zero"], ["h1"], name="h1"),
             helper.make_node("Concat", ["b1", "h1", "minus1"], ["target"], name="target", axis=0),
             helper.make_node("Reshape", ["x", "target"], ["r"], name="reshape"),
             helper.make_node("Equal", ["s", "minus1"], ["is_neg"], name="is_neg"),
             helper.make_node("Where", ["is_neg", "one", "s"], ["es"], name="es"),
             helper.make_node("ConstantOfShape", ["es"], ["ones"], name="ones",
                              value=numpy_helper.from_array(np.array([1.0], np.float32))),
             helper.make_node("Sub", ["n", "one_s"], ["n1"], name="n1"),
             helper.make_node("Unsqueeze", ["n1", "zero"], ["n1v"], name="n1v"),
             helper.make_node("Slice", ["ones", "zero", "n1v", "one"], ["sl"], name="slice"),
             helper.make_node("Add", ["sl", "sl"], ["y"], name="y")]
    inits = [_i64("zero_s", 0), _i64("one_s", 1), _i64("two_s", 2), _i64("zero", [0]), _i64("one", [1]),
             _i64("minus1", [-1])]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", "seq", 8])
    g = import_onnx(_model(nodes, [x], inits), dynamic_bounds={"seq": (2, 64)})
    b = symbolic.symbol("b")
    by_op = {n.op: n for n in g.nodes}
    assert by_op["Expand"].attrs["shape"] == (b, seq, 8) and by_op["Slice"].attrs["ends"] == (b, seq - 1, 8)
    assert g.outputs[0].shape == (b, seq - 1, 8)
    # the Reshape's target, kept alive as an output
    model = _model(nodes[:8] + [helper.make_node("Identity", ["r"], ["y"], name="y")], [x], inits)
    g = import_onnx(model)
    (reshape,) = [n for n in g.nodes if n.op == "Reshape"]
    assert reshape.attrs["shape"] == (b, 2 * seq, 4)  # the -1 resolved: 8·seq / (2·seq)
    odd = nodes[:3] + [helper.make_node("Div", ["n", "two_s"], ["half"], name="half")] + nodes[4:8] + \
        [helper.make_node("Identity", ["r"], ["y"], name="y")]
    with pytest.raises(ModelError, match=r"reshape.*cannot reshape \[b,seq,8\]"):  # seq // 2 · -1 ≠ seq · 8 (odd seq)
        import_onnx(_model(odd, [x], inits))


def test_gather_of_the_last_token_becomes_a_slice_from_seq_minus_one() -> None:
    model = _model([helper.make_node("Gather", ["x", "last"], ["y"], name="last_token", axis=1)], [X_SEQ],
                   [_i64("last", -1)])
    g = import_onnx(model)
    (sl, rs) = g.nodes
    assert sl.op == "Slice" and sl.attrs["starts"][1] == seq - 1 and sl.attrs["ends"][1] == seq
    assert rs.op == "Reshape" and g.outputs[0].shape == (symbolic.symbol("b"), 8)
    with pytest.raises(KilnError, match="out of range.*lower bound 1"):
        import_onnx(_model([helper.make_node("Gather", ["x", "i"], ["y"], name="g", axis=1)], [X_SEQ],
                           [_i64("i", 3)]))


def test_trilu_on_a_symbolic_square_is_a_sliced_constant_mask() -> None:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["seq", "seq"])
    g = import_onnx(_model([helper.make_node("Trilu", ["x"], ["y"], name="tril", upper=0)], [x]),
                    dynamic_bounds={"seq": (1, 16)})
    sl = next(n for n in g.nodes if n.op == "Slice")
    assert sl.inputs[0].const.shape == (16, 16) and sl.attrs["ends"] == (seq, seq)
    mask = sl.inputs[0].const
    for n in (1, 5, 16):
        np.testing.assert_array_equal(mask[:n, :n], np.tril(np.ones((n, n), bool)))


def test_quantized_model_with_a_symbolic_batch_runs_quantize_qdq() -> None:
    rng = np.random.default_rng(0)
    w = rng.integers(-127, 127, size=(32, 16, 3, 3)).astype(np.int8)
    nodes = [helper.make_node("QuantizeLinear", ["x", "sx", "zx"], ["xq"], name="q"),
             helper.make_node("DequantizeLinear", ["xq", "sx", "zx"], ["xd"], name="dq"),
             helper.make_node("DequantizeLinear", ["w", "sw"], ["wd"], name="dqw"),
             helper.make_node("Conv", ["xd", "wd"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("QuantizeLinear", ["c", "sy", "zy"], ["yq"], name="qy"),
             helper.make_node("DequantizeLinear", ["yq", "sy", "zy"], ["y"], name="dqy")]
    inits = [numpy_helper.from_array(np.array(0.02, np.float32), "sx"),
             numpy_helper.from_array(np.array(128, np.uint8), "zx"),
             numpy_helper.from_array(w, "w"), numpy_helper.from_array(np.array(0.01, np.float32), "sw"),
             numpy_helper.from_array(np.array(0.05, np.float32), "sy"),
             numpy_helper.from_array(np.array(128, np.uint8), "zy")]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 16, 12, 12])
    model = _model(nodes, [x], inits)
    dyn = check_against_static(model, [{"batch": 1}, {"batch": 3}], bounds={"batch": (1, 4)})
    assert any(n.op in ("QConv", "QPackedConv") for n in dyn.nodes)


def test_compile_cache_key_includes_dynamic_bounds() -> None:
    key = lambda b: _cache_key(b"m", host(), 2, {}, None, dynamic_bounds=b)  # noqa: E731
    assert key(None) == key({}) and key({"seq": (1, 512)}) != key({"seq": (1, 384)}) != key(None)


# -- a GPT-style module exported from PyTorch with a dynamic sequence axis ----------------------------------------
def _tiny_gpt():  # noqa: ANN202 - torch.nn.Module
    torch = pytest.importorskip("torch")

    class Block(torch.nn.Module):
        def __init__(self, d: int, heads: int, max_len: int) -> None:
            super().__init__()
            self.heads = heads
            self.ln1, self.ln2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
            self.qkv, self.proj = torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d)
            self.mlp = torch.nn.Sequential(torch.nn.Linear(d, 4 * d), torch.nn.GELU(), torch.nn.Linear(4 * d, d))
            self.register_buffer("mask", torch.tril(torch.ones(max_len, max_len, dtype=torch.bool)))

        def forward(self, x):  # noqa: ANN001, ANN202
            b, t, d = x.shape
            q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
            q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
            att = (q @ k.transpose(-2, -1)) / (d // self.heads) ** 0.5
            att = att.masked_fill(~self.mask[:t, :t], float("-inf")).softmax(-1)
            x = x + self.proj((att @ v).transpose(1, 2).reshape(b, t, d))
            return x + self.mlp(self.ln2(x))

    class TinyGPT(torch.nn.Module):
        def __init__(self, vocab: int = 50, d: int = 32, heads: int = 2, max_len: int = 64) -> None:
            super().__init__()
            self.tok, self.pos = torch.nn.Embedding(vocab, d), torch.nn.Embedding(max_len, d)
            self.blocks = torch.nn.Sequential(Block(d, heads, max_len), Block(d, heads, max_len))
            self.head = torch.nn.Linear(d, vocab)

        def forward(self, ids):  # noqa: ANN001, ANN202
            pos = torch.arange(ids.shape[1], device=ids.device)
            return self.head(self.blocks(self.tok(ids) + self.pos(pos)))

    torch.manual_seed(0)
    return torch, TinyGPT().eval()


@pytest.mark.parametrize("exporter", ["torchscript", pytest.param("dynamo", marks=pytest.mark.slow)])
def test_torch_exported_gpt_imports_to_a_symbolic_graph(tmp_path, exporter: str) -> None:
    torch, module = _tiny_gpt()
    ids = torch.randint(0, 50, (2, 9))
    if exporter == "torchscript":
        path = tmp_path / "gpt.onnx"
        torch.onnx.export(module, (ids,), str(path), input_names=["ids"], output_names=["logits"], opset_version=17,
                          dynamic_axes={"ids": {0: "batch", 1: "seq"}, "logits": {0: "batch", 1: "seq"}},
                          dynamo=False)
        model = onnx.load(str(path))
    else:
        dims = {0: torch.export.Dim("batch", min=1, max=8), 1: torch.export.Dim("seq", min=2, max=64)}
        model = torch.onnx.export(module, (ids,), dynamo=True, dynamic_shapes={"ids": dims}, opset_version=18,
                                  verbose=False).model_proto
        # the position table has 64 rows: past seq = 64 the slice is not decidable — the bound must say so
        with pytest.raises(ModelError, match=r"cannot decide.*seq in \[1, 512\].*dynamic_bounds"):
            import_onnx(model)
    g = import_onnx(model, dynamic_bounds={"seq": (1, 64)})
    assert g.inputs[0].shape == (batch, seq) and g.outputs[0].shape == (batch, seq, 50)
    assert g.bounds == {"batch": (1, symbolic.DEFAULT_BOUND), "seq": (1, 64)}
    check_against_static(model, [{"batch": 1, "seq": 1}, {"batch": 2, "seq": 9}, {"batch": 3, "seq": 64}],
                         bounds={"seq": (1, 64)})


def test_conv1d_over_a_symbolic_length_with_a_folded_pad() -> None:
    """fold_pad (a zero Pad of the length axis into the conv) and conv1d_as_2d (the 1-D conv as a 2-D conv of
    height 1 between Reshape views of [b, c, 1, seq]) on a symbolic sequence length."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Pad", ["x", "pads"], ["p"], name="pad"),
             helper.make_node("Conv", ["p", "w", "bias"], ["c"], name="conv1d", kernel_shape=[3]),
             helper.make_node("Relu", ["c"], ["y"], name="relu")]
    inits = [_i64("pads", [0, 0, 1, 0, 0, 1]), numpy_helper.from_array(rng.standard_normal((32, 16, 3)).astype(
        np.float32), "w"), numpy_helper.from_array(rng.standard_normal(32).astype(np.float32), "bias")]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 16, "seq"])
    model = _model(nodes, [x], inits)
    g = check_against_static(model, [{"batch": 1, "seq": 1}, {"batch": 2, "seq": 37}, {"batch": 3, "seq": 100}],
                             bounds={"seq": (1, 128), "batch": (1, 4)})
    assert "Pad" not in {n.op for n in g.nodes}
    assert g.outputs[0].shape == (batch, 32, seq)
    assert any(n.op in ("Conv", "PackedConv") and len(n.outputs[0].shape) >= 4 for n in g.nodes)


def test_bind_reads_symbols_off_the_fed_shapes_and_refuses_disagreements() -> None:
    """The run-time binder the Executable uses (kiln/runtime/shapes.py: no sympy at run time), on an executable's
    dims as its metadata spells them."""
    from types import SimpleNamespace

    from kiln.runtime.shapes import bind
    specs = [SimpleNamespace(name="ids", shape=("batch", "seq")),
             SimpleNamespace(name="mask", shape=("batch", 1, "seq")),
             SimpleNamespace(name="pos", shape=("(2 * seq)", 4))]
    bounds = {"batch": (1, 4), "seq": (1, 512)}

    def fed(*shapes: tuple[int, ...]) -> list[np.ndarray]:
        return [np.zeros(sh, np.float32) for sh in shapes]
    assert bind(specs, fed((2, 7), (2, 1, 7), (14, 4)), bounds) == {"batch": 2, "seq": 7}
    for shapes, match in [(((2, 7), (2, 1, 8), (14, 4)), r"disagree on the symbolic dim 'seq': 7 in 'ids'"),
                          (((5, 7), (5, 1, 7), (14, 4)), r"'batch' = 5 .*outside the bounds \[1, 4\]"),
                          (((2, 7), (2, 2, 7), (14, 4)), r"'mask' .*dim 1 is fixed at 1"),
                          (((2, 7), (2, 1, 7), (15, 4)), r"'pos' .*dim 0 must be \(2 \* seq\) = 14"),
                          (((2, 7, 1), (2, 1, 7), (14, 4)), r"'ids' has rank 3")]:
        with pytest.raises(ValueError, match=match):
            bind(specs, fed(*shapes), bounds)
