"""Robustness (issue 7): malformed models give `kiln.ModelError` / `kiln.UnsupportedOperator` at compile time —
never another exception, a crash of the Python process or a hang. (tests/test_runtime.py has the basic cases:
truncated file, missing file, missing initializer, nodes out of order, opset range, MatMul shape clash.)
Also the `kiln.backend` API itself: prepare/run/run_node, symbolic shapes, float16 edges, devices."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

import kiln
import kiln.backend

F, I64 = TensorProto.FLOAT, TensorProto.INT64


def model_of(nodes, inputs, outputs, inits=(), opset: int = 17) -> onnx.ModelProto:  # noqa: ANN001
    ins = [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs]
    outs = [helper.make_tensor_value_info(n, F, None) for n in outputs]
    inits = [numpy_helper.from_array(np.asarray(a), n) for n, a in inits]
    g = helper.make_graph(nodes, "g", ins, outs, inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def compile_(m: onnx.ModelProto | bytes) -> kiln.Executable:
    return kiln.compile(m, num_threads=1, cache=False)


X = ("x", F, [2, 3, 8, 8])


def one(op: str, inputs=(X,), extra_inputs=(), inits=(), opset: int = 17, n_out: int = 1, **attrs):  # noqa: ANN001, ANN003
    names = [i[0] for i in inputs] + list(extra_inputs)
    node = helper.make_node(op, names, [f"y{i}" for i in range(n_out)], name="bad_node", **attrs)
    return model_of([node], list(inputs), [f"y{i}" for i in range(n_out)], inits, opset)


# -- malformed attributes and inputs: one case each -------------------------------------------------------------
BAD = {
    "softmax axis out of range": one("Softmax", axis=7),
    "gather axis out of range": one("Gather", extra_inputs=["i"], inits=[("i", np.array([0]))], axis=-9),
    "constant gather index out of range": one("Gather", extra_inputs=["i"], inits=[("i", np.array([5]))], axis=1),
    "transpose perm not a permutation": one("Transpose", perm=[0, 0, 1, 2]),
    "conv weight channels": one("Conv", extra_inputs=["w"], inits=[("w", np.ones((4, 2, 3, 3), np.float32))]),
    "conv stride 0": one("Conv", extra_inputs=["w"], inits=[("w", np.ones((4, 3, 3, 3), np.float32))],
                         strides=[0, 1]),
    "pool kernel larger than input": one("MaxPool", kernel_shape=[9, 9]),
    "pool negative pads": one("AveragePool", kernel_shape=[2, 2], pads=[-1, 0, 0, 0]),
    "pool wrong kernel rank": one("MaxPool", kernel_shape=[2]),
    "reshape to the wrong size": one("Reshape", extra_inputs=["s"], inits=[("s", np.array([7, 7]))]),
    "reshape two -1": one("Reshape", extra_inputs=["s"], inits=[("s", np.array([-1, -1]))]),
    "split sizes do not add up": one("Split", extra_inputs=["s"], inits=[("s", np.array([1, 1]))], n_out=2, axis=1),
    "slice step 0": one("Slice", extra_inputs=["a", "b", "c", "d"],
                        inits=[("a", np.array([0])), ("b", np.array([2])), ("c", np.array([1])),
                               ("d", np.array([0]))]),
    "concat rank clash": model_of([helper.make_node("Concat", ["x", "z"], ["y0"], axis=0)],
                                  [X, ("z", F, [2, 3])], ["y0"]),
    "squeeze a non-1 axis": one("Squeeze", extra_inputs=["a"], inits=[("a", np.array([1]))]),
    "unsqueeze axis out of range": one("Unsqueeze", extra_inputs=["a"], inits=[("a", np.array([9]))]),
    "flatten axis out of range": one("Flatten", axis=9),
    "topk k larger than the axis": one("TopK", extra_inputs=["k"], inits=[("k", np.array([99]))], n_out=2),
    "depth_to_space blocksize": one("DepthToSpace", blocksize=2),
    "einsum bad equation": one("Einsum", equation="ij,jk->ik"),
    "resize negative scale": one("Resize", extra_inputs=["", "s"], inits=[("s", np.array([1, 1, -2, 2], np.float32))]),
    "range delta 0": model_of([helper.make_node("Range", ["a", "b", "c"], ["y0"])], [], ["y0"],
                              [("a", np.array(0.0, np.float32)), ("b", np.array(4.0, np.float32)),
                               ("c", np.array(0.0, np.float32))]),
    "huge constant of shape": model_of([helper.make_node("ConstantOfShape", ["s"], ["y0"])], [], ["y0"],
                                       [("s", np.array([1 << 20, 1 << 20], np.int64))]),
    "huge expand": one("Expand", extra_inputs=["s"], inits=[("s", np.array([1 << 16, 1 << 16, 8, 8], np.int64))]),
    "add float32 + int64": model_of([helper.make_node("Add", ["x", "i"], ["y0"])], [X, ("i", I64, [8])], ["y0"]),
    "matmul float32 @ int64": model_of([helper.make_node("MatMul", ["x", "i"], ["y0"])],
                                       [X, ("i", I64, [8, 8])], ["y0"]),
    "where with a float condition": model_of([helper.make_node("Where", ["x", "x", "x"], ["y0"])], [X], ["y0"]),
    "broadcast clash": model_of([helper.make_node("Add", ["x", "z"], ["y0"])], [X, ("z", F, [7])], ["y0"]),
    "missing required input": model_of([helper.make_node("Gather", ["x"], ["y0"])], [X], ["y0"]),
    "missing required attribute": one("LRN"),
    "unknown op": one("NoSuchOp"),
    "graph output never produced": model_of([helper.make_node("Relu", ["x"], ["t"])], [X], ["y0"]),
    "cycle: a node reads its own output": model_of([helper.make_node("Add", ["x", "y0"], ["y0"])], [X], ["y0"]),
    "cycle: two nodes read each other": model_of([helper.make_node("Relu", ["b"], ["a"]),
                                                  helper.make_node("Relu", ["a"], ["b"]),
                                                  helper.make_node("Relu", ["b"], ["y0"])], [X], ["y0"]),
    "no opset": helper.make_model(helper.make_graph([], "g", [], []), opset_imports=[]),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_malformed_model_is_a_clear_error(case: str) -> None:
    with pytest.raises((kiln.ModelError, kiln.UnsupportedOperator)):
        compile_(BAD[case])


def test_errors_name_the_node() -> None:
    with pytest.raises(kiln.KilnError, match="bad_node"):
        compile_(BAD["conv stride 0"])
    with pytest.raises(kiln.UnsupportedOperator) as e:
        compile_(BAD["softmax axis out of range"])
    assert e.value.op_type == "Softmax" and e.value.node_name == "bad_node" and e.value.opset == 17


# -- mangled bytes: every outcome is a model or a Kiln error --------------------------------------------------
def _sample() -> bytes:
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("ReduceMean", ["r"], ["m"], axes=[2, 3], keepdims=0),
             helper.make_node("Gemm", ["m", "fw"], ["y0"], transB=1)]
    inits = [("w", np.full((4, 3, 3, 3), 0.1, np.float32)), ("b", np.zeros(4, np.float32)),
             ("fw", np.ones((5, 4), np.float32))]
    return model_of(nodes, [X], ["y0"], inits, opset=13).SerializeToString()


SAMPLE = _sample()


def _compile_or_kiln_error(blob: bytes) -> None:
    try:
        exe = compile_(blob)
    except (kiln.ModelError, kiln.UnsupportedOperator):
        return
    except ValueError as e:  # a wrong/absent input shape is a ValueError that says what was expected
        assert "input" in str(e), e
        return
    feeds = {s.name: np.zeros(s.shape, s.dtype) for s in exe.inputs}
    for out in exe.run(feeds):
        assert isinstance(out, np.ndarray)


@pytest.mark.parametrize("cut", [1, 2, 5, 17, 40, 100, 200, 333, len(SAMPLE) // 2, len(SAMPLE) - 40,
                                 len(SAMPLE) - 3])
def test_truncated_model_bytes(cut: int) -> None:
    _compile_or_kiln_error(SAMPLE[:cut])


@settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(st.lists(st.tuples(st.integers(0, len(SAMPLE) - 1), st.integers(0, 255)), min_size=1, max_size=4))
def test_corrupted_model_bytes(flips: list[tuple[int, int]]) -> None:
    blob = bytearray(SAMPLE)
    for pos, val in flips:
        blob[pos] = val
    _compile_or_kiln_error(bytes(blob))


def test_garbage_and_empty_bytes() -> None:
    for blob in (b"", b"\x00" * 64, b"\xff" * 64, bytes(range(256)), b"ONNX" * 100):
        with pytest.raises((kiln.ModelError, kiln.UnsupportedOperator)):
            compile_(blob)


# -- the backend API ---------------------------------------------------------------------------------------------
def _dyn_model() -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", F, ["batch", "seq", 4])
    y = helper.make_tensor_value_info("y", F, ["batch", "seq", 4])
    nodes = [helper.make_node("Softmax", ["x"], ["t"], axis=-1), helper.make_node("Shape", ["t"], ["sh"]),
             helper.make_node("Reshape", ["t", "sh"], ["y"])]
    return helper.make_model(helper.make_graph(nodes, "dyn", [x], [y]), opset_imports=[helper.make_opsetid("", 17)])


def test_backend_compiles_a_symbolic_model_once() -> None:
    """Symbolic dims are compiled once (issue 15): no compile per input shape, the Shape → Reshape folded."""
    rep = kiln.backend.prepare(_dyn_model())
    for shape in [(1, 3, 4), (2, 5, 4), (1, 3, 4)]:
        x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
        (y,) = rep.run([x])
        e = np.exp(x - x.max(-1, keepdims=True))
        np.testing.assert_allclose(y, e / e.sum(-1, keepdims=True), rtol=1e-5)
    assert rep.dynamic is not None and rep.compilations == 1 and not rep._executables


def test_backend_run_node_and_run_model() -> None:
    node = helper.make_node("Add", ["a", "b"], ["c"])
    a, b = np.ones((2, 3), np.float32), np.arange(3, dtype=np.float32)
    (c,) = kiln.backend.run_node(node, [a, b])
    np.testing.assert_array_equal(c, a + b)
    (c2,) = kiln.backend.run_model(one("Relu", inputs=[("x", F, [2, 3])]), [a - 2])
    np.testing.assert_array_equal(c2, np.maximum(a - 2, 0))


def test_backend_float16_edges_keep_declared_types() -> None:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT16, [3, 5])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT16, [3, 5])
    m = helper.make_model(helper.make_graph([helper.make_node("Sigmoid", ["x"], ["t"]),
                                             helper.make_node("Mul", ["t", "x"], ["y"])], "h", [x], [y]),
                          opset_imports=[helper.make_opsetid("", 17)])
    xv = np.linspace(-4, 4, 15, dtype=np.float16).reshape(3, 5)
    (yv,) = kiln.backend.prepare(m).run([xv])
    assert yv.dtype == np.float16
    t = (1 / (1 + np.exp(-xv.astype(np.float32)))).astype(np.float16)
    np.testing.assert_array_equal(yv, (t * xv).astype(np.float16))


def test_backend_value_specialized_inputs() -> None:
    """A shape operand fed as a graph input: the executable is specialized on its value."""
    x = helper.make_tensor_value_info("x", F, [2, 6])
    s = helper.make_tensor_value_info("s", I64, [2])
    y = helper.make_tensor_value_info("y", F, None)
    m = helper.make_model(helper.make_graph([helper.make_node("Reshape", ["x", "s"], ["y"])], "r", [x, s], [y]),
                          opset_imports=[helper.make_opsetid("", 17)])
    rep = kiln.backend.prepare(m)
    xv = np.arange(12, dtype=np.float32).reshape(2, 6)
    assert rep.run([xv, np.array([3, 4])])[0].shape == (3, 4)
    assert rep.run([xv, np.array([4, 3])])[0].shape == (4, 3)
    assert kiln.backend.value_specialized_inputs(m) == ["s"]


def test_backend_devices_and_bad_feeds() -> None:
    assert kiln.backend.supports_device("CPU") and not kiln.backend.supports_device("CUDA")
    with pytest.raises(ValueError, match="CPU only"):
        kiln.backend.prepare(one("Relu"), "CUDA")
    rep = kiln.backend.prepare(one("Relu"))
    with pytest.raises(ValueError, match="1 input"):
        rep.run([np.zeros((2, 3, 8, 8), np.float32)] * 2)


def test_supported_ops_is_the_importer_table() -> None:
    from kiln.frontend.importers import IMPORTERS
    assert kiln.backend.SUPPORTED_OPS == sorted(IMPORTERS)
    for op in ("Resize", "GatherElements", "ScatterElements", "CumSum", "TopK", "Trilu", "Einsum", "DepthToSpace",
               "SpaceToDepth", "GroupNormalization", "Range", "NonZero", "Hardmax", "Shrink", "Upsample"):
        assert op in kiln.backend.SUPPORTED_OPS, op
    assert len(kiln.backend.SUPPORTED_OPS) >= 120


# -- a codegen bug found on the way: i1 (bool) once compared as signed in max/min (True = −1 < False) -------------
def test_codegen_bool_max_reduction(monkeypatch: pytest.MonkeyPatch) -> None:
    from kiln.kernel import lower as L

    def plain(n):  # noqa: ANN001, ANN202
        (x,), (y, ax) = n.inputs, L._out(n)
        return L.Lowered([L.Compute(y.name, ax, y.shape, L.reduction(x, ax, n.attrs["axes"], n.attrs["keepdims"],
                                                                      "max"))])
    monkeypatch.setitem(L.LOWERINGS, "Reduce", plain)
    x = helper.make_tensor_value_info("x", TensorProto.BOOL, [2, 3])
    y = helper.make_tensor_value_info("y", TensorProto.BOOL, None)
    m = helper.make_model(helper.make_graph([helper.make_node("ReduceMax", ["x"], ["y"], axes=[1], keepdims=0)],
                                            "b", [x], [y]), opset_imports=[helper.make_opsetid("", 17)])
    xv = np.array([[True, False, False], [False, False, False]])
    (got,) = kiln.compile(m, num_threads=1, cache=False).run({"x": xv})
    np.testing.assert_array_equal(got, xv.any(axis=1))
