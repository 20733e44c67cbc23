"""`kiln bench --precision`: calibration/evaluation data, quality metrics, and the peers' int8/bf16 paths.

A tiny classifier (conv → relu → global pool → fully connected) keeps it fast. Tolerances: onnxruntime's
int8 QDQ model against its fp32 session ≥ 25 dB output SNR and the same top-1 (8-bit activations and
per-channel weights on a 3-layer net: measured ≈ 35–40 dB); OpenVINO bf16 against its f32 compile within 3e-2
relative error (bf16 keeps 8 mantissa bits: ≈ 4e-3 per rounding, a few roundings deep). A missing package skips
with its reason."""
from __future__ import annotations

import functools
import math

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from kiln.bench.precision import (
    Quality,
    calibration_feeds,
    check_precision,
    evaluation_feeds,
    ort_qdq_model,
)
from kiln.bench.workload import Workload


def tiny_classifier(seed: int = 0) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((16, 3, 3, 3)) * 0.3).astype(np.float32)
    b = (rng.standard_normal(16) * 0.1).astype(np.float32)
    fc = (rng.standard_normal((10, 16)) * 0.3).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("GlobalAveragePool", ["r"], ["p"]),
             helper.make_node("Flatten", ["p"], ["f"]),
             helper.make_node("Gemm", ["f", "fc"], ["y"], transB=1)]
    g = helper.make_graph(nodes, "tiny", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])],
                          [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b"),
                           numpy_helper.from_array(fc, "fc")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def tiny_workload() -> Workload:
    x = np.random.default_rng(1).standard_normal((1, 3, 16, 16)).astype(np.float32)
    return Workload("tiny_classifier", "network", 2.0 * 16 * 27 * 256, functools.partial(tiny_classifier, 0),
                    {"x": x})


def test_data_is_deterministic_and_distinct() -> None:
    w = tiny_workload()
    a, b = calibration_feeds(w, 5), calibration_feeds(w, 5)
    assert all(np.array_equal(x["x"], y["x"]) for x, y in zip(a, b))
    ev = list(evaluation_feeds(w, 5))
    assert len(a) == 5 and len(ev) == 5 and ev[0]["x"].shape == (1, 3, 16, 16) and ev[0]["x"].dtype == np.float32
    firsts = [a[0]["x"], a[1]["x"], ev[0]["x"], w.inputs["x"]]
    assert all(not np.array_equal(p, q) for i, p in enumerate(firsts) for q in firsts[i + 1:])
    ints = Workload("ids", "network", 1.0, tiny_classifier, {"ids": np.array([[0, 5, 29999]], np.int64)})
    ids = calibration_feeds(ints, 3)[2]["ids"]
    assert ids.dtype == np.int64 and ids.min() >= 0 and ids.max() <= 29999


def test_quality_metrics() -> None:
    q = Quality()
    ref = np.array([[1.0, 3.0, 2.0]], np.float32)
    q.add([ref + np.float32(0.1)], [ref])                  # same argmax, noise 0.03 of signal 14
    q.add([np.array([[3.0, 1.0, 2.0]], np.float32)], [ref])  # argmax differs
    r = q.result()
    assert r["eval_inputs"] == 2 and r["top1_agreement"] == 0.5
    assert r["snr_db"] == pytest.approx(10 * math.log10(28.0 / (0.03 + 8.0)), rel=1e-4)
    assert r["quality_max_rel_err"] == pytest.approx(2.0 / 3.0)
    with pytest.raises(ValueError, match="unknown precision 'fp8'"):
        check_precision("fp8")


def test_onnxruntime_qdq_against_its_fp32() -> None:
    pytest.importorskip("onnxruntime.quantization")
    from kiln.bench.peers.onnxruntime import OnnxRuntimePeer

    w = tiny_workload()
    qdq = ort_qdq_model(w.build_model(), calibration_feeds(w, 16))
    ops = [n.op_type for n in qdq.graph.node]
    assert "QuantizeLinear" in ops and "DequantizeLinear" in ops
    inits = {t.name: numpy_helper.to_array(t) for t in qdq.graph.initializer}
    weight_dq = [n for n in qdq.graph.node if n.op_type == "DequantizeLinear" and n.input[0] in inits
                 and inits[n.input[0]].dtype == np.int8 and inits[n.input[0]].ndim == 4]
    assert weight_dq and inits[weight_dq[0].input[1]].shape == (16,), "per-channel int8 conv weights"
    peer = OnnxRuntimePeer()
    int8 = peer.prepare_precision(w, 2, "default", "int8", calibration_feeds(w, 16))
    fp32 = peer.prepare_precision(w, 2, "default", "fp32", [])
    q = Quality()
    for feeds in evaluation_feeds(w, 20):
        q.add(int8(feeds), fp32(feeds))
    r = q.result()
    assert r["snr_db"] >= 25.0 and r["top1_agreement"] >= 0.9, r


def _openvino():
    from kiln.bench.peers.openvino import OpenVinoPeer
    peer = OpenVinoPeer()
    ok, why = peer.available()
    if not ok:
        pytest.skip(why)
    return peer


def test_openvino_bf16_against_its_f32_and_no_bf16_in_fp32_rows() -> None:
    from kiln.bench.peers.base import PeerError

    peer, w = _openvino(), tiny_workload()
    fp32 = peer.prepare_precision(w, 2, "default", "fp32", [])
    from kiln.bench.peers.openvino import precision_of
    assert precision_of(fp32.keepalive[1]) == "f32"
    assert precision_of(peer.prepare(w, 2).keepalive[1]) == "f32", "the fp32 row compiled in bf16"
    try:
        bf16 = peer.prepare_precision(w, 2, "default", "bf16", [])
    except PeerError as e:  # a CPU without bf16 support compiles f32 and says so
        pytest.skip(str(e))
    worst = max(float(np.max(np.abs(bf16(f)[0] - fp32(f)[0])) / float(np.max(np.abs(fp32(f)[0]))))
                for f in evaluation_feeds(w, 10))
    assert 0.0 < worst < 3e-2, worst  # > 0: it really ran in bf16


def test_openvino_int8_through_nncf() -> None:
    pytest.importorskip("nncf")
    peer, w = _openvino(), tiny_workload()
    int8 = peer.prepare_precision(w, 2, "default", "int8", calibration_feeds(w, 16))
    fp32 = peer.prepare_precision(w, 2, "default", "fp32", [])
    q = Quality()
    for feeds in evaluation_feeds(w, 20):
        q.add(int8(feeds), fp32(feeds))
    assert q.result()["snr_db"] >= 20.0, q.result()


def test_protocol_precision_rows() -> None:
    """One interleaved run at fp32 and int8: onnxruntime's int8 row timed with its quality against its own fp32;
    Kiln's int8 row says why it is not there (until kiln.quantize exists) instead of being left out."""
    import kiln
    from kiln.bench.kiln_system import KilnSystem
    from kiln.bench.peers.onnxruntime import OnnxRuntimePeer
    from kiln.bench.protocol import Contestant, ProtocolConfig, run
    from kiln.bench.report import precision_table

    cfg = ProtocolConfig(threads=2, rounds=2, min_rounds=1, round_s=0.005, warmup_s=0.01, settle_s=0.05,
                         calibration_inputs=8, eval_inputs=10)
    people = [Contestant(OnnxRuntimePeer(), "default"), Contestant(OnnxRuntimePeer(), "default", "int8"),
              Contestant(KilnSystem(strategies=("direct",)), "direct", "int8")]
    recs = {(r["system"], r["precision"]): r for r in run([tiny_workload()], people, cfg)}
    ort8 = recs[("onnxruntime", "int8")]
    assert ort8["ok"] and ort8["median_ms"] > 0 and ort8["eval_inputs"] == 10, ort8
    assert ort8["snr_db"] >= 25.0 and ort8["top1_agreement"] >= 0.9
    assert recs[("onnxruntime", "fp32")]["ok"] and "snr_db" not in recs[("onnxruntime", "fp32")]
    k8 = recs[("kiln", "int8")]
    if callable(getattr(kiln, "quantize", None)):
        assert k8["ok"], k8
    else:
        assert k8["status"] == "unavailable" and "not available in this build" in k8["reason"]
    table = "\n".join(precision_table(list(recs.values())))
    assert "| tiny_classifier | onnxruntime:default | int8 |" in table


@pytest.mark.slow
def test_pytorch_int8_pt2e_against_its_fp32() -> None:
    from kiln.bench.peers.inductor import InductorPeer

    peer, w = InductorPeer(), tiny_workload()
    ok, why = peer.precision_available("int8")
    if not ok:
        pytest.skip(why)
    int8 = peer.prepare_precision(w, 2, "default", "int8", calibration_feeds(w, 16))
    fp32 = peer.prepare_precision(w, 2, "default", "fp32", [])
    q = Quality()
    for feeds in evaluation_feeds(w, 10):
        q.add(int8(feeds), fp32(feeds))
    assert q.result()["snr_db"] >= 25.0, q.result()
