"""Pooling, normalizations, Softmax/LogSoftmax against onnxruntime.

Tolerances: MaxPool and BatchNormalization alone are plain arithmetic (1e-5); windows that sum
(AveragePool, LpPool), normalizations over axes and softmax are reductions or transcendental (1e-4)."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from conftest import C, check_op, rand

ARITH, TOL = 1e-5, 1e-4


# -- MaxPool / AveragePool / LpPool --------------------------------------------------------------------------
# (x shape, attrs)
POOL = {
    "1d": ((1, 3, 17), {"kernel_shape": [3]}),
    "1d-stride-pads": ((2, 3, 17), {"kernel_shape": [4], "strides": [3], "pads": [1, 2]}),
    "2d": ((2, 3, 7, 9), {"kernel_shape": [3, 3]}),
    "2d-stride": ((1, 3, 9, 11), {"kernel_shape": [3, 2], "strides": [2, 3]}),
    "2d-pads": ((1, 3, 7, 9), {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}),
    "2d-pads-asym": ((1, 2, 7, 9), {"kernel_shape": [3, 4], "pads": [0, 1, 2, 2], "strides": [2, 2]}),
    "2d-ceil": ((1, 3, 8, 10), {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1}),
    "2d-ceil-pads": ((1, 3, 7, 9), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1],
                                    "ceil_mode": 1}),
    "2d-ceil-exact": ((1, 3, 9, 9), {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1}),
    "2d-ceil-s3": ((1, 2, 10, 11), {"kernel_shape": [2, 2], "strides": [3, 3], "pads": [1, 0, 1, 0],
                                    "ceil_mode": 1}),
    "2d-same-upper": ((1, 3, 7, 9), {"kernel_shape": [3, 3], "strides": [2, 2], "auto_pad": "SAME_UPPER"}),
    "2d-same-lower": ((1, 3, 7, 9), {"kernel_shape": [2, 3], "strides": [2, 2], "auto_pad": "SAME_LOWER"}),
    "2d-valid": ((1, 3, 7, 9), {"kernel_shape": [3, 3], "strides": [2, 2], "auto_pad": "VALID"}),
    "2d-big": ((1, 16, 65, 65), {"kernel_shape": [3, 3], "strides": [1, 1], "pads": [1, 1, 1, 1]}),
    "3d": ((1, 2, 5, 6, 7), {"kernel_shape": [2, 3, 3], "strides": [1, 2, 2], "pads": [0, 1, 1, 1, 0, 1]}),
    "3d-ceil": ((1, 2, 6, 7, 8), {"kernel_shape": [3, 3, 3], "strides": [2, 2, 2], "ceil_mode": 1}),
}


@pytest.mark.parametrize("case", list(POOL))
def test_maxpool(case: str, width: str) -> None:
    xs, attrs = POOL[case]
    check_op("MaxPool", [rand(*xs)], rtol=ARITH, attrs=attrs, target=width)


@pytest.mark.parametrize("case", ["1d-stride-pads", "2d-pads", "2d-ceil-pads", "3d"])
def test_maxpool_negative_inputs_in_padding(case: str) -> None:
    """All-negative inputs: padding must act as −∞, not 0."""
    xs, attrs = POOL[case]
    check_op("MaxPool", [rand(*xs, lo=-3, hi=-1)], rtol=ARITH, attrs=attrs)


@pytest.mark.parametrize("case", [("1d", [2], [2]), ("2d", [2, 2], [1, 1]), ("2d-pads", [2, 1], [1, 2]),
                                  ("2d-ceil-pads", [1, 2], [1, 1]), ("3d", [1, 2, 1], [1, 1, 1])],
                         ids=lambda c: c[0])
def test_maxpool_dilations(case: tuple) -> None:
    name, dil, _ = case
    xs, attrs = POOL[name]
    check_op("MaxPool", [rand(*xs)], rtol=ARITH, attrs={**attrs, "dilations": dil})


@pytest.mark.parametrize("include_pad", [0, 1])
@pytest.mark.parametrize("case", [c for c in POOL if "same" not in c])
def test_averagepool(case: str, include_pad: int, width: str) -> None:
    xs, attrs = POOL[case]
    check_op("AveragePool", [rand(*xs)], rtol=TOL, attrs={**attrs, "count_include_pad": include_pad}, target=width)


@pytest.mark.parametrize("include_pad", [0, 1])
@pytest.mark.parametrize("case", ["2d-same-upper", "2d-same-lower"])
def test_averagepool_same(case: str, include_pad: int) -> None:
    xs, attrs = POOL[case]
    check_op("AveragePool", [rand(*xs)], rtol=TOL, attrs={**attrs, "count_include_pad": include_pad})


def test_averagepool_dilations() -> None:
    check_op("AveragePool", [rand(1, 2, 7, 7)], rtol=TOL, attrs={"kernel_shape": [2, 2], "dilations": [2, 2]},
             opset=19)


def test_maxpool_indices_output() -> None:
    check_op("MaxPool", [rand(1, 2, 7, 7)], rtol=0.0, attrs={"kernel_shape": [2, 2]}, n_out=2)  # exact


@pytest.mark.parametrize("p", [1, 2, 3])
@pytest.mark.parametrize("case", ["1d-stride-pads", "2d", "2d-stride", "2d-pads-asym", "3d"])
def test_lppool(case: str, p: int) -> None:
    xs, attrs = POOL[case]
    check_op("LpPool", [rand(*xs)], rtol=TOL, attrs={**attrs, "p": p})


@pytest.mark.parametrize("shape", [(1, 3, 17), (2, 3, 7, 9), (1, 17, 1, 1), (2, 2, 3, 4, 5), (1, 16, 65, 65)],
                         ids=str)
@pytest.mark.parametrize("op", ["GlobalAveragePool", "GlobalMaxPool"])
def test_global_pool(op: str, shape: tuple[int, ...]) -> None:
    check_op(op, [rand(*shape)], rtol=TOL if op == "GlobalAveragePool" else ARITH)


# -- BatchNormalization --------------------------------------------------------------------------------------
def _bn_params(c: int, seed: int = 5) -> list[C]:
    return [C(rand(c, lo=0.5, hi=2, seed=seed)), C(rand(c, seed=seed + 1)), C(rand(c, seed=seed + 2)),
            C(rand(c, lo=0.1, hi=3, seed=seed + 3))]


@pytest.mark.parametrize("shape", [(5, 7), (2, 3, 17), (2, 3, 7, 9), (1, 17, 5, 5), (2, 3, 2, 3, 5)], ids=str)
@pytest.mark.parametrize("epsilon", [1e-5, 1e-2])
def test_batchnorm(shape: tuple[int, ...], epsilon: float) -> None:
    check_op("BatchNormalization", [rand(*shape)] + _bn_params(shape[1]), rtol=ARITH,
             attrs={"epsilon": epsilon})


def _conv_bn_model(bias: bool, opset: int = 17):  # noqa: ANN202
    from conftest import make_model
    x = rand(2, 3, 9, 11)
    consts = {"w": rand(5, 3, 3, 3, seed=1), "b": rand(5, seed=2), "g": rand(5, lo=0.5, hi=2, seed=3),
              "beta": rand(5, seed=4), "m": rand(5, seed=5), "v": rand(5, lo=0.1, hi=3, seed=6)}
    if not bias:
        del consts["b"]
    nodes = [helper.make_node("Conv", ["x", "w"] + (["b"] if bias else []), ["c"], pads=[1, 1, 1, 1],
                              strides=[1, 2]),
             helper.make_node("BatchNormalization", ["c", "g", "beta", "m", "v"], ["y"], epsilon=1e-3)]
    return make_model(nodes, {"x": x}, ["y"], consts, opset), {"x": x}


@pytest.mark.parametrize("fold", [True, False], ids=["folded", "unfolded"])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
def test_conv_batchnorm(bias: bool, fold: bool) -> None:
    from conftest import check
    model, feeds = _conv_bn_model(bias)
    check(model, feeds, rtol=TOL, fold_batchnorm=fold)


GEMM_BN = [(None, {}, False), ((17,), {}, False), ((1, 17), {}, True), ((5, 1), {}, True),
           ((5, 17), {}, True), ((), {"transB": 1}, False), ((17,), {"alpha": 0.5, "beta": 2.0}, False)]


@pytest.mark.parametrize("c_shape,attrs,fold", [
    pytest.param(c, a, fold, marks=[],
                 id=f"{c}-{a}-{'folded' if fold else 'unfolded'}")
    for c, a, _ in GEMM_BN for fold in (True, False)])
def test_gemm_batchnorm(c_shape: tuple[int, ...] | None, attrs: dict, fold: bool) -> None:
    from conftest import check, make_model
    x = rand(5, 7)
    w = rand(17, 7, seed=1) if attrs.get("transB") else rand(7, 17, seed=1)
    consts = {"w": w, "g": rand(17, lo=0.5, hi=2, seed=3), "beta": rand(17, seed=4), "m": rand(17, seed=5),
              "v": rand(17, lo=0.1, hi=3, seed=6)}
    gemm_in = ["x", "w"]
    if c_shape is not None:
        consts["c"] = rand(*c_shape, seed=2)
        gemm_in.append("c")
    nodes = [helper.make_node("Gemm", gemm_in, ["h"], **attrs),
             helper.make_node("BatchNormalization", ["h", "g", "beta", "m", "v"], ["y"])]
    check(make_model(nodes, {"x": x}, ["y"], consts), {"x": x}, rtol=TOL, fold_batchnorm=fold)


def test_gemm_2d_bias_then_batchnorm() -> None:
    """Gemm with a (1, N) bias, then BatchNormalization (folding once crashed at compile here)."""
    from conftest import check, make_model
    one, zero = np.ones(4, np.float32), np.zeros(4, np.float32)
    x, consts = rand(2, 3), {"w": rand(3, 4, seed=1), "c": rand(1, 4, seed=2), "g": one, "b": zero, "m": zero,
                             "v": one}
    nodes = [helper.make_node("Gemm", ["x", "w", "c"], ["h"]),
             helper.make_node("BatchNormalization", ["h", "g", "b", "m", "v"], ["y"])]
    check(make_model(nodes, {"x": x}, ["y"], consts), {"x": x}, rtol=TOL)


# -- LayerNormalization / InstanceNormalization / LRN --------------------------------------------------------
LN = [((17,), -1), ((3, 33), -1), ((2, 3, 17), -1), ((2, 3, 17), -2), ((2, 3, 17), 1), ((2, 3, 17), 0),
      ((2, 3, 4, 5), -1), ((2, 3, 4, 5), 2), ((1, 2, 3, 4, 5), -3), ((4, 129, 65), -1)]


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
@pytest.mark.parametrize("shape,axis", LN, ids=str)
def test_layernorm(shape: tuple[int, ...], axis: int, bias: bool) -> None:
    norm = shape[axis % len(shape):]
    args = [rand(*shape, lo=-3, hi=5), C(rand(*norm, lo=0.5, hi=2, seed=1))]
    args += [C(rand(*norm, seed=2))] if bias else []
    check_op("LayerNormalization", args, rtol=TOL, attrs={"axis": axis, "epsilon": 1e-5})


def test_layernorm_runtime_scale_and_bias() -> None:
    check_op("LayerNormalization", [rand(2, 3, 17), rand(17, seed=1), rand(17, seed=2)], rtol=TOL)


def test_layernorm_mean_and_invstddev_outputs() -> None:
    check_op("LayerNormalization", [rand(2, 17), C(rand(17))], rtol=TOL, n_out=3)


@pytest.mark.parametrize("shape", [(2, 3, 17), (1, 4, 5, 7), (2, 3, 2, 3, 5), (1, 16, 33, 33)], ids=str)
def test_instancenorm(shape: tuple[int, ...]) -> None:
    c = shape[1]
    check_op("InstanceNormalization", [rand(*shape, lo=-1, hi=3), C(rand(c, lo=0.5, hi=2, seed=1)),
                                       C(rand(c, seed=2))], rtol=TOL, attrs={"epsilon": 1e-4})


@pytest.mark.parametrize("size,attrs", [(1, {}), (3, {"alpha": 1e-2, "beta": 0.5, "bias": 2.0}), (5, {}),
                                        (7, {"alpha": 0.1, "beta": 0.9})], ids=str)
@pytest.mark.parametrize("shape", [(1, 7, 5, 5), (2, 17, 3, 3), (1, 3, 1, 33)], ids=str)
def test_lrn(shape: tuple[int, ...], size: int, attrs: dict) -> None:
    check_op("LRN", [rand(*shape)], rtol=TOL, attrs={"size": size, **attrs})


def lrn_spec(x: np.ndarray, size: int, alpha: float = 1e-4, beta: float = 0.75,
             bias: float = 1.0) -> np.ndarray:
    """The ONNX spec's LRN in NumPy: channels max(0, c − ⌊(size−1)/2⌋) … min(C−1, c + ⌈(size−1)/2⌉)."""
    sq = np.zeros_like(x, dtype=np.float64)
    lo_off, hi_off = (size - 1) // 2, -(-(size - 1) // 2)
    for c in range(x.shape[1]):
        sq[:, c] = (x[:, max(0, c - lo_off):c + hi_off + 1].astype(np.float64) ** 2).sum(axis=1)
    return (x / (bias + alpha / size * sq) ** beta).astype(np.float32)


