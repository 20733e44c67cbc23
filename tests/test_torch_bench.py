"""`kiln bench` on torch.nn workloads (kind "torch"): the reference is eager PyTorch in float64, and every system
that takes a torch module — Kiln as a torch.compile backend ("torch-compile") and through kiln.from_torch (its
other strategies), eager torch, inductor with freezing, OpenVINO (its torch.compile backend and convert_model) —
is checked against it with the protocol's own check (max|out − ref| ≤ 1e-4 · max|ref|, float32 vs float64).
A tiny module stands in for ResNet-50 / MobileNetV2 / BERT-base; the zoo's torch workloads are checked for names,
inputs and FLOPs without building the big models' compiles."""
from __future__ import annotations

import functools

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from torch_cases import _fresh_dynamo, case  # noqa: E402, F401

from kiln.bench import protocol, workloads  # noqa: E402
from kiln.bench.kiln_system import TORCH_COMPILE, KilnSystem  # noqa: E402
from kiln.bench.peers import PEERS  # noqa: E402
from kiln.bench.workload import Workload  # noqa: E402

RTOL = 1e-4


def _no_onnx() -> None:
    raise AssertionError("a torch workload's ONNX model must not be asked for")


def tiny_torch_workload(name: str = "convnet_bn") -> Workload:
    module, xs = case(name)
    return Workload(name=f"tiny_{name}", kind="torch", flops=0.0, build_model=_no_onnx,
                    inputs={f"x{i}": x.numpy() for i, x in enumerate(xs)},
                    build_torch=functools.partial(case, name))


def _checked(system, w: Workload, strategy: str) -> None:
    ref = protocol.reference(w, threads=2)
    assert ref.outputs is not None, ref.error
    assert ref.outputs[0].dtype == np.float64
    run = system.prepare(w, 2, strategy)
    for turn in ("1st", "2nd"):
        ok, err, why = protocol.check(run(), ref.outputs, RTOL)
        assert ok, f"{system.name}[{strategy}] {turn} run: {why}"


@pytest.mark.parametrize("strategy", [TORCH_COMPILE, "direct"])
def test_kiln_on_a_torch_workload(strategy: str) -> None:
    _checked(KilnSystem(), tiny_torch_workload(), strategy)


def test_eager_torch_on_a_torch_workload() -> None:
    _checked(PEERS["torch"](), tiny_torch_workload(), "default")


@pytest.mark.slow
@pytest.mark.parametrize("name,strategy", [("inductor", "default"), ("openvino", "torch-compile"),
                                           ("openvino", "default")])
def test_torch_peers_on_a_torch_workload(name: str, strategy: str) -> None:
    peer = PEERS[name]()
    ok, why = peer.available()
    if not ok:
        pytest.skip(f"{name}: {why}")
    _checked(peer, tiny_torch_workload(), strategy)


def test_torch_suite_names_the_zoo_models() -> None:
    assert workloads.SUITES["torch"] == ("torch_resnet50", "torch_mobilenetv2", "torch_bert_base")
    assert all(workloads.kind_of(n) == "torch" and n in workloads.factories() for n in workloads.SUITES["torch"])
    from kiln.zoo import torch_models
    assert torch_models.example_inputs("torch_bert_base")["x"].shape == (1, 128, 768)


@pytest.mark.slow  # builds the three ONNX twins for their FLOP counts (≈ 9 s)
def test_torch_workloads_count_their_onnx_twins_flops() -> None:
    for name, twin in workloads.TORCH_NETWORKS.items():
        w = workloads.get(name)
        assert w.kind == "torch" and w.build_torch is not None
        assert w.flops == workloads.get(twin).flops > 1e8
        with pytest.raises(ValueError, match="torch.nn workload"):
            w.build_model()
