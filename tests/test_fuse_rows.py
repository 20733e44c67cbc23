"""Row fusion (kiln/schedule/fuse_rows.py): a kernel's per-row statistics and their consumer in one parallel loop,
a scratch used one row at a time contracted to a row per thread; Softmax computing exp once; vector reductions of
one update over several partials (codegen/kernel.py: vector_reduce). Numerics against onnxruntime at every x86
width (rtol 1e-5 / 1e-4: float32 sums in another order), structure from the scheduled nest."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper

from conftest import check, make_model, rand
from kiln.compiler import check_options, lower
from kiln.kernel.ir import Alloc, Buffer, Const, Kernel, Load, Loop, Store, Var
from kiln.schedule.fuse_rows import MAX_ROW_BYTES, fuse_rows
from kiln.target import resolve


def _kernels(model: onnx.ModelProto, width: str, **options: bool) -> list[Kernel]:
    return lower(model, resolve(width), 2, check_options(options), stop_after="kernels").program.kernels


def _softmax(shape: tuple[int, ...], axis: int = -1) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    x = rand(*shape, lo=-8.0, hi=8.0, seed=len(shape))
    nodes = [helper.make_node("Mul", ["x", "two"], ["t"]), helper.make_node("Softmax", ["t"], ["y"], axis=axis)]
    return make_model(nodes, {"x": x}, ["y"], consts={"two": np.float32(2.0)}), {"x": x}


@pytest.mark.parametrize("shape", [(2, 12, 64, 64), (40, 1000), (16, 8, 40, 77)])
def test_softmax_is_one_parallel_loop_with_a_row_of_exp_per_thread(shape: tuple[int, ...], width: str) -> None:
    model, feeds = _softmax(shape)
    check(model, feeds, 1e-5, target=width)
    (unfused,) = [k for k in _kernels(model, width, fuse_rows=False) if "softmax" in k.name]
    assert [s.kind for s in unfused.body] == ["parallel"] * 4  # max, exp, 1/Σ, product: big enough to be parallel
    (k,) = [k for k in _kernels(model, width) if "softmax" in k.name]
    loops = [s for s in k.body if isinstance(s, Loop)]
    assert len(k.body) == len(loops) == 1 and loops[0].kind == "parallel", k
    allocs = sorted((int(np.prod(s.shape)) for s in loops[0].body if isinstance(s, Alloc)), reverse=True)
    # exp(x − max) is what one iteration of the parallel loop covers (a row, or rows when the loop is over a block of
    # them), not a scratch the size of x; max and 1/Σ one value per row
    per_iteration = int(np.prod(shape)) // int(loops[0].extent.value)
    if 4 * per_iteration <= MAX_ROW_BYTES:
        assert allocs == [per_iteration] + [per_iteration // shape[-1]] * 2, allocs
        assert not k.scratch, k.scratch
    else:  # too big for each thread's stack: exp stays a scratch the size of x, still read back from its row in L1/L2
        assert allocs == [per_iteration // shape[-1]] * 2 and [b.shape for b in k.scratch] == [shape], k
    # exp is computed once per element: one vector loop evaluates it
    assert str(k).count("exp(") == 1, k


@pytest.mark.parametrize("shape", [(2, 12, 24, 24), (3, 77), (4, 200), (2, 3, 1)])
def test_small_softmax_matches(shape: tuple[int, ...], width: str) -> None:
    model, feeds = _softmax(shape)  # serial loops: not fused, exp in a scratch the size of x
    check(model, feeds, 1e-5, target=width)


@pytest.mark.parametrize("axis", [0, 1, 2])
def test_softmax_over_another_axis_matches(axis: int, width: str) -> None:
    model, feeds = _softmax((60, 200, 33), axis)
    check(model, feeds, 1e-5, target=width)


def test_unfused_softmax_matches_too(width: str) -> None:
    model, feeds = _softmax((3, 12, 50, 50))
    check(model, feeds, 1e-5, target=width, fuse_rows=False)
    (k,) = [k for k in _kernels(model, width, fuse_rows=False) if "softmax" in k.name]
    assert sum(isinstance(s, Loop) and s.kind == "parallel" for s in k.body) == 4


@pytest.mark.parametrize("shape", [(2, 128, 768), (300, 770)])
def test_layernorm_statistics_and_output_in_one_loop(shape: tuple[int, ...], width: str) -> None:
    x = rand(*shape, seed=3)
    g, b = rand(shape[-1], seed=4), rand(shape[-1], seed=5)
    model = make_model([helper.make_node("LayerNormalization", ["x", "g", "b"], ["y"], axis=-1, epsilon=1e-5)],
                       {"x": x}, ["y"], consts={"g": g, "b": b})
    check(model, {"x": x}, 1e-4, target=width)
    (k,) = _kernels(model, width)
    assert [type(s) for s in k.body] == [Loop] and k.body[0].kind == "parallel", k
    assert not k.scratch, k.scratch


@pytest.mark.parametrize("n", [31, 32, 33, 63, 64, 65, 127, 128, 129, 200, 1000])
def test_row_reductions_across_the_partials_threshold(n: int, width: str) -> None:
    # 2 · lanes · 4 partials is where vector_reduce unrolls: 128 at 16 lanes, 64 at 8, 32 at 4
    x = rand(5, n, seed=n)
    x[2, n // 3] = 50.0  # a single largest element, in whichever partial it falls
    nodes = [helper.make_node(op, ["x"], [op], axes=[-1], keepdims=0) for op in ("ReduceMax", "ReduceMin",
                                                                                 "ReduceSumSquare")]
    nodes.append(helper.make_node("ReduceSum", ["x", "axes"], ["ReduceSum"], keepdims=0))  # axes an input at 13
    model = make_model(nodes, {"x": x}, [n.output[0] for n in nodes], consts={"axes": np.array([-1], np.int64)},
                       opset=13)
    check(model, {"x": x}, 1e-5, target=width)


# -- legality, on hand-written nests ----------------------------------------------------------------------------
def _two_loops(read: object, rows: int = 8, extent_b: int = 8) -> tuple[Kernel, list]:
    """t[r] = x[r]·2 for every row, then y[r] = t[read(r)]: fusable only when every row reads its own t."""
    r, q = Var("r"), Var("q")
    x, y, t = Buffer("x", "float32", (rows,)), Buffer("y", "float32", (rows,)), Buffer("t", "float32", (rows,))
    k = Kernel("k", [x, y], [t])
    a = Loop(r, Const(rows, "int64"), [Store("t", (r,), Load("x", (r,), "float32") * 2.0)], "parallel")
    b = Loop(q, Const(extent_b, "int64"), [Store("y", (q,), Load("t", (read(q),), "float32"))], "parallel")
    return k, [a, b]


def test_fuses_and_contracts_when_each_row_reads_its_own() -> None:
    k, nest = _two_loops(lambda q: q)
    out = fuse_rows(k, nest)
    assert len(out) == 1 and isinstance(out[0].body[0], Alloc) and not k.scratch


@pytest.mark.parametrize("case", ["next row", "reversed", "longer loop"])
def test_keeps_the_loops_when_a_row_reads_another_rows_value(case: str) -> None:
    k, nest = {"next row": lambda: _two_loops(lambda q: (q + 1) % 8),
               "reversed": lambda: _two_loops(lambda q: Const(7, "int64") - q),
               "longer loop": lambda: _two_loops(lambda q: q % 8, extent_b=16)}[case]()
    out = fuse_rows(k, nest)
    assert len(out) == 2 and [b.name for b in k.scratch] == ["t"]