@pytest.mark.parametrize("shape,size", [((1, 7, 5, 5), 2), ((2, 5, 3, 3), 4), ((1, 4, 2, 3, 5), 3),
                                        ((1, 6, 17), 6)], ids=str)
def test_lrn_even_size_and_other_ranks(shape: tuple[int, ...], size: int) -> None:
    """onnxruntime (and onnx.reference) only run 4-D LRN with odd sizes: compare with the spec in NumPy,
    after checking that NumPy version against onnxruntime on a case it runs."""
    from conftest import assert_close, op_model, run_kiln, run_ort
    x = rand(1, 7, 5, 5, seed=3)
    assert_close(lrn_spec(x, 3, alpha=0.1), run_ort(*op_model("LRN", [x], {"size": 3, "alpha": 0.1}))[0], TOL)
    x = rand(*shape)
    model, feeds = op_model("LRN", [x], {"size": size, "alpha": 0.1})
    model.graph.output[0].type.tensor_type.elem_type = 1
    assert_close(run_kiln(model, feeds)[0], lrn_spec(x, size, alpha=0.1), TOL)


# -- Softmax / LogSoftmax ------------------------------------------------------------------------------------
SOFTMAX = [((17,), [0, -1]), ((3, 33), [0, 1, -1]), ((2, 3, 17), [0, 1, 2]), ((2, 3, 5, 7), [0, 1, 2, 3, -2]),
           ((2, 1, 3, 4, 5), [0, 2, 4]), ((33, 1025), [1])]
