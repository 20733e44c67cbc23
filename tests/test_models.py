"""Whole models against onnxruntime: every zoo model and the nine real architectures that ship inside
the onnx package (backend/test/data/light), the latter also against their shipped expected outputs and
with random weights of the same shapes (their own weights are all 0.02, which a wrong compiler can match)."""
from __future__ import annotations

import os

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

import kiln
from conftest import emit_only, width_runs
from kiln import zoo
from kiln.target import resolve

LIGHT = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")
LIGHT_MODELS = sorted(f[:-5] for f in os.listdir(LIGHT) if f.endswith(".onnx")) if os.path.isdir(LIGHT) else []
RTOL = 1e-3  # max|kiln − ref| ≤ RTOL · max|ref| (the bar; typical errors are ~1e-6)


def ort_run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    so.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, feeds)


def rel_err(out: np.ndarray, ref: np.ndarray) -> float:
    return float(np.abs(out.astype(np.float64) - ref).max() / max(np.abs(ref).max(), 1e-30))


@pytest.mark.parametrize("name", zoo.names())
def test_zoo_model_matches_onnxruntime(name: str) -> None:
    model, feeds = zoo.build(name), zoo.inputs(name)
    exe = kiln.compile(model, num_threads=2, cache=False)
    outs = exe.run(feeds)
    refs = ort_run(model, feeds)
    assert len(outs) == len(refs)
    for o, r in zip(outs, refs):
        assert o.shape == r.shape and o.dtype == r.dtype
        assert np.isfinite(o).all()
        assert rel_err(o, r) <= RTOL, f"{name}: rel err {rel_err(o, r):.3g}"


def _randomize(model: onnx.ModelProto, seed: int = 0) -> onnx.ModelProto:
    """Same architecture, random weights: replace every ConstantOfShape(0.02) by a random initializer."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    rng = np.random.default_rng(seed)
    shapes = {init.name: numpy_helper.to_array(init) for init in m.graph.initializer}
    nodes = []
    for n in m.graph.node:
        if n.op_type == "ConstantOfShape" and n.input[0] in shapes:
            shape = tuple(int(d) for d in shapes[n.input[0]])
            fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else max(shape[0], 1)
            arr = (rng.standard_normal(shape) * np.sqrt(2.0 / max(fan_in, 1))).astype(np.float32)
            if len(shape) == 1:  # BN scale/var must stay positive
                arr = (1.0 + 0.1 * np.abs(arr)).astype(np.float32)
            m.graph.initializer.append(numpy_helper.from_array(arr, n.output[0]))
        else:
            nodes.append(n)
    if nodes[-1].op_type == "Softmax":  # compare logits, not probabilities
        logits = nodes.pop().input[0]
        out = m.graph.output[0]
        out.name = logits
        out.type.tensor_type.ClearField("shape")
    del m.graph.node[:]
    m.graph.node.extend(nodes)
    return m


@pytest.mark.skipif(not LIGHT_MODELS, reason="onnx package ships no backend/test/data/light models")
@pytest.mark.parametrize("name", LIGHT_MODELS)
def test_light_model(name: str, width: str) -> None:
    """Per x86 width: the random-weight model against onnxruntime (emitted only for a width this CPU cannot run);
    at the host's own width also the shipped weights against the shipped expected output."""
    model = onnx.load(os.path.join(LIGHT, name + ".onnx"))
    rnd = _randomize(model)
    if not width_runs(width):
        emit_only(rnd, width)
        return
    inits = {i.name for i in model.graph.initializer}
    data = next(i for i in model.graph.input if i.name not in inits)  # opset-9 models list weights as inputs too
    x_shape = [d.dim_value for d in data.type.tensor_type.shape.dim]
    x = np.random.default_rng(0).standard_normal(x_shape).astype(np.float32)
    if resolve(width) == resolve("host"):
        expected = numpy_helper.to_array(onnx.load_tensor(os.path.join(LIGHT, name + "_output_0.pb")))
        exe = kiln.compile(model, num_threads=2, cache=False)
        out = exe.run({exe.input_names[0]: x})[0]
        assert rel_err(out, expected) <= RTOL              # the shipped expected output
        assert rel_err(out, ort_run(model, {exe.input_names[0]: x})[0]) <= RTOL
    # random weights: logits that differ per class, so a wrong kernel cannot hide behind a uniform softmax
    exe = kiln.compile(rnd, num_threads=2, cache=False, target=width)
    out = exe.run({exe.input_names[0]: x})[0]
    ref = ort_run(rnd, {exe.input_names[0]: x})[0]
    assert ref.std() > 1e-2 * np.abs(ref).max(), "randomized model's logits are near-constant"
    assert rel_err(out, ref) <= RTOL
