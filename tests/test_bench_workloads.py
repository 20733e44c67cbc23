"""The workload catalogue: valid seeded models whose GemmSpec, inputs and FLOPs agree."""
from __future__ import annotations

import numpy as np
import onnx
import pytest

from kiln.bench import workloads as wl


def test_suites_name_known_workloads():
    table = wl.factories()
    for suite, names in wl.SUITES.items():
        assert names and set(names) <= set(table), suite
    assert set(wl.names("quick")) <= set(wl.names("full"))
    assert set(wl.names("kernels")) | set(wl.names("networks")) == set(wl.names("full"))
    with pytest.raises(KeyError):
        wl.names("nope")


@pytest.mark.parametrize("name", list(wl.GEMMS))
def test_gemm_workloads(name):
    w = wl.get(name)
    m, k, n = wl.GEMMS[name]
    g = w.gemm
    assert w.kind == "gemm" and (g.m, g.k, g.n) == (m, k, n)
    assert g.a.shape == (m, k) and g.b.shape == (k, n) and g.a.dtype == g.b.dtype == np.float32
    assert g.a is w.inputs["A"] or np.array_equal(g.a, w.inputs["A"])
    assert w.flops == 2.0 * m * n * k
    model = w.build_model()
    onnx.checker.check_model(model)
    init = {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer}
    assert np.array_equal(init["B"], g.b)


@pytest.mark.parametrize("name", list(wl.CONVS))
def test_conv_workloads(name):
    w = wl.get(name)
    s = wl.CONVS[name]
    model = w.build_model()
    onnx.checker.check_model(model)
    dims = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    assert dims == list(w.inputs["input"].shape) == [1, s.cin, s.hw, s.hw]
    conv = model.graph.node[0]
    assert conv.op_type == "Conv" and len(conv.input) == 3  # with bias
    assert w.kind == "conv" and w.flops == s.flops


def test_seeded_and_matching_onnxruntime():
    ort = pytest.importorskip("onnxruntime")
    a, b = wl.get("gemm_odd"), wl.get("gemm_odd")
    assert np.array_equal(a.inputs["A"], b.inputs["A"])
    assert a.build_model().SerializeToString() == b.build_model().SerializeToString()
    sess = ort.InferenceSession(a.build_model().SerializeToString(),
                                providers=["CPUExecutionProvider"])
    got = sess.run(None, a.inputs)[0]
    want = a.gemm.a.astype(np.float64) @ a.gemm.b.astype(np.float64)
    assert np.max(np.abs(got - want)) / np.max(np.abs(want)) < 1e-5
    conv = wl.get("conv_r50_28_3x3_s2")
    out = ort.InferenceSession(conv.build_model().SerializeToString(),
                               providers=["CPUExecutionProvider"]).run(None, conv.inputs)[0]
    assert out.shape == (1, 128, 28, 28)


def test_zoo_names_are_the_zoo_models():
    zoo = pytest.importorskip("kiln.zoo")
    for name in sorted(wl.ZOO_KERNELS):
        assert wl.get(name).build_model().SerializeToString() == zoo.build(name).SerializeToString()
        assert wl.get(name).flops == pytest.approx(zoo.flops(name))
    w = wl.get("mlp")
    assert w.kind == "network" and w.flops == pytest.approx(zoo.flops("mlp"))
    assert set(w.inputs) == set(zoo.inputs("mlp"))
