"""In-place outputs in the static memory plan: a kernel that reads an arena buffer only at the point it
writes (a residual add in a conv epilogue, an elementwise op) and is that buffer's last reader writes its
output over it. Outputs checked against onnxruntime (tolerance 1e-4 relative: the convs' sums are ordered
differently), placements checked in the plan."""
from __future__ import annotations

import re

from onnx import helper

from conftest import check, make_model, rand
from kiln.compiler import lower
from kiln.target import resolve

TOL = 1e-4


def _plan(model):
    return lower(model, resolve("host"), 2, {}, stop_after="kernels").plan


def _place(plan, value: str):
    """The placement of the graph value named `value` (the importer names values `Op:name.N`; the blocked
    layout's twin of a value `Op:name.N.blocked.M`, graph/passes/block_layout.py)."""
    found = {k: p for k, p in plan.places.items()
             if re.sub(r"\.blocked\.\d+$", "", k.split(":")[-1]).rsplit(".", 1)[0] == value}
    blocked = [p for k, p in found.items() if ".blocked." in k]  # the twin the blocked kernels read and write
    (p,) = blocked or list(found.values())
    return p


def _block(a_read_later: bool):
    """A residual block: a = relu(conv1(x)); b = relu(conv_b(a)); y = relu(conv2(b) + a); out = conv3(y)
    [+ a when a is read again later]. (y = relu(conv(a) + a) would not qualify: the conv reads a's
    neighbours after y's first elements are written.)"""
    x = rand(1, 32, 12, 12, seed=1)
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c1"], ["a"]),
             helper.make_node("Conv", ["a", "wb"], ["cb"]), helper.make_node("Relu", ["cb"], ["b"]),
             helper.make_node("Conv", ["b", "w2"], ["c2"]), helper.make_node("Add", ["c2", "a"], ["s"]),
             helper.make_node("Relu", ["s"], ["y"]), helper.make_node("Conv", ["y", "w3"], ["c3"])]
    nodes.append(helper.make_node("Add", ["c3", "a"], ["out"]) if a_read_later else
                 helper.make_node("Identity", ["c3"], ["out"]))
    consts = {"w1": rand(32, 32, 3, 3, seed=2) * 0.2, "w2": rand(32, 32, 1, 1, seed=3) * 0.2,
              "w3": rand(32, 32, 1, 1, seed=4) * 0.2, "wb": rand(32, 32, 1, 1, seed=5) * 0.2}
    return make_model(nodes, {"x": x}, ["out"], consts), {"x": x}


def test_residual_epilogue_writes_over_its_dying_input() -> None:
    model, feeds = _block(a_read_later=False)
    plan = _plan(model)
    assert _place(plan, "y").kind == "arena" and _place(plan, "y") == _place(plan, "a")
    check(model, feeds, TOL)
    unplanned = lower(model, resolve("host"), 2, {"memory_reuse": False}, stop_after="kernels").plan
    assert _place(unplanned, "y") != _place(unplanned, "a")  # memory_reuse=False switches it off too


def test_no_overwrite_of_a_buffer_read_later() -> None:
    model, feeds = _block(a_read_later=True)
    plan = _plan(model)
    assert _place(plan, "y") != _place(plan, "a"), "a is read after y is written: y must not overwrite it"
    check(model, feeds, TOL)


def test_elementwise_op_reuses_storage_in_place() -> None:
    """c = conv(x) has two readers, so it is materialized; s = sigmoid(c)·c is computed into c's storage
    (c dies there); out = conv(s)."""
    x = rand(1, 16, 10, 10, seed=1)
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c"]), helper.make_node("Sigmoid", ["c"], ["g"]),
             helper.make_node("Mul", ["g", "c"], ["s"]), helper.make_node("Conv", ["s", "w2"], ["out"])]
    consts = {"w1": rand(16, 16, 1, 1, seed=2), "w2": rand(8, 16, 1, 1, seed=3)}
    model = make_model(nodes, {"x": x}, ["out"], consts)
    plan = _plan(model)
    assert _place(plan, "s") == _place(plan, "c")
    check(model, {"x": x}, TOL)
