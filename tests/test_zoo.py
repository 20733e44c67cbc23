"""kiln.zoo: every model builds, checks, runs in onnxruntime with O(1) activations, and is the
architecture it claims to be (torchvision parameter counts, published FLOP counts, a numpy BERT)."""
from __future__ import annotations

import math
from functools import cache

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

import kiln.zoo as zoo

ort = pytest.importorskip("onnxruntime")

EXPECTED_OUTPUTS = {
    "resnet18": ("logits", (1, 1000)),
    "resnet50": ("logits", (1, 1000)),
    "mobilenetv2": ("logits", (1, 1000)),
    "bert_base": ("hidden_states", (1, 128, 768)),
    "mlp": ("logits", (1, 1000)),
    "gemm_1024": ("Y", (1024, 1024)),
    "gemm_odd": ("Y", (129, 257)),
    "conv_r50_3x3": ("output", (1, 256, 14, 14)),
    "conv_dw": ("output", (1, 144, 56, 56)),
}
VISION = ["resnet18", "resnet50", "mobilenetv2"]


@cache
def built(name: str) -> onnx.ModelProto:
    # Shared across tests: building BERT-base (340 MB of weights) twice per test would add up.
    return zoo.build(name)


def session(model: onnx.ModelProto) -> ort.InferenceSession:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def op_types(model: onnx.ModelProto) -> set[str]:
    return {n.op_type for n in model.graph.node}


def test_names() -> None:
    assert zoo.names() == list(EXPECTED_OUTPUTS)


@pytest.mark.parametrize("fn", [zoo.build, zoo.inputs, zoo.flops])
def test_unknown_name_lists_valid_ones(fn) -> None:
    with pytest.raises(KeyError, match="resnet50"):
        fn("resnet51")


@pytest.mark.parametrize("name", list(EXPECTED_OUTPUTS))
def test_builds_checks_and_runs(name: str) -> None:
    model = built(name)
    onnx.checker.check_model(model, full_check=True)
    assert model.ir_version == 8
    assert [(o.domain, o.version) for o in model.opset_import] == [("", 17)]
    names = [n.name for n in model.graph.node]
    assert all(names) and len(set(names)) == len(names), "node names must be set and unique"

    feeds = zoo.inputs(name)
    graph_inputs = {i.name: tuple(d.dim_value for d in i.type.tensor_type.shape.dim)
                    for i in model.graph.input}
    assert {k: v.shape for k, v in feeds.items()} == graph_inputs
    assert all(v.dtype == np.float32 for v in feeds.values())

    out_name, out_shape = EXPECTED_OUTPUTS[name]
    (y,) = session(model).run([out_name], feeds)
    assert y.shape == out_shape and y.dtype == np.float32
    assert np.isfinite(y).all()
    assert 1e-2 < float(y.std()) < 1e3, f"{name}: output std {y.std()} is not O(1)"


@pytest.mark.parametrize("name", list(EXPECTED_OUTPUTS))
def test_deterministic(name: str) -> None:
    assert zoo.build(name).SerializeToString() == built(name).SerializeToString()
    a, b = zoo.inputs(name), zoo.inputs(name)
    assert all(np.array_equal(a[k], b[k]) for k in a)


def test_seed_changes_weights() -> None:
    assert zoo.build("conv_dw", seed=1).SerializeToString() != zoo.build("conv_dw").SerializeToString()
    assert not np.array_equal(zoo.inputs("gemm_odd", seed=2)["A"], zoo.inputs("gemm_odd")["A"])


def test_bert_ops() -> None:
    model = built("bert_base")
    shape_subgraph = {"Shape", "Gather", "Unsqueeze", "Concat"}
    assert {"LayerNormalization", "Erf", "Softmax"} | shape_subgraph <= op_types(model)
    assert "BatchNormalization" not in op_types(model)
    inits = {t.name for t in model.graph.initializer}
    reshapes = [n for n in model.graph.node if n.op_type == "Reshape"]
    assert len(reshapes) == 4 * 12
    # The head split's target shape is computed at run time, not a constant.
    assert all(n.input[1] not in inits for n in reshapes)
    lns = [n for n in model.graph.node if n.op_type == "LayerNormalization"]
    assert len(lns) == 24
    eps = [onnx.helper.get_attribute_value(a) for n in lns for a in n.attribute if a.name == "epsilon"]
    assert eps == [pytest.approx(1e-12)] * 24


@pytest.mark.parametrize("name", VISION)
def test_vision_ops(name: str) -> None:
    model = built(name)
    ops = op_types(model)
    assert {"Conv", "BatchNormalization", "GlobalAveragePool", "Flatten", "Gemm"} <= ops
    n_conv = sum(n.op_type == "Conv" for n in model.graph.node)
    n_bn = sum(n.op_type == "BatchNormalization" for n in model.graph.node)
    assert n_bn == n_conv, "every Conv is followed by its own BatchNormalization"
    if name == "mobilenetv2":
        clips = [n for n in model.graph.node if n.op_type == "Clip"]
        assert clips and all(len(n.input) == 3 for n in clips)
        groups = [a.i for n in model.graph.node for a in n.attribute if a.name == "group" and a.i > 1]
        assert len(groups) == 17  # one depthwise conv per inverted-residual block
    else:
        assert "MaxPool" in ops and "Relu" in ops


