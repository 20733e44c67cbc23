"""graph/passes/conv1d_as_2d.py: 1-D convolutions run as 2-D ones of height 1 (packed weights, blocked layout,
register tiles) — strides, pads, dilations, groups and depthwise, chains with elementwise ops between them, each
against onnxruntime per x86 width."""
from __future__ import annotations

import pytest
from onnx import helper

from conftest import check, make_model, rand
from kiln.compiler import check_options, lower
from kiln.target import resolve

RTOL = 1e-4
CASES = {  # x shape, w shape, attrs
    "k3-pad1": ((1, 80, 48), (128, 80, 3), {"pads": [1, 1]}),
    "k3-s2": ((1, 64, 48), (64, 64, 3), {"pads": [1, 1], "strides": [2]}),
    "k10-s5": ((1, 1, 400), (64, 1, 10), {"strides": [5]}),
    "dilated": ((2, 32, 40), (32, 32, 3), {"pads": [2, 2], "dilations": [2]}),
    "grouped-even-k": ((1, 64, 24), (64, 16, 16), {"pads": [8, 8], "group": 4}),
    "depthwise": ((1, 64, 30), (64, 1, 5), {"pads": [2, 2], "group": 64}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_conv1d(case: str, width: str) -> None:
    xs, ws, attrs = CASES[case]
    x = rand(*xs, seed=2)
    model = make_model([helper.make_node("Conv", ["x", "w", "b"], ["y"], **attrs)], {"x": x}, ["y"],
                       {"w": rand(*ws, seed=3, lo=-0.3, hi=0.3), "b": rand(ws[0], seed=4)})
    check(model, {"x": x}, RTOL, target=width)
    c = lower(model, resolve("host"), 2, check_options({}), stop_after="kernels")
    assert all(len(n.inputs[0].shape) == 4 for n in c.graph.nodes if n.op in ("Conv", "PackedConv"))


def test_conv1d_chain_with_gelu(width: str) -> None:
    """Whisper's front end: conv → GELU → strided conv → GELU."""
    x = rand(1, 80, 48, seed=5)
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1]),
             helper.make_node("Gelu", ["c1"], ["g1"], domain=""),
             helper.make_node("Conv", ["g1", "w2", "b2"], ["c2"], pads=[1, 1], strides=[2]),
             helper.make_node("Gelu", ["c2"], ["y"])]
    consts = {"w1": rand(128, 80, 3, seed=6, lo=-0.2, hi=0.2), "b1": rand(128, seed=7),
              "w2": rand(128, 128, 3, seed=8, lo=-0.1, hi=0.1), "b2": rand(128, seed=9)}
    check(make_model(nodes, {"x": x}, ["y"], consts, opset=20), {"x": x}, RTOL, target=width)


def test_conv1d_as_2d_switch() -> None:
    x = rand(1, 16, 20)
    model = make_model([helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1])], {"x": x}, ["y"],
                       {"w": rand(16, 16, 3, seed=1)})
    check(model, {"x": x}, RTOL, conv1d_as_2d=False)
    c = lower(model, resolve("host"), 2, check_options({"conv1d_as_2d": False}), stop_after="kernels")
    assert any(n.op == "Conv" and len(n.inputs[0].shape) == 3 for n in c.graph.nodes)
