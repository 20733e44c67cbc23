"""The blocked channel layout (graph/passes/block_layout.py) against onnxruntime, and where its reorders go.

Networks of convolutions run in xb[N, C/cb, H, W, cb] between a reorder at their start (only for a conv with a
long reduction) and one back to NCHW where a consumer needs it (a graph output, Flatten, a Softmax over
channels). Each case compares every output with onnxruntime (tolerance 1e-4 relative to the largest |output|:
the convs' sums run in another order) and checks the graph's reorders.

Cases: residual blocks with ReLU / Clip, pooling (max and average, with and without counted pads), a
per-channel Mul and a scalar Add, a global average pool then Flatten + Gemm; depthwise convs in the layout
(stride 1 and 2, padding read through guards); 24-channel tensors (a one-vector block) next to 16-multiples;
a blocked input with an NCHW output whose channels no block divides; a blocked value also read by an op that
needs NCHW; and the layout switched off."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from conftest import check, make_model, rand
from kiln.compiler import lower
from kiln.graph.ops import from_blocked, to_blocked
from kiln.target import resolve

TOL = 1e-4


def _w(co: int, ci: int, k: int, seed: int) -> np.ndarray:
    return rand(co, ci, k, k, seed=seed) * np.float32(np.sqrt(1.0 / (ci * k * k)))


def _conv(x: str, w: str, b: str | None, y: str, k: int, stride: int = 1, group: int = 1) -> helper.NodeProto:
    ins = [x, w] + ([b] if b else [])
    return helper.make_node("Conv", ins, [y], kernel_shape=[k, k], pads=[k // 2] * 4, strides=[stride] * 2,
                            group=group)


# the graph structure is checked with the Winograd rewrite off (graph/passes/winograd.py turns 3×3 PackedConvs
# into three stages); the numbers are checked with everything on
NO_WINOGRAD = {"winograd": False}


def _ops(model, width: str = "host") -> list[str]:  # noqa: ANN001
    return [n.op for n in lower(model, resolve(width), 2, NO_WINOGRAD, stop_after="kernels").graph.nodes]


def _blocks_of(model, width: str = "host") -> list[tuple[int, int]]:  # noqa: ANN001
    g = lower(model, resolve(width), 2, NO_WINOGRAD, stop_after="kernels").graph
    return [(n.attrs["in_block"], n.attrs["out_block"]) for n in g.nodes if n.op == "PackedConv"]


def test_reorder_round_trip() -> None:
    x = rand(2, 48, 5, 7, seed=1)
    for cb in (8, 16):
        xb = to_blocked(x, cb)
        assert xb.shape == (2, 48 // cb, 5, 7, cb) and xb[1, 2, 3, 4, 5] == x[1, 2 * cb + 5, 3, 4]
        np.testing.assert_array_equal(from_blocked(xb), x)


def test_residual_network_reorders_only_at_the_edges(width: str) -> None:
    """stem conv (NCHW input, 3 channels) → max pool → two residual blocks (one with a strided 1×1 shortcut)
    → global average pool → Flatten → Gemm: every conv and elementwise op blocked, one reorder at the end."""
    x = rand(1, 3, 32, 32, seed=1)
    nodes = [_conv("x", "w0", "b0", "c0", 3, 2), helper.make_node("Relu", ["c0"], ["r0"]),
             helper.make_node("MaxPool", ["r0"], ["p0"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[2, 2]),
             _conv("p0", "w1", "b1", "c1", 3), helper.make_node("Relu", ["c1"], ["r1"]),
             _conv("r1", "w2", "b2", "c2", 3), helper.make_node("Add", ["c2", "p0"], ["a2"]),
             helper.make_node("Relu", ["a2"], ["r2"]),
             _conv("r2", "w3", "b3", "c3", 3, 2), helper.make_node("Relu", ["c3"], ["r3"]),
             _conv("r3", "w4", "b4", "c4", 3), _conv("r2", "w5", None, "c5", 1, 2),
             helper.make_node("Add", ["c4", "c5"], ["a4"]), helper.make_node("Relu", ["a4"], ["r4"]),
             helper.make_node("GlobalAveragePool", ["r4"], ["g"]), helper.make_node("Flatten", ["g"], ["f"]),
             helper.make_node("Gemm", ["f", "wf", "bf"], ["y"], transB=1)]
    consts = {"w0": _w(32, 3, 3, 2), "b0": rand(32, seed=3), "w1": _w(32, 32, 3, 4), "b1": rand(32, seed=5),
              "w2": _w(32, 32, 3, 6), "b2": rand(32, seed=7), "w3": _w(64, 32, 3, 8), "b3": rand(64, seed=9),
              "w4": _w(64, 64, 3, 10), "b4": rand(64, seed=11), "w5": _w(64, 32, 1, 12), "wf": rand(10, 64, seed=13),
              "bf": rand(10, seed=14)}
    model = make_model(nodes, {"x": x}, ["y"], consts)
    ops = _ops(model, width)
    assert ops.count("PackedConv") == 6 and "Conv" not in ops
    assert ops.count("FromBlocked") == 1 and "ToBlocked" not in ops, ops
    assert ops.index("FromBlocked") > ops.index("Reduce")  # after the pooling: a reorder of 64 numbers
    assert all(ob for _, ob in _blocks_of(model, width))
    check(model, {"x": x}, TOL, target=width)
    check(model, {"x": x}, TOL, block_layout=False, target=width)
    check(model, {"x": x}, TOL, winograd=False, target=width)


@pytest.mark.parametrize("pool", ["max", "avg", "avg-count-pads"])
def test_pools_clip_and_constants_in_the_layout(pool: str, width: str) -> None:
    x = rand(1, 32, 15, 13, seed=1)
    attrs = {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "strides": [2, 2]}
    if pool == "avg-count-pads":
        attrs["count_include_pad"] = 1
    nodes = [_conv("x", "w0", "b0", "c0", 3), helper.make_node("Clip", ["c0", "lo", "hi"], ["r0"]),
             helper.make_node("MaxPool" if pool == "max" else "AveragePool", ["r0"], ["p0"], **attrs),
             helper.make_node("Mul", ["p0", "scale"], ["m0"]), helper.make_node("Add", ["m0", "shift"], ["s0"]),
             _conv("s0", "w1", "b1", "y", 3)]
    consts = {"w0": _w(32, 32, 3, 2), "b0": rand(32, seed=3), "lo": np.float32(0), "hi": np.float32(1.5),
              "scale": rand(32, 1, 1, seed=4), "shift": np.float32(0.25), "w1": _w(48, 32, 3, 5),
              "b1": rand(48, seed=6)}
    model = make_model(nodes, {"x": x}, ["y"], consts)
    ops = _ops(model, width)
    assert ops.count("ToBlocked") == 1 and ops.count("FromBlocked") == 1, ops
    check(model, {"x": x}, TOL, target=width)


@pytest.mark.parametrize("stride", [1, 2])
def test_depthwise_in_the_layout(stride: int, width: str) -> None:
    """expand 1×1 → depthwise 3×3 (padding through guards: large border values would leak through a wrong
    mask) → project 1×1 to 24 channels (a one-vector block) + a 24-channel residual where the shapes allow."""
    x = rand(1, 24, 18, 18, seed=1)
    x[..., 0] = 40.0
    x[..., -1, :] = -40.0
    nodes = [_conv("x", "we", "be", "e", 1), helper.make_node("Clip", ["e", "lo", "hi"], ["er"]),
             _conv("er", "wd", "bd", "d", 3, stride, group=96), helper.make_node("Clip", ["d", "lo", "hi"], ["dr"]),
             _conv("dr", "wp", "bp", "p", 1)]
    out = "p"
    if stride == 1:
        nodes.append(helper.make_node("Add", ["p", "x"], ["s"]))
        nodes += [_conv("s", "we2", None, "y", 1)]
        out = "y"
    consts = {"we": _w(96, 24, 1, 2), "be": rand(96, seed=3), "wd": _w(96, 1, 3, 4), "bd": rand(96, seed=5),
              "wp": _w(24, 96, 1, 6), "bp": rand(24, seed=7), "lo": np.float32(0), "hi": np.float32(6),
              "we2": _w(32, 24, 1, 8)}
    model = make_model(nodes, {"x": x}, [out], consts)
    g = lower(model, resolve(width), 2, {}, stop_after="kernels")
    dw = [n for n in g.graph.nodes if n.op == "PackedConv" and n.attrs["group"] > 1]
    assert len(dw) == 1 and dw[0].attrs["in_block"] == dw[0].attrs["out_block"] > 0
    assert not [b for b in g.program.buffers if b.endswith(".pad")], "the depthwise conv made a padded copy"
    check(model, {"x": x}, TOL, target=width)


def test_blocked_input_nchw_output_and_a_mid_chain_nchw_consumer(width: str) -> None:
    """A blocked value read by a conv (blocked) and by a Softmax over channels (needs NCHW: FromBlocked); a
    conv whose 18 output channels no block (of 4, 8, 16 or 32) divides writes NCHW from a blocked input."""
    x = rand(1, 32, 9, 11, seed=1)
    nodes = [_conv("x", "w0", "b0", "c0", 3), helper.make_node("Relu", ["c0"], ["r0"]),
             helper.make_node("Softmax", ["r0"], ["sm"], axis=1), _conv("r0", "w1", "b1", "c1", 3),
             helper.make_node("Relu", ["c1"], ["y"])]
    consts = {"w0": _w(32, 32, 3, 2), "b0": rand(32, seed=3), "w1": _w(18, 32, 3, 4), "b1": rand(18, seed=5)}
    model = make_model(nodes, {"x": x}, ["y", "sm"], consts)
    (_, ob0), (ib1, ob1) = _blocks_of(model, width)
    assert ob0 > 0 and ib1 == ob0 and ob1 == 0
    ops = _ops(model, width)
    assert ops.count("FromBlocked") == 1, ops
    check(model, {"x": x}, TOL, target=width)


def test_switched_off_the_graph_stays_nchw(width: str) -> None:
    x = rand(1, 32, 8, 8, seed=1)
    model = make_model([_conv("x", "w0", "b0", "c0", 3), helper.make_node("Relu", ["c0"], ["r"]),
                        _conv("r", "w1", "b1", "y", 3)], {"x": x}, ["y"],
                       {"w0": _w(32, 32, 3, 2), "b0": rand(32, seed=3), "w1": _w(32, 32, 3, 4), "b1": rand(32, seed=5)})
    g = lower(model, resolve(width), 2, {"block_layout": False}, stop_after="kernels").graph
    assert not [n for n in g.nodes if n.op in ("ToBlocked", "FromBlocked")]
    assert all(not n.attrs.get("out_block") for n in g.nodes if n.op == "PackedConv")


def test_reorders_are_transposes_not_gathers(width: str) -> None:
    """ToBlocked / FromBlocked run as in-register transposes (schedule/reorder.py, codegen/transpose.py)."""
    x = rand(1, 64, 12, 20, seed=1)
    model = make_model([_conv("x", "w0", "b0", "y", 3)], {"x": x}, ["y"],
                       {"w0": _w(64, 64, 3, 2), "b0": rand(64, seed=3)})
    low = lower(model, resolve(width), 2, NO_WINOGRAD, stop_after="llvm")
    names = [k.name for k in low.program.kernels]
    assert any("toblocked" in n for n in names) and any("fromblocked" in n for n in names), names
    assert "masked.gather" not in low.llvm_ir and "masked.scatter" not in low.llvm_ir
    check(model, {"x": x}, TOL, target=width)


def test_box_decided_clamps_and_tests() -> None:
    """schedule/ranges.py: over w < 224 the clamp of w is the identity and w < 224 is true; w − 1 (a padded
    read) keeps its clamp and its test; a variable outside the box keeps everything."""
    from kiln.kernel.ir import Const, Load, Select, Var, cmp, maximum, minimum
    from kiln.schedule.ranges import TRUE, drop_decided

    w, h = Var("w"), Var("h")
    box = {w: 224}

    def clamped(e):  # noqa: ANN001, ANN202
        return minimum(maximum(e, Const(0, "int64")), Const(223, "int64"))

    assert drop_decided(clamped(w), box) == w
    assert drop_decided(cmp("<", w, Const(224, "int64")), box) == TRUE
    assert drop_decided(cmp(">=", w * 2 + 1, Const(1, "int64")), box) == TRUE
    assert drop_decided(clamped(w - 1), box) == clamped(w - 1)
    assert drop_decided(clamped(h), box) == clamped(h)
    read = Load("x", (clamped(w),), "float32")
    guarded = Select(cmp("<", w, Const(224, "int64")), read, Const(0.0, "float32"))
    assert drop_decided(guarded, box) == Load("x", (w,), "float32")
    edge = Select(cmp("<", w + 1, Const(224, "int64")), read, Const(0.0, "float32"))
    assert drop_decided(edge, box) == Select(cmp("<", w + 1, Const(224, "int64")), Load("x", (w,), "float32"),
                                             Const(0.0, "float32"))
