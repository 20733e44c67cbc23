"""Peer adapters of `kiln bench`: each available peer must compute what onnxruntime/numpy computes.

Every peer is optional: a missing one is skipped with its own `available()` reason. The models are
small and built here with onnx.helper (GEMM 64x96x80, a 3x3 and a depthwise conv, a tiny CNN and a
tiny transformer block that together use every op the zoo networks use), so the file runs in a few
minutes. TVM MetaSchedule tuning is marked slow.
"""
from __future__ import annotations

import time

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from kiln.bench.peers import PEERS, get_peers
from kiln.bench.peers.base import Peer, PeerError
from kiln.bench.workload import GemmSpec, Workload

OPSET = 17


# ---- small models --------------------------------------------------------------------------------
def _model(nodes, inputs, outputs, inits) -> onnx.ModelProto:
    g = helper.make_graph(nodes, "g", inputs, outputs,
                          [numpy_helper.from_array(v, k) for k, v in inits.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", OPSET)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    return m


def _vi(name: str, shape) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def gemm_workload(m: int = 64, k: int = 96, n: int = 80, seed: int = 0) -> Workload:
    r = np.random.default_rng(seed)
    a = r.standard_normal((m, k), dtype=np.float32)
    b = r.standard_normal((k, n), dtype=np.float32)

    def build() -> onnx.ModelProto:
        return _model([helper.make_node("MatMul", ["A", "B"], ["Y"])], [_vi("A", [m, k])], [_vi("Y", [m, n])],
                      {"B": b})
    return Workload(f"gemm_{m}x{k}x{n}", "gemm", 2.0 * m * n * k, build, {"A": a}, GemmSpec(m, n, k, a, b))


def conv_workload(c: int = 16, hw: int = 12, cout: int = 24, depthwise: bool = False,
                  seed: int = 1) -> Workload:
    r = np.random.default_rng(seed)
    cout = c if depthwise else cout
    w = r.standard_normal((cout, 1 if depthwise else c, 3, 3), dtype=np.float32) * 0.2
    b = r.standard_normal(cout, dtype=np.float32)
    x = r.standard_normal((1, c, hw, hw), dtype=np.float32)

    def build() -> onnx.ModelProto:
        node = helper.make_node("Conv", ["x", "w", "b"], ["y"], kernel_shape=[3, 3], pads=[1, 1, 1, 1],
                                group=c if depthwise else 1)
        return _model([node], [_vi("x", [1, c, hw, hw])], [_vi("y", [1, cout, hw, hw])], {"w": w, "b": b})
    flops = 2.0 * cout * hw * hw * 9 * (1 if depthwise else c)
    return Workload(f"conv_{'dw' if depthwise else '3x3'}_{c}", "conv", flops, build, {"x": x})


def tiny_cnn_workload(seed: int = 2) -> Workload:
    """Conv/BN/Relu, MaxPool, depthwise Conv + Clip(0,6), residual Add, AveragePool, GAP, Flatten, Gemm."""
    r = np.random.default_rng(seed)
    f = lambda *s: r.standard_normal(s, dtype=np.float32) * 0.3  # noqa: E731
    inits = {
        "w1": f(8, 3, 3, 3), "b1": f(8),
        "g": r.uniform(0.5, 1.5, 8).astype(np.float32), "be": f(8), "mu": f(8),
        "var": r.uniform(0.5, 2, 8).astype(np.float32),
        "wd": f(8, 1, 3, 3), "bd": f(8), "wp": f(16, 8, 1, 1),
        "fc": f(10, 16), "fcb": f(10), "half": np.array(0.5, np.float32),
    }
    n = helper.make_node
    nodes = [
        n("Conv", ["x", "w1", "b1"], ["c1"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[1, 1]),
        n("BatchNormalization", ["c1", "g", "be", "mu", "var"], ["bn"], epsilon=1e-5),
        n("Relu", ["bn"], ["r1"]),
        n("MaxPool", ["r1"], ["p1"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
        n("Conv", ["p1", "wd", "bd"], ["dw"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], group=8),
        n("Constant", [], ["lo"], value=numpy_helper.from_array(np.array(0.0, np.float32))),
        n("Constant", [], ["hi"], value=numpy_helper.from_array(np.array(6.0, np.float32))),
        n("Clip", ["dw", "lo", "hi"], ["cl"]),
        n("Add", ["cl", "p1"], ["res"]),
        n("Conv", ["res", "wp"], ["pw"], kernel_shape=[1, 1], strides=[2, 2]),
        n("AveragePool", ["pw"], ["ap"], kernel_shape=[2, 2], strides=[1, 1]),
        n("GlobalAveragePool", ["ap"], ["gap"]),
        n("Flatten", ["gap"], ["fl"], axis=1),
        n("Gemm", ["fl", "fc", "fcb"], ["logits"], transB=1),
        n("Mul", ["logits", "half"], ["out2"]),
    ]
    x = r.standard_normal((1, 3, 16, 16), dtype=np.float32)
    outs = [_vi("logits", [1, 10]), _vi("out2", [1, 10])]
    build = lambda: _model(nodes, [_vi("x", [1, 3, 16, 16])], outs, inits)  # noqa: E731
    return Workload("tiny_cnn", "network", 0.0, build, {"x": x})


def tiny_bert_workload(seq: int = 8, d: int = 16, heads: int = 2, seed: int = 3) -> Workload:
    """One attention block: Shape->Gather->Unsqueeze->Concat->Reshape, Transpose, MatMul, Div, Softmax,
    LayerNormalization, erf-GELU (Div, Erf, Add, Mul), Sub."""
    r = np.random.default_rng(seed)
    f = lambda *s: r.standard_normal(s, dtype=np.float32) * 0.3  # noqa: E731
    dh = d // heads
    inits = {"wq": f(d, d), "wk": f(d, d), "wv": f(d, d), "w1": f(d, 2 * d), "w2": f(2 * d, d),
             "ln_g": r.uniform(0.5, 1.5, d).astype(np.float32), "ln_b": f(d),
             "idx0": np.array(0, np.int64), "idx1": np.array(1, np.int64), "ax0": np.array([0], np.int64),
             "hd": np.array([heads, dh], np.int64), "scale": np.array(np.sqrt(dh), np.float32),
             "sqrt2": np.array(np.sqrt(2.0), np.float32), "one": np.array(1.0, np.float32),
             "half": np.array(0.5, np.float32), "dd": np.array([d], np.int64),
             "mu": np.array(0.1, np.float32)}
    n = helper.make_node
    nodes = [
        n("Shape", ["x"], ["shp"]),
        n("Gather", ["shp", "idx0"], ["bsz"], axis=0), n("Gather", ["shp", "idx1"], ["sl"], axis=0),
        n("Unsqueeze", ["bsz", "ax0"], ["bsz1"]), n("Unsqueeze", ["sl", "ax0"], ["sl1"]),
        n("Concat", ["bsz1", "sl1", "hd"], ["split_shape"], axis=0),
        n("Concat", ["bsz1", "sl1", "dd"], ["merge_shape"], axis=0),
    ]
    for nm in ("q", "k", "v"):
        nodes += [n("MatMul", ["x", f"w{nm}"], [f"{nm}0"]),
                  n("Reshape", [f"{nm}0", "split_shape"], [f"{nm}1"])]
    nodes += [
        n("Transpose", ["q1"], ["qt"], perm=[0, 2, 1, 3]), n("Transpose", ["k1"], ["kt"], perm=[0, 2, 3, 1]),
        n("Transpose", ["v1"], ["vt"], perm=[0, 2, 1, 3]),
        n("MatMul", ["qt", "kt"], ["s0"]), n("Div", ["s0", "scale"], ["s1"]),
        n("Softmax", ["s1"], ["p"], axis=-1), n("MatMul", ["p", "vt"], ["ctx0"]),
        n("Transpose", ["ctx0"], ["ctx1"], perm=[0, 2, 1, 3]), n("Reshape", ["ctx1", "merge_shape"], ["ctx"]),
        n("Add", ["ctx", "x"], ["h0"]),
        n("LayerNormalization", ["h0", "ln_g", "ln_b"], ["h"], axis=-1, epsilon=1e-5),
        n("MatMul", ["h", "w1"], ["u"]), n("Div", ["u", "sqrt2"], ["u1"]), n("Erf", ["u1"], ["u2"]),
        n("Add", ["u2", "one"], ["u3"]), n("Mul", ["u", "u3"], ["u4"]), n("Mul", ["u4", "half"], ["gelu"]),
        n("MatMul", ["gelu", "w2"], ["o0"]), n("Sub", ["o0", "mu"], ["y"]),
    ]
    x = r.standard_normal((1, seq, d), dtype=np.float32)
    build = lambda: _model(nodes, [_vi("x", [1, seq, d])], [_vi("y", [1, seq, d])], inits)  # noqa: E731
    return Workload("tiny_bert", "network", 0.0, build, {"x": x})


def tiny_mlp_workload(seed: int = 4) -> Workload:
    """Gemm transB=1 chain (the zoo's mlp in miniature) with two inputs, to check feed order."""
    r = np.random.default_rng(seed)
    f = lambda *s: r.standard_normal(s, dtype=np.float32) * 0.2  # noqa: E731
    n = helper.make_node
    nodes = [n("Gemm", ["a", "w1", "b1"], ["h"], transB=1), n("Relu", ["h"], ["hr"]),
             n("Gemm", ["hr", "w2", "b2"], ["y0"], transB=1), n("Add", ["y0", "z"], ["y"])]
    inits = {"w1": f(64, 32), "b1": f(64), "w2": f(24, 64), "b2": f(24)}
    feeds = {"a": r.standard_normal((4, 32), dtype=np.float32),
             "z": r.standard_normal((4, 24), dtype=np.float32)}
    ins = [_vi("a", [4, 32]), _vi("z", [4, 24])]
    build = lambda: _model(nodes, ins, [_vi("y", [4, 24])], inits)  # noqa: E731
    return Workload("tiny_mlp", "network", 0.0, build, feeds)


def reference(w: Workload) -> list[np.ndarray]:
    if w.gemm is not None:
        return [w.gemm.a.astype(np.float64) @ w.gemm.b.astype(np.float64)]
    ort = pytest.importorskip("onnxruntime")
    sess = ort.InferenceSession(w.build_model().SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, w.inputs)


def assert_close(got: list[np.ndarray], want: list[np.ndarray], what: str, rtol: float = 1e-3) -> None:
    assert len(got) == len(want), f"{what}: {len(got)} outputs, expected {len(want)}"
    for i, (g, r) in enumerate(zip(got, want)):
        g = np.asarray(g)
        assert g.shape == r.shape, f"{what} output {i}: shape {g.shape} != {r.shape}"
        tol = rtol * float(np.max(np.abs(r)))
        err = float(np.max(np.abs(g.astype(np.float64) - r)))
        assert err <= tol, f"{what} output {i}: max err {err:.3g} > {tol:.3g}"


# ---- the per-peer tests ----------------------------------------------------------------------------
QUICK_STRATEGY_SKIP = {("tvm", "metaschedule")}
STRATEGY_RTOL = {("openvino", "bf16"): 3e-2}
WORKLOADS = {
    "gemm": [gemm_workload, lambda: gemm_workload(33, 77, 47)],  # odd sizes: tile tails
    "conv": [conv_workload, lambda: conv_workload(c=16, hw=10, depthwise=True)],
    "network": [tiny_cnn_workload, tiny_bert_workload, tiny_mlp_workload],
}


def _peer(name: str) -> Peer:
    peer = PEERS[name]()
    ok, why = peer.available()
    if not ok:
        pytest.skip(f"{name}: {why}")
    return peer


def _cases():
    for name, cls in PEERS.items():
        peer = cls()
        for kind in ("gemm", "conv", "network"):
            if kind in peer.kinds:
                yield pytest.param(name, kind, id=f"{name}-{kind}")


@pytest.mark.parametrize("name,kind", list(_cases()))
def test_peer_matches_reference(name: str, kind: str) -> None:
    peer = _peer(name)
    assert peer.version()
    for make in WORKLOADS[kind]:
        w = make()
        want = reference(w)
        run = peer.prepare(w, threads=2)
        assert_close(run(), want, f"{name}/{w.name}")
        assert_close(run(), want, f"{name}/{w.name} (2nd run)")


def _strategy_cases():
    for name, cls in PEERS.items():
        for s in cls().strategies[1:]:
            if (name, s) not in QUICK_STRATEGY_SKIP:
                yield pytest.param(name, s, id=f"{name}-{s}")


@pytest.mark.parametrize("name,strategy", list(_strategy_cases()))
def test_peer_strategies(name: str, strategy: str) -> None:
    peer = _peer(name)
    rtol = STRATEGY_RTOL.get((name, strategy), 1e-3)
    for kind in ("gemm", "conv"):
        if kind in peer.kinds:
            w = WORKLOADS[kind][0]()
            got = peer.prepare(w, threads=2, strategy=strategy)()
            assert_close(got, reference(w), f"{name}[{strategy}]/{w.name}", rtol)


@pytest.mark.parametrize("name", ["jax", "iree", "halide"])
def test_process_wide_thread_count_is_enforced(name: str) -> None:
    """XLA and IREE fix their pool size once per process: another count must fail loudly, not lie."""
    peer = _peer(name)
    w = gemm_workload()
    peer.prepare(w, threads=2)
    with pytest.raises(PeerError, match="fresh process"):
        peer.prepare(w, threads=1)


def test_registry_and_kinds() -> None:
    assert set(PEERS) == {"onnxruntime", "torch", "inductor", "jax", "tvm", "iree", "openvino", "openblas",
                          "mkl", "onednn", "blis", "exo", "xnnpack", "halide", "naive-c"}
    assert [p.name for p in get_peers(["mkl", "onnxruntime"])] == ["mkl", "onnxruntime"]
    with pytest.raises(KeyError, match="nosuch"):
        get_peers(["nosuch"])
    for name, cls in PEERS.items():
        p = cls()
        assert p.name == name and p.kinds <= {"gemm", "conv", "network", "torch"} and p.strategies
        ok, why = p.available()
        assert ok or why, f"{name} unavailable without a reason"


def test_systems_not_run_say_why() -> None:
    """TACO, Glow, onnx-mlir and the GPU libraries are listed with a reason, and asking for one is that reason."""
    from kiln.bench.peers import NOT_RUN
    from kiln.bench.systems import resolve

    assert {"taco", "glow", "onnx-mlir", "cudnn", "cublas", "tensorrt"} <= set(NOT_RUN)
    assert not set(NOT_RUN) & set(PEERS)
    with pytest.raises(KeyError, match="tensorrt is not run by kiln bench: GPU-only"):
        resolve("tensorrt")
    with pytest.raises(KeyError, match="taco: no installable package"):
        get_peers(["taco"])


def test_every_peer_says_how_it_builds_kernels() -> None:
    from kiln.bench.report import APPROACHES
    from kiln.bench.systems import approach

    for name, cls in PEERS.items():
        assert cls.approach, f"{name} has no approach"
    assert approach(PEERS["blis"]()) == approach(PEERS["xnnpack"]()) == approach("kiln", "ukernel") \
        == "hand-written microkernels"
    assert approach(PEERS["exo"]()) == "synthesized kernels" and approach("kiln", "direct") == "direct emission"
    assert {approach(p()) for p in PEERS.values()} & set(APPROACHES)


def test_gemm_only_peers_reject_networks() -> None:
    peer = _peer("naive-c")
    with pytest.raises(PeerError, match="does not handle"):
        peer.prepare(conv_workload(), threads=1)
    with pytest.raises(PeerError, match="unknown strategy"):
        peer.prepare(gemm_workload(), threads=1, strategy="nosuch")


def test_unsupported_op_is_named() -> None:
    pytest.importorskip("torch")
    from kiln.bench.peers._onnx_interp import UnsupportedOp
    from kiln.bench.peers._torch_ops import to_torch_module

    m = _model([helper.make_node("HardSwish", ["x"], ["y"])], [_vi("x", [2, 3])], [_vi("y", [2, 3])], {})
    with pytest.raises(UnsupportedOp, match="HardSwish"):
        to_torch_module(m, {"x": np.zeros((2, 3), np.float32)})


def test_spot_check_prepare_returns_the_real_run() -> None:
    """Time onnxruntime directly and through prepare(): the callable must do the same work."""
    peer = _peer("onnxruntime")
    import onnxruntime as ort

    w = gemm_workload(256, 256, 256)
    run = peer.prepare(w, threads=1)
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    sess = ort.InferenceSession(w.build_model().SerializeToString(), so, providers=["CPUExecutionProvider"])

    def med(fn, n: int = 30) -> float:
        for _ in range(3):
            fn()
        ts = []
        for _ in range(n):
            t = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t)
        return float(np.median(ts))

    direct, via = med(lambda: sess.run(None, w.inputs)), med(run)
    print(f"onnxruntime gemm 256^3: direct {direct * 1e3:.3f} ms, via prepare {via * 1e3:.3f} ms")
    assert_close(run(), reference(w), "spot-check")
    assert via > 0 and direct > 0


ZOO_NETWORKS = ["mlp", "mobilenetv2", "resnet18", "bert_base"]


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n, c in PEERS.items() if "network" in c.kinds])
def test_zoo_networks(name: str) -> None:
    """The real zoo networks (bert_base is 440 MB of weights) through each network peer (--runslow)."""
    peer = _peer(name)
    zoo = pytest.importorskip("kiln.zoo")
    for net in ZOO_NETWORKS:
        if name == "tvm" and net != "mlp":
            continue  # untuned TVM: seconds to minutes per run
        w = Workload(net, "network", 0.0, lambda net=net: zoo.build(net), zoo.inputs(net))
        assert_close(peer.prepare(w, threads=2)(), reference(w), f"{name}/{net}")


@pytest.mark.slow
def test_tvm_metaschedule_tunes_small_gemm(tmp_path) -> None:
    """MetaSchedule with a tiny budget (--runslow): the tuned path builds and computes the right thing."""
    from kiln.bench.peers.tvm import TvmPeer

    peer = TvmPeer(trials=16, work_dir=str(tmp_path))
    ok, why = peer.available()
    if not ok:
        pytest.skip(why)
    w = gemm_workload()
    assert_close(peer.prepare(w, threads=2, strategy="metaschedule")(), reference(w), "tvm/metaschedule")
