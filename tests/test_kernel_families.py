"""Kernel families (kiln/codegen/families.py): functions equal up to constants of their index arithmetic compiled once.

The pass on hand-written LLVM IR, run by LLVM's JIT before and after (the same values stored, and what it must leave
alone left alone); then a model whose 1×1 convs differ only in their channel counts, at every x86 width, in one
module and split into compile units: the family is formed, and the outputs equal the build without it bit for bit and
onnxruntime's within 1e-4 of the largest output."""
from __future__ import annotations

import ctypes
import re

import numpy as np
import pytest
from onnx import helper

from conftest import check, make_model, rand, run_kiln
from kiln.codegen import jit, split
from kiln.codegen.families import merge_families
from kiln.codegen.module import build_unit_text
from kiln.compiler import lower
from kiln.explain import explain
from kiln.target import host, resolve

TOL = 1e-4


def _loop(name: str, trip: int, scale: int, offset: int = 0, attrs: str = "noinline") -> str:
    """out[i + offset] = i * scale + base for i < trip."""
    return f'''define internal void @"{name}"(ptr %".1", i64 %".2") {attrs}
{{
entry:
  br label %"head"
head:
  %".3" = phi i64 [0, %"entry"], [%".6", %"body"]
  %".4" = icmp slt i64 %".3", {trip}
  br i1 %".4", label %"body", label %"done"
body:
  %".5" = mul i64 %".3", {scale}
  %".7" = add i64 %".5", %".2"
  %".8" = getelementptr i64, ptr %".1", i64 %".3"
  %".9" = getelementptr i64, ptr %".8", i64 {offset}
  store i64 %".7", ptr %".9"
  %".6" = add i64 %".3", 1
  br label %"head"
done:
  ret void
}}
'''


def _module(funcs: list[tuple[str, int, int, int]]) -> str:
    entries = "".join(f'define void @"run_{n}"(ptr %".1") {{\nentry:\n  call void @"{n}"(ptr %".1", i64 1000)\n'
                      f"  ret void\n}}\n" for n, *_ in funcs)
    return "".join(_loop(*f) for f in funcs) + entries


def _run(text: str, names: list[str]) -> dict[str, np.ndarray]:
    """Each run_<name>(out) on a fresh buffer of 16 int64 (-1 where nothing is stored)."""
    tgt = host()
    obj = jit.emit_object(jit.optimize(text, tgt), tgt)
    loaded = jit.LoadedObject(obj, tgt)
    out = {}
    for n in names:
        buf = np.full(16, -1, dtype=np.int64)
        ctypes.CFUNCTYPE(None, ctypes.c_void_p)(loaded.address(f"run_{n}"))(buf.ctypes.data)
        out[n] = buf
    return out


def test_members_call_one_function_with_their_constants() -> None:
    funcs = [("a", 5, 7, 0), ("b", 9, 3, 0), ("c", 5, 7, 0)]  # a, b: trip count and scale differ; c equals a
    text = _module(funcs)
    merged = merge_families(text)
    assert merged.count('.family"(ptr') == 4  # the family's definition, and one call from each member
    family = re.search(r'define internal void @"a\.family"\(ptr %"\.1", i64 %"\.2", i64 %"famarg\.0", '
                       r'i64 %"famarg\.1"\) noinline', merged)
    assert family, merged
    assert 'tail call void @"a.family"(ptr %".1", i64 %".2", i64 9, i64 3)' in merged
    before, after = _run(text, ["a", "b", "c"]), _run(merged, ["a", "b", "c"])
    for n, trip, scale, _ in funcs:
        want = np.full(16, -1, dtype=np.int64)
        want[:trip] = np.arange(trip) * scale + 1000
        np.testing.assert_array_equal(before[n], want)
        np.testing.assert_array_equal(after[n], want)