SOFTMAX_CASES = [(s, a) for s, axes in SOFTMAX for a in axes]


@pytest.mark.parametrize("opset", [11, 13])
@pytest.mark.parametrize("shape,axis", SOFTMAX_CASES, ids=str)
@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
def test_softmax(op: str, shape: tuple[int, ...], axis: int, opset: int) -> None:
    """opset 11 flattens from `axis` on (one softmax per row of the 2-D view); 13 normalizes one axis."""
    check_op(op, [rand(*shape, lo=-10, hi=10)], rtol=TOL, attrs={"axis": axis}, opset=opset)


@pytest.mark.parametrize("opset", [11, 13])
@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
def test_softmax_default_axis(op: str, opset: int) -> None:
    check_op(op, [rand(2, 3, 5, 7, lo=-10, hi=10)], rtol=TOL, opset=opset)


def test_softmax_large_logits() -> None:
    """Max subtraction: logits around ±80 must not overflow exp."""
    check_op("Softmax", [rand(3, 17, lo=-90, hi=90)], rtol=TOL, attrs={"axis": -1})
    check_op("LogSoftmax", [rand(3, 17, lo=-90, hi=90)], rtol=TOL, attrs={"axis": -1})


def test_batchnorm_constants_folded_with_constant_input() -> None:
    check_op("BatchNormalization", [C(rand(2, 3, 5))] + _bn_params(3), rtol=ARITH)