# Trainable parameters of the torchvision models (BN running stats are buffers, not parameters).
TORCHVISION_PARAMS = {"resnet18": 11_689_512, "resnet50": 25_557_032, "mobilenetv2": 3_504_872}


@pytest.mark.parametrize("name", VISION)
def test_parameter_count_matches_torchvision(name: str) -> None:
    params = sum(
        int(np.prod(t.dims)) for t in built(name).graph.initializer
        if not t.name.endswith(("running_mean", "running_var")) and not t.name.startswith("const.")
    )
    assert params == TORCHVISION_PARAMS[name]


def test_flops() -> None:
    # Vision: torchvision's published GMACs; the rest: exact closed forms.
    assert zoo.flops("resnet18") == pytest.approx(2 * 1.814e9, rel=2e-3)
    assert zoo.flops("resnet50") == pytest.approx(2 * 4.089e9, rel=2e-3)
    assert zoo.flops("mobilenetv2") == pytest.approx(2 * 0.3007e9, rel=2e-3)
    s, h, f = 128, 768, 3072
    bert_layer_macs = 4 * s * h * h + 2 * s * h * f + 2 * s * s * h  # projections, FFN, QK^T and PV
    assert zoo.flops("bert_base") == 2 * 12 * bert_layer_macs
    assert zoo.flops("mlp") == 2 * (1024 * 4096 + 4096 * 4096 + 4096 * 1000)
    assert zoo.flops("gemm_1024") == 2 * 1024**3
    assert zoo.flops("gemm_odd") == 2 * 129 * 771 * 257
    assert zoo.flops("conv_r50_3x3") == 2 * 256 * 256 * 9 * 14 * 14
    assert zoo.flops("conv_dw") == 2 * 144 * 9 * 56 * 56


@pytest.mark.parametrize("name", VISION)
def test_activations_stay_order_one(name: str) -> None:
    """Every BatchNormalization output, on an input the BN stats were not calibrated on, is O(1):
    no blow-up along the residual stream, no collapse."""
    model = onnx.ModelProto()
    model.CopyFrom(built(name))
    bn_outs = [n.output[0] for n in model.graph.node if n.op_type == "BatchNormalization"]
    model.graph.output.extend(
        onnx.helper.make_tensor_value_info(t, onnx.TensorProto.FLOAT, None) for t in bn_outs)
    outs = session(model).run(bn_outs, zoo.inputs(name, seed=7))
    stds = {t: float(o.std()) for t, o in zip(bn_outs, outs)}
    bad = {t: s for t, s in stds.items() if not 0.3 < s < 3.0}
    assert not bad, f"BN outputs far from unit scale: {bad}"


def bert_reference(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    """BERT-base encoder in float64 numpy, from the model's own weights, written from the paper
    rather than from the graph: catches wrong transposes, head splits or GELU forms."""
    w = {t.name: numpy_helper.to_array(t).astype(np.float64) for t in model.graph.initializer}
    erf = np.vectorize(math.erf)

    def dense(h: np.ndarray, p: str) -> np.ndarray:
        return h @ w[f"{p}.weight"] + w[f"{p}.bias"]

    def layer_norm(h: np.ndarray, p: str) -> np.ndarray:
        mu, var = h.mean(-1, keepdims=True), h.var(-1, keepdims=True)
        return (h - mu) / np.sqrt(var + 1e-12) * w[f"{p}.weight"] + w[f"{p}.bias"]

    def heads(h: np.ndarray) -> np.ndarray:  # [S, 768] -> [12, S, 64]
        return h.reshape(h.shape[0], 12, 64).transpose(1, 0, 2)

    h = x[0].astype(np.float64)
    for i in range(12):
        p = f"encoder.{i}"
        q, k, v = (heads(dense(h, f"{p}.attn.{n}")) for n in "qkv")
        scores = q @ k.transpose(0, 2, 1) / 8.0
        probs = np.exp(scores - scores.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        ctx = (probs @ v).transpose(1, 0, 2).reshape(h.shape)
        h = layer_norm(h + dense(ctx, f"{p}.attn.out"), f"{p}.attn.ln")
        up = dense(h, f"{p}.ffn.up")
        h = layer_norm(h + dense(0.5 * up * (1 + erf(up / math.sqrt(2))), f"{p}.ffn.down"), f"{p}.ffn.ln")
    return h[None]


def test_bert_matches_numpy_reference() -> None:
    model = built("bert_base")
    feeds = zoo.inputs("bert_base")
    (y,) = session(model).run(["hidden_states"], feeds)
    ref = bert_reference(model, feeds["embeddings"])
    np.testing.assert_allclose(y, ref, rtol=0, atol=1e-4)