def test_what_must_stay_constant_stays() -> None:
    """A getelementptr offset (it folds into addressing), and a family past its argument budget: no merge."""
    offsets = _module([("a", 5, 7, 0), ("b", 5, 7, 3)])
    assert merge_families(offsets) == offsets
    two_args = _module([("a", 5, 7, 0), ("b", 9, 3, 0)])
    assert merge_families(two_args, max_args=1) == two_args
    assert merge_families(_module([("a", 5, 7, 0)])) == _module([("a", 5, 7, 0)])  # one function: no family
    inlined = _loop("a", 5, 7, 0, "alwaysinline") + _loop("b", 9, 3, 0, "alwaysinline")
    assert merge_families(inlined) == inlined  # to be inlined where called: nothing to share
    out = _run(offsets, ["a", "b"])
    assert list(out["b"][3:8]) == [1000, 1007, 1014, 1021, 1028]


def _bottleneck() -> tuple:
    """1×1 convs with ReLU at 14×14, 64 → 64 → 256 → 64 channels: a ResNet bottleneck without its 3×3 (two of its
    convs come out of codegen equal up to their channel counts, at every x86 width)."""
    x = rand(1, 64, 14, 14, seed=1)
    nodes = [helper.make_node("Conv", ["x", "w0", "b0"], ["a"], name="conv0"),
             helper.make_node("Relu", ["a"], ["b"], name="relu0"),
             helper.make_node("Conv", ["b", "w1", "b1"], ["c"], name="conv1"),
             helper.make_node("Relu", ["c"], ["d"], name="relu1"),
             helper.make_node("Conv", ["d", "w2", "b2"], ["e"], name="conv2"),
             helper.make_node("Relu", ["e"], ["y"], name="relu2")]
    consts = {"w0": rand(64, 64, 1, 1, seed=2), "b0": rand(64, seed=3), "w1": rand(256, 64, 1, 1, seed=4),
              "b1": rand(256, seed=5), "w2": rand(64, 256, 1, 1, seed=6), "b2": rand(64, seed=7)}
    return make_model(nodes, {"x": x}, ["y"], consts), {"x": x}


@pytest.mark.parametrize("units", [1, 2])
def test_model_family_at_every_width(width: str, units: int, monkeypatch: pytest.MonkeyPatch) -> None:
    model, feeds = _bottleneck()
    ir = lower(model, resolve(width), 2, {}, stop_after="llvm").llvm_ir
    assert re.search(r'^define internal void @"[^"]+\.family"', ir, re.M), "no kernel family formed"
    assert not re.search(r"\.family", lower(model, resolve(width), 2, {"kernel_families": False},
                                            stop_after="llvm").llvm_ir)
    if units > 1:  # split into compile units over two processes: the family's members dealt to one unit
        monkeypatch.setattr(split, "MIN_KERNELS", 1)
        monkeypatch.setenv(split.JOBS_ENV, "2")
        prog = lower(model, resolve(width), 2, {}, stop_after="kernels").program
        dealt = split.split_kernels(prog, 2)
        assert len(dealt) > 1
        unit_of = {i: u for u, unit in enumerate(dealt) for i in unit}
        for i in unit_of:
            for j in unit_of:
                if split.family_key(prog.kernels[i]) == split.family_key(prog.kernels[j]):
                    assert unit_of[i] == unit_of[j]
        texts = [merge_families(build_unit_text(prog, unit, resolve(width))) for unit in dealt]  # as the workers do
        assert any(re.search(r'^define internal void @"[^"]+\.family"', t, re.M) for t in texts)
    with_families = check(model, feeds, TOL, target=width)
    without = run_kiln(model, feeds, target=width, kernel_families=False)
    if with_families is not None:
        np.testing.assert_array_equal(with_families[0], without[0])


def test_explain_shows_the_family_a_member_calls() -> None:
    """`kiln explain` on a member kernel prints the family's function too, not only the call."""
    model, _ = _bottleneck()
    members = 0
    for node in ("conv0", "conv1", "conv2"):
        text = explain(model, node=node, stages=["llvm"], num_threads=2)
        for family in re.findall(r'call void @"([^"]+\.family)"\(', text):
            members += 1
            assert re.search(r'^define internal void @"' + re.escape(family) + r'"\(', text, re.M), text
    assert members >= 2
