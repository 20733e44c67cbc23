"""Reduce* and ArgMax/ArgMin against onnxruntime, in every opset form of their axes.

Tolerance: 1e-4 relative for reductions (summation order differs); ReduceMax/ReduceMin and
ArgMax/ArgMin are exact."""
from __future__ import annotations

import numpy as np
import pytest

from conftest import C, check_op, expect_unsupported, rand

TOL, EXACT = 1e-4, 0.0
REDUCE = ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
          "ReduceSumSquare", "ReduceLogSumExp", "ReduceLogSum"]

def _x(op: str, shape: tuple[int, ...]) -> np.ndarray:
    if op == "ReduceProd":  # keep products O(1)
        return rand(*shape, lo=0.7, hi=1.3) * np.where(rand(*shape, seed=1) > 0, 1, -1).astype(np.float32)
    if op == "ReduceLogSum":
        return rand(*shape, lo=0.1, hi=3)
    return rand(*shape, lo=-3, hi=3)


def _params(cases: list[tuple]) -> list:
    """pytest params with readable ids (0-d outputs — all axes, keepdims = 0 — included)."""
    out = []
    for c in cases:
        out.append(pytest.param(*c, id="-".join(map(str, c))))
    return out


def _tol(op: str) -> float:
    return EXACT if op in ("ReduceMax", "ReduceMin") else TOL


def reduce_case(op: str, x: np.ndarray, axes: list[int] | None, keepdims: int, opset: int,
                noop: int | None = None) -> None:
    """Axes go where the opset wants them: an attribute before 18 (13 for ReduceSum), an input after."""
    attrs: dict = {"keepdims": keepdims}
    args: list = [x]
    if opset >= 18 or (op == "ReduceSum" and opset >= 13):
        if axes is not None:
            args.append(C(np.array(axes, np.int64)))
        if noop is not None:
            attrs["noop_with_empty_axes"] = noop
    elif axes is not None:
        attrs["axes"] = axes
    check_op(op, args, rtol=_tol(op), attrs=attrs, opset=opset)


AXES = [None, [0], [-1], [1], [1, 2], [0, 2], [-3, -1], [0, 1, 2]]


@pytest.mark.parametrize("op,opset,shape,axes,keepdims", _params(
    [(op, opset, (3, 5, 17), axes, k) for op in REDUCE for opset in (11, 18) for axes in AXES
     for k in (1, 0)]))
def test_reduce(op: str, opset: int, shape: tuple[int, ...], axes: list[int] | None, keepdims: int) -> None:
    reduce_case(op, _x(op, shape), axes, keepdims, opset)


RANKS = [((7,), [0]), ((33,), None), ((2, 3, 4, 5), [1, 3]), ((2, 3, 4, 5), [-2]),
         ((2, 1, 3, 4, 5), [0, 2, 4]), ((2, 1, 3, 4, 5), [1]), ((65, 1025), [1]), ((65, 1025), [0]),
         ((4, 16), [1]), ((4, 15), [-1]), ((5, 7), [1]), ((3, 4, 33), [1, 2])]


@pytest.mark.parametrize("op,opset,shape,axes,keepdims", _params(
    [(op, opset, shape, axes, k) for op in REDUCE for shape, axes in RANKS
     for opset, k in ((13, 1), (18, 0))]))
def test_reduce_ranks(op: str, opset: int, shape: tuple[int, ...], axes: list[int] | None,
                      keepdims: int) -> None:
    reduce_case(op, _x(op, shape), axes, keepdims, opset)


@pytest.mark.parametrize("op,opset", [("ReduceSum", 13)] + [(op, 18) for op in REDUCE])
def test_reduce_noop_with_empty_axes(op: str, opset: int) -> None:
    """No axes (or empty axes) input with noop_with_empty_axes=1: no reduction, only the per-element term
    (|x| for L1/L2, x² for SumSquare, log x for LogSum), as onnxruntime does."""
    x = _x(op, (3, 5, 7))
    reduce_case(op, x, None, 1, opset, noop=1)
    reduce_case(op, x, [], 0, opset, noop=1)
    reduce_case(op, x, None, 1, opset, noop=0)


def test_reduction_to_0d() -> None:
    """ReduceSum of a (7,) vector, keepdims=0: a 0-d output (its accumulator lives at kernel top level)."""
    check_op("ReduceSum", [rand(7)], rtol=TOL, attrs={"keepdims": 0}, opset=11)


@pytest.mark.parametrize("op", REDUCE)
def test_reduce_noop0_empty_axes_keepdims0(op: str) -> None:
    reduce_case(op, _x(op, (3, 5, 7)), None, 0, 18, noop=0)


def test_reduce_sum_axes_input_opset13_runtime_is_unsupported() -> None:
    expect_unsupported("ReduceSum", [rand(3, 5), np.array([1], np.int64)], opset=13, match="axes")


@pytest.mark.parametrize("dtype", ["int64", "int32"])
@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceMean"])
def test_reduce_int(op: str, dtype: str) -> None:
    """Integer reductions; ReduceMean divides the integer sum (truncating), as onnxruntime does."""
    x = rand(3, 5, 7, lo=-4, hi=5, dtype=dtype)
    check_op(op, [x, C(np.array([1], np.int64))], rtol=EXACT, opset=18)
    check_op(op, [x, C(np.array([0, 2], np.int64))], rtol=EXACT, attrs={"keepdims": 0}, opset=18)


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceL2", "ReduceLogSumExp"])
def test_reduce_float64(op: str) -> None:
    x = _x(op, (3, 5, 17)).astype(np.float64)
    check_op(op, [x, C(np.array([0, 2], np.int64))], rtol=_tol(op), opset=18)


@pytest.mark.parametrize("op", REDUCE)
def test_reduce_constant_folded(op: str) -> None:
    check_op(op, [C(_x(op, (3, 5, 7))), C(np.array([0, 2], np.int64))], rtol=_tol(op), opset=18)


# -- ArgMax / ArgMin -----------------------------------------------------------------------------------------
ARG = [((17,), 0), ((3, 33), 0), ((3, 33), 1), ((3, 33), -1), ((2, 3, 17), 1), ((2, 3, 4, 5), 2),
       ((2, 3, 4, 5), -4), ((2, 1, 3, 4, 5), 4), ((2, 1, 3, 4, 5), 1), ((65, 1025), 1)]


@pytest.mark.parametrize("op,shape,axis,keepdims", _params(
    [(op, shape, [axis], k) for op in ("ArgMax", "ArgMin") for shape, axis in ARG for k in (1, 0)]))
def test_argreduce(op: str, shape: tuple[int, ...], axis: list[int], keepdims: int) -> None:
    """Integer-valued floats: ties everywhere, and the first index must win."""
    x = rand(*shape, lo=-3, hi=4, dtype="int64").astype(np.float32)
    check_op(op, [x], rtol=EXACT, attrs={"axis": axis[0], "keepdims": keepdims})


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
def test_argreduce_defaults_and_int64(op: str) -> None:
    check_op(op, [rand(5, 7, 3)], rtol=EXACT)
    check_op(op, [rand(5, 7, 3, lo=-50, hi=50, dtype="int64")], rtol=EXACT, attrs={"axis": 1, "keepdims": 0})
    check_op(op, [C(rand(5, 7, 3))], rtol=EXACT, attrs={"axis": 2})


def test_argmax_select_last_index() -> None:
    x = np.repeat(rand(3, 5), 2, axis=1)  # ties everywhere: first and last index differ
    check_op("ArgMax", [x], rtol=EXACT, attrs={"select_last_index": 1})
