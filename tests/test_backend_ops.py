"""The operators (and operator variants) added for the ONNX conformance suite, each checked against
onnxruntime with the project's op-test helpers — as a graph input → output op and chained between two
kernels (`check_op_chained`), so fusion and views around them are exercised too."""
from __future__ import annotations

import numpy as np
import pytest

from conftest import C, check, check_op, check_op_chained, op_model, rand

ARITH = 1e-5
MATH = 2e-5


def _idx(shape: tuple[int, ...], n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(-n, n, shape).astype(np.int64)


def _scatter_idx(shape: tuple[int, ...], n: int, axis: int) -> np.ndarray:
    """Distinct indices along `axis` (onnxruntime leaves duplicates' order unspecified)."""
    g = np.random.default_rng(1)
    out = np.empty(shape, np.int64)
    for pos in np.ndindex(*[d for i, d in enumerate(shape) if i != axis]):
        perm = g.permutation(n)[:shape[axis]]
        sl = list(pos)
        sl.insert(axis, slice(None))
        out[tuple(sl)] = perm
    return out


CASES = [  # (id, op, args, attrs, opset, n_out, rtol)
    *[(op, op, [rand(3, 17, lo=lo, hi=hi)], {}, 17, 1, MATH) for op, lo, hi in [
        ("Tan", -1.2, 1.2), ("Sinh", -3, 3), ("Cosh", -3, 3), ("Asin", -0.99, 0.99), ("Acos", -0.99, 0.99),
        ("Atan", -5, 5), ("Asinh", -5, 5), ("Acosh", 1.01, 5), ("Atanh", -0.95, 0.95), ("Softsign", -4, 4)]],
    ("IsNaN", "IsNaN", [np.array([1.0, np.nan, np.inf, -np.inf], np.float32)], {}, 17, 1, 0),
    ("IsInf", "IsInf", [np.array([1.0, np.nan, np.inf, -np.inf], np.float32)], {"detect_negative": 0}, 17, 1, 0),
    ("Shrink", "Shrink", [rand(4, 9)], {"lambd": 0.7, "bias": 0.2}, 17, 1, ARITH),
    ("BitwiseAnd", "BitwiseAnd", [rand(3, 8, lo=-50, hi=50, dtype="int32"), rand(8, lo=0, hi=90, dtype="int32")],
     {}, 18, 1, 0),
    ("BitwiseOr", "BitwiseOr", [rand(3, 8, lo=-50, hi=50, dtype="int64"), rand(3, 8, lo=0, hi=9, dtype="int64")],
     {}, 18, 1, 0),
    ("BitwiseXor", "BitwiseXor", [rand(5, lo=-50, hi=50, dtype="int32"), rand(5, lo=0, hi=9, dtype="int32")], {},
     18, 1, 0),
    ("BitwiseNot", "BitwiseNot", [rand(2, 5, lo=-50, hi=50, dtype="int32")], {}, 18, 1, 0),
    ("CastLike", "CastLike", [rand(3, 5, lo=-9, hi=9), C(np.zeros(1, np.int64))], {}, 17, 1, 0),
    ("Clip-runtime-bounds", "Clip", [rand(3, 7), np.array(-0.5, np.float32), np.array(0.8, np.float32)], {}, 17, 1,
     0),
    ("Trilu-upper", "Trilu", [rand(2, 5, 6), C(np.array(1, np.int64))], {}, 17, 1, 0),
    ("Trilu-lower", "Trilu", [rand(5, 4), C(np.array(-1, np.int64))], {"upper": 0}, 17, 1, 0),
    ("Hardmax", "Hardmax", [rand(3, 4, 5)], {"axis": 1}, 17, 1, 0),
    ("DepthToSpace-DCR", "DepthToSpace", [rand(2, 8, 3, 2)], {"blocksize": 2}, 17, 1, 0),
    ("DepthToSpace-CRD", "DepthToSpace", [rand(1, 8, 2, 3)], {"blocksize": 2, "mode": "CRD"}, 17, 1, 0),
    ("SpaceToDepth", "SpaceToDepth", [rand(2, 3, 4, 6)], {"blocksize": 2}, 17, 1, 0),
    ("LpNormalization", "LpNormalization", [rand(3, 7)], {"axis": 1, "p": 1}, 17, 1, ARITH),
    ("MeanVarianceNormalization", "MeanVarianceNormalization", [rand(2, 3, 4, 5)], {}, 17, 1, 1e-4),
    ("GroupNormalization", "GroupNormalization", [rand(2, 6, 3, 4), C(rand(6, seed=1)), C(rand(6, seed=2))],
     {"num_groups": 3}, 21, 1, 1e-4),
    ("LayerNormalization-3-outputs", "LayerNormalization", [rand(2, 3, 8), C(rand(8, seed=1)), C(rand(8, seed=2))],
     {"axis": 1}, 17, 3, 1e-4),
    ("OneHot", "OneHot", [C(np.array([[1, -1, 3], [0, 2, 9]], np.int64)), C(np.array(4, np.int64)),
                          np.array([0.5, 2.0], np.float32)], {"axis": 1}, 17, 1, 0),
    ("EyeLike", "EyeLike", [rand(3, 5)], {"k": 1}, 17, 1, 0),
    ("NonZero", "NonZero", [C(np.array([[1, 0, 2], [0, 0, 3]], np.float32))], {}, 17, 1, 0),
    ("Compress", "Compress", [rand(3, 4), C(np.array([True, False, True]))], {"axis": 0}, 17, 1, 0),
    ("CenterCropPad", "CenterCropPad", [rand(5, 4, 3), C(np.array([3, 7], np.int64))], {"axes": [0, 1]}, 18, 1, 0),
    ("Einsum-matmul", "Einsum", [rand(3, 4), rand(4, 5)], {"equation": "ij,jk->ik"}, 17, 1, 1e-4),
    ("Einsum-batch", "Einsum", [rand(2, 3, 4), rand(2, 4, 5)], {"equation": "bij,bjk->bik"}, 17, 1, 1e-4),
    ("Einsum-ellipsis-transpose", "Einsum", [rand(2, 3, 4)], {"equation": "...ij->...ji"}, 17, 1, 0),
    ("Einsum-sum", "Einsum", [rand(3, 4)], {"equation": "ij->i"}, 17, 1, 1e-5),
    ("Einsum-diagonal", "Einsum", [rand(3, 3)], {"equation": "ii->i"}, 17, 1, 0),
    ("Einsum-outer", "Einsum", [rand(3), rand(4)], {"equation": "i,j->ij"}, 17, 1, 1e-6),
    ("Einsum-implicit", "Einsum", [rand(2, 3), rand(3, 4)], {"equation": "ij,jk"}, 17, 1, 1e-5),
    ("Einsum-attention", "Einsum", [rand(2, 5, 4, 8), rand(2, 6, 4, 8)], {"equation": "bqhd,bkhd->bhqk"}, 17, 1,
     1e-4),
    ("GatherElements", "GatherElements", [rand(3, 4, 5), C(_idx((3, 2, 5), 4))], {"axis": 1}, 17, 1, 0),
    ("GatherND", "GatherND", [rand(2, 3, 4), C(np.array([[[0, 1], [1, 2]], [[1, 0], [0, 3]]], np.int64))],
     {"batch_dims": 1}, 17, 1, 0),
    ("ScatterElements", "ScatterElements", [rand(4, 5), C(_scatter_idx((2, 5), 4, 0)), rand(2, 5, seed=3)],
     {"axis": 0}, 17, 1, 0),
    ("ScatterElements-add", "ScatterElements", [rand(4, 5), C(_idx((3, 5), 4)), rand(3, 5, seed=3)],
     {"axis": 0, "reduction": "add"}, 17, 1, ARITH),
    ("ScatterND", "ScatterND", [rand(4, 5, 3), C(np.array([[1, 2], [3, 0]], np.int64)), rand(2, 3, seed=4)], {},
     17, 1, 0),
    ("ScatterND-mul", "ScatterND", [rand(4, 3), C(np.array([[1], [1]], np.int64)), rand(2, 3, seed=4)],
     {"reduction": "mul"}, 17, 1, ARITH),
    ("Scatter", "Scatter", [rand(4, 5), C(_scatter_idx((4, 2), 5, 1)), rand(4, 2, seed=3)], {"axis": 1}, 10, 1, 0),
    ("CumSum", "CumSum", [rand(3, 6), C(np.array(1, np.int64))], {}, 17, 1, ARITH),
    ("CumSum-exclusive-reverse", "CumSum", [rand(4, 3), C(np.array(0, np.int64))], {"exclusive": 1, "reverse": 1},
     17, 1, ARITH),
    ("TopK", "TopK", [rand(3, 9), C(np.array([4], np.int64))], {"axis": 1}, 17, 2, 0),
    ("TopK-smallest", "TopK", [rand(6, 3), C(np.array([2], np.int64))], {"axis": 0, "largest": 0}, 17, 2, 0),
    ("ReverseSequence", "ReverseSequence", [rand(4, 3, 2), C(np.array([4, 1, 3], np.int64))], {}, 17, 1, 0),
    ("ArgMax-last", "ArgMax", [np.array([[1, 3, 3, 0], [2, 2, 1, 2]], np.float32)],
     {"axis": 1, "select_last_index": 1}, 17, 1, 0),
    ("MaxPool-indices", "MaxPool", [rand(1, 2, 5, 6)], {"kernel_shape": [2, 2], "pads": [1, 1, 0, 0]}, 17, 2, 0),
    ("AveragePool-dilations", "AveragePool", [rand(1, 2, 7, 7)], {"kernel_shape": [2, 2], "dilations": [2, 2],
                                                                   "pads": [1, 1, 1, 1]}, 19, 1, ARITH),
    ("ConvTranspose-output_shape", "ConvTranspose", [rand(1, 2, 3, 3), C(rand(2, 3, 3, 3, seed=5))],
     {"strides": [2, 2], "output_shape": [8, 7]}, 17, 1, 1e-4),
    ("ConvTranspose-auto_pad", "ConvTranspose", [rand(1, 2, 3, 3), C(rand(2, 3, 3, 3, seed=5))],
     {"strides": [2, 2], "auto_pad": "SAME_UPPER"}, 17, 1, 1e-4),
    ("BatchNormalization-training", "BatchNormalization",
     [rand(2, 3, 4), C(rand(3, seed=1)), C(rand(3, seed=2)), C(rand(3, seed=3)), C(rand(3, lo=0.5, hi=2, seed=4))],
     {"training_mode": 1}, 15, 3, 1e-4),
    ("Resize-nearest", "Resize", [rand(1, 2, 3, 4), None, C(np.array([1, 1, 2, 1.5], np.float32))],
     {"mode": "nearest"}, 18, 1, 0),
    ("Resize-linear-sizes", "Resize", [rand(1, 2, 4, 6), None, None, C(np.array([1, 2, 7, 3], np.int64))],
     {"mode": "linear"}, 18, 1, 1e-5),
    ("Resize-linear-align-corners", "Resize", [rand(1, 1, 4, 4), None, C(np.array([1, 1, 2, 2], np.float32))],
     {"mode": "linear", "coordinate_transformation_mode": "align_corners"}, 18, 1, 1e-5),
    ("Resize-cubic-antialias", "Resize", [rand(1, 1, 8, 8), None, C(np.array([1, 1, 0.6, 0.6], np.float32))],
     {"mode": "cubic", "antialias": 1}, 18, 1, 1e-5),
    ("Resize-nearest-asymmetric-floor", "Resize", [rand(1, 2, 3, 4), None, C(np.array([1, 1, 3, 2], np.float32))],
     {"mode": "nearest", "coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"}, 18, 1, 0),
    ("Upsample", "Upsample", [rand(1, 2, 3, 3), C(np.array([1, 1, 2, 3], np.float32))], {"mode": "nearest"}, 9, 1,
     0),
]


@pytest.mark.parametrize("op, args, attrs, opset, n_out, rtol", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_added_op_matches_onnxruntime(op: str, args: list, attrs: dict, opset: int, n_out: int, rtol: float) -> None:
    check_op(op, args, rtol, attrs, opset=opset, n_out=n_out)


CHAINED = ["GatherElements", "ScatterElements", "CumSum", "Trilu-upper", "DepthToSpace-DCR", "Resize-linear-sizes",
           "Einsum-batch", "GroupNormalization", "Hardmax", "Atan", "Sinh"]


@pytest.mark.parametrize("case", CHAINED)
def test_added_op_between_kernels(case: str) -> None:
    _, op, args, attrs, opset, n_out, rtol = next(c for c in CASES if c[0] == case)
    check_op_chained(op, args, max(rtol, 1e-5), attrs, opset=opset, n_out=n_out)


def test_float16_cast_rounds_to_half() -> None:
    """Cast to float16 and back: Kiln's float32 storage rounded to half precision, bit-exact with onnxruntime
    (ties, subnormals, overflow to inf, NaN)."""
    x = np.concatenate([np.random.default_rng(0).standard_normal(200).astype(np.float32) * 10,
                        np.array([65504, 65519.9, 65520, -70000, 1e-5, 3e-8, 2.98e-8, np.nan, np.inf, 0.0,
                                  1 + 2 ** -11, 1 + 3 * 2 ** -11], np.float32)])
    from onnx import TensorProto, helper
    nodes = [helper.make_node("Cast", ["x0"], ["h"], to=TensorProto.FLOAT16),
             helper.make_node("Cast", ["h"], ["y0"], to=TensorProto.FLOAT)]
    model, feeds = op_model("Identity", [x])
    model.graph.ClearField("node")
    model.graph.node.extend(nodes)
    check(model, feeds, rtol=0)


def test_ops_onnxruntime_does_not_have() -> None:
    """Newer than the installed onnxruntime (Swish-24, RMSNormalization-23) or refused by it (Mod fmod=0 on
    floats, defined by Mod-28): through kiln.backend, against NumPy."""
    from onnx import helper

    import kiln.backend

    x = rand(2, 3, 8)
    (y,) = kiln.backend.run_node(helper.make_node("Swish", ["x"], ["y"], alpha=1.5), [x], opset_version=24)
    np.testing.assert_allclose(y, x / (1 + np.exp(-1.5 * x)), rtol=2e-5, atol=1e-6)
    scale = rand(8, seed=1)
    (y,) = kiln.backend.run_node(helper.make_node("RMSNormalization", ["x", "s"], ["y"], epsilon=1e-5), [x, scale],
                                 opset_version=23)
    np.testing.assert_allclose(y, x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-5) * scale, rtol=1e-5, atol=1e-6)
    a, b = rand(3, 7, lo=-9, hi=9), np.array([-2.5, 3, -1, 1.5, 2, -3, 4], np.float32)
    (y,) = kiln.backend.run_node(helper.make_node("Mod", ["a", "b"], ["y"], fmod=0), [a, b], opset_version=28)
    np.testing.assert_allclose(y, np.mod(a, b), rtol=1e-6, atol=1e-6)
