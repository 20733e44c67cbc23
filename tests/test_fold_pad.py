"""graph/passes/fold_pad.py: an explicit constant-zero Pad before a Conv becomes the conv's padding, a Pad of all
zeros is dropped; every other Pad stays a Pad. Each model compared with onnxruntime, and the graph after the
passes checked for the Pad."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from conftest import check, make_model, rand
from kiln.compiler import check_options, lower
from kiln.target import resolve

RTOL = 1e-4


def pad_conv(x_shape: tuple[int, ...], pads: list[int], w_shape: tuple[int, ...], conv_pads: list[int] | None = None,
             mode: str = "constant", value: float = 0.0, group: int = 1, two_convs: bool = False,
             pad_is_output: bool = False):  # noqa: ANN201
    x = rand(*x_shape, seed=3)
    consts = {"pads": np.array(pads, np.int64), "value": np.array(value, np.float32),
              "w": rand(*w_shape, seed=4, lo=-0.5, hi=0.5), "w2": rand(*w_shape, seed=5, lo=-0.5, hi=0.5)}
    nd = len(x_shape) - 2
    cp = conv_pads or [0] * (2 * nd)
    nodes = [helper.make_node("Pad", ["x", "pads", "value"], ["p"], mode=mode, name="pad"),
             helper.make_node("Conv", ["p", "w"], ["y"], pads=cp, group=group, name="conv")]
    outs = ["y"]
    if two_convs:
        nodes.append(helper.make_node("Conv", ["p", "w2"], ["y2"], pads=cp, group=group, name="conv2"))
        outs.append("y2")
    if pad_is_output:
        outs.append("p")
    return make_model(nodes, {"x": x}, outs, consts), {"x": x}


def graph_ops(model) -> list[str]:  # noqa: ANN001
    c = lower(model, resolve("host"), 2, check_options({}), stop_after="kernels")
    return [n.op for n in c.graph.nodes]


CASES = {
    "3x3-same": ((1, 16, 12, 12), [0, 0, 1, 1, 0, 0, 1, 1], (32, 16, 3, 3), None, True),
    "1x1-asymmetric": ((1, 32, 10, 9), [0, 0, 0, 1, 0, 0, 1, 0], (16, 32, 1, 1), None, True),
    "plus-conv-pads": ((1, 16, 11, 11), [0, 0, 2, 0, 0, 0, 0, 2], (16, 16, 3, 3), [1, 1, 1, 1], True),
    "depthwise": ((1, 32, 14, 14), [0, 0, 1, 1, 0, 0, 1, 1], (32, 1, 3, 3), None, True),
    "conv1d": ((1, 8, 40), [0, 0, 3, 0, 0, 0], (16, 8, 4), None, True),
    "all-zero": ((1, 16, 8, 8), [0] * 8, (16, 16, 3, 3), [1, 1, 1, 1], True),
    "channel-pad-kept": ((1, 15, 8, 8), [0, 1, 0, 0, 0, 0, 0, 0], (16, 16, 3, 3), None, False),
    "crop-kept": ((1, 16, 10, 10), [0, 0, -1, 0, 0, 0, 0, -1], (16, 16, 3, 3), None, False),
}


@pytest.mark.parametrize("case", list(CASES))
def test_pad_folded_into_conv(case: str, width: str) -> None:
    x_shape, pads, w_shape, conv_pads, folded = CASES[case]
    group = x_shape[1] if case == "depthwise" else 1
    model, feeds = pad_conv(x_shape, pads, w_shape, conv_pads, group=group)
    check(model, feeds, RTOL, target=width)
    assert ("Pad" not in graph_ops(model)) == folded


@pytest.mark.parametrize("mode, value", [("constant", 0.5), ("reflect", 0.0), ("edge", 0.0)])
def test_other_pads_stay(mode: str, value: float) -> None:
    model, feeds = pad_conv((1, 16, 9, 9), [0, 0, 1, 1, 0, 0, 1, 1], (16, 16, 3, 3), mode=mode, value=value)
    check(model, feeds, RTOL)
    assert "Pad" in graph_ops(model)


def test_pad_read_by_two_convs_folded_into_both() -> None:
    model, feeds = pad_conv((1, 16, 9, 9), [0, 0, 1, 2, 0, 0, 2, 1], (16, 16, 3, 3), two_convs=True)
    check(model, feeds, RTOL)
    ops = graph_ops(model)
    assert "Pad" not in ops


def test_pad_that_is_a_graph_output_stays() -> None:
    model, feeds = pad_conv((1, 16, 9, 9), [0, 0, 1, 1, 0, 0, 1, 1], (16, 16, 3, 3), pad_is_output=True)
    check(model, feeds, RTOL)
    assert "Pad" in graph_ops(model)


def test_fold_pad_switch() -> None:
    model, feeds = pad_conv((1, 16, 9, 9), [0, 0, 1, 1, 0, 0, 1, 1], (16, 16, 3, 3))
    check(model, feeds, RTOL, fold_pad=False)
    c = lower(model, resolve("host"), 2, check_options({"fold_pad": False}), stop_after="kernels")
    assert "Pad" in [n.op for n in c.graph.nodes]