# -- float64 -------------------------------------------------------------------------------------------------
def test_float64_normalizations_softmax_pool() -> None:
    x = rand(2, 3, 5, 17, dtype="float64")
    scale, bias = C(rand(17, seed=1, dtype="float64")), C(rand(17, seed=2, dtype="float64"))
    check_op("LayerNormalization", [x, scale, bias], rtol=TOL, attrs={"axis": -2})
    check_op("Softmax", [x], rtol=TOL, attrs={"axis": 1})
    check_op("LogSoftmax", [x], rtol=TOL, attrs={"axis": -1})
    bn = [C(rand(3, lo=0.5, hi=2, seed=i, dtype="float64")) for i in range(4)]
    check_op("BatchNormalization", [x] + bn, rtol=ARITH)
    pool = {"kernel_shape": [2, 3], "pads": [1, 1, 0, 1], "strides": [2, 2]}
    check_op("MaxPool", [x], rtol=ARITH, attrs=pool)


def test_float64_lrn_against_spec() -> None:
    """onnxruntime has no float64 LRN: compare with the NumPy spec (which rounds its result to float32)."""
    from conftest import assert_close, op_model, run_kiln
    x = rand(1, 7, 3, 5, dtype="float64")
    got = run_kiln(*op_model("LRN", [x], {"size": 3, "alpha": 0.1}))[0]
    assert got.dtype == np.float64
    assert_close(got.astype(np.float32), lrn_spec(x, 3, alpha=0.1), TOL)
