"""MatMul, Gemm, Conv, ConvTranspose against onnxruntime.

Tolerance: 1e-4 relative (to the largest |output|) for everything here: these are reductions whose
summation order differs from onnxruntime's."""
from __future__ import annotations

import pytest

from conftest import C, check_op, rand

TOL = 1e-4


# -- MatMul --------------------------------------------------------------------------------------------------
MATMUL = [((1, 1), (1, 1)), ((3, 7), (7, 17)), ((17, 33), (33, 5)), ((1, 33), (33, 1)),
          ((2, 3, 7), (2, 7, 5)), ((2, 3, 7), (7, 5)), ((3, 7), (2, 7, 5)), ((2, 1, 3, 7), (1, 4, 7, 5)),
          ((4, 3, 7), (2, 1, 7, 5)), ((2, 3, 1, 3, 7), (3, 4, 7, 17)),
          ((7,), (7, 5)), ((3, 7), (7,)), ((7,), (7,)), ((2, 3, 7), (7,)), ((7,), (2, 7, 5)),
          ((33,), (2, 3, 33, 17)), ((33, 65), (65, 129)), ((2, 17, 33), (33, 47)), ((4, 33, 65), (65, 129)),
          ((5, 16), (16, 32)), ((1, 1), (1, 49)),
          ((65, 129), (129, 67))]


@pytest.mark.parametrize("m,k,n", [(129, 771, 257), (52, 40, 1000), (24, 16, 41)])
def test_gemm_last_panel_narrower_than_the_tile(m: int, k: int, n: int, width: str) -> None:
    """N off every panel width (257 = 8·32 + 1, 1000 = 31·32 + 8, 41): the last panel runs a tile only as wide as
    its columns' vectors, and with an even count of row tiles each thread takes half the row tiles of every panel
    (schedule/tile.py); the bias is fused into the tile's stores."""
    a, b, bias = rand(m, k, seed=1), rand(k, n, seed=2), rand(n, seed=3)
    check_op("Gemm", [a, C(b), C(bias)], rtol=TOL, target=width)


def test_conv_by_channels_last_panel_narrower_than_the_tile(width: str) -> None:
    """1000 output channels in 2-vector panels (by channels: a 3×3 conv): the last panel's 8 channels."""
    x, w, bias = rand(1, 16, 6, 6, seed=4), rand(1000, 16, 3, 3, seed=5), rand(1000, seed=6)
    check_op("Conv", [x, C(w), C(bias)], rtol=TOL, attrs={"pads": [1, 1, 1, 1]}, target=width)


@pytest.mark.parametrize("sa,sb", MATMUL, ids=lambda s: str(s))
@pytest.mark.parametrize("b_const", [False, True], ids=["B-input", "B-const"])
def test_matmul(sa: tuple[int, ...], sb: tuple[int, ...], b_const: bool, width: str) -> None:
    a, b = rand(*sa, seed=1), rand(*sb, seed=2)
    check_op("MatMul", [a, C(b) if b_const else b], rtol=TOL, target=width)


@pytest.mark.parametrize("dtype", ["float64", "int64", "int32"])
def test_matmul_dtypes(dtype: str) -> None:
    """float64 (tolerance 1e-4) and integer products (exact)."""
    tol = TOL if dtype == "float64" else 0.0
    a, b = rand(2, 3, 17, lo=-5, hi=5, dtype=dtype), rand(17, 33, lo=-5, hi=5, seed=1, dtype=dtype)
    check_op("MatMul", [a, b], rtol=tol)


def test_matmul_both_constant() -> None:
    check_op("MatMul", [C(rand(3, 7, seed=1)), C(rand(2, 7, 5, seed=2))], rtol=TOL)


# -- Gemm ----------------------------------------------------------------------------------------------------
M, K, N = 5, 7, 17
C_SHAPES = [None, (), (1,), (N,), (1, N), (M, 1), (M, N)]


@pytest.mark.parametrize("c_shape", C_SHAPES, ids=str)
@pytest.mark.parametrize("trans_a,trans_b", [(0, 0), (1, 0), (0, 1), (1, 1)])
def test_gemm_transpose_and_bias_forms(trans_a: int, trans_b: int, c_shape: tuple[int, ...] | None, width: str) -> None:
    a = rand(*((K, M) if trans_a else (M, K)), seed=1)
    b = C(rand(*((N, K) if trans_b else (K, N)), seed=2))
    args = [a, b] + ([] if c_shape is None else [C(rand(*c_shape, seed=3))])
    check_op("Gemm", args, rtol=TOL, attrs={"transA": trans_a, "transB": trans_b}, target=width)


@pytest.mark.parametrize("alpha,beta", [(1.0, 1.0), (0.5, 1.0), (1.0, 0.25), (-2.0, 3.0), (1.5, 0.0)])
@pytest.mark.parametrize("c_shape", [(N,), (M, 1), (M, N)], ids=str)
def test_gemm_alpha_beta(alpha: float, beta: float, c_shape: tuple[int, ...]) -> None:
    args = [rand(M, K, seed=1), C(rand(K, N, seed=2)), C(rand(*c_shape, seed=3))]
    check_op("Gemm", args, rtol=TOL, attrs={"alpha": alpha, "beta": beta, "transB": 0})


def test_gemm_runtime_inputs() -> None:
    """B and C as graph inputs, not initializers; a size big enough to run in parallel."""
    check_op("Gemm", [rand(33, 65, seed=1), rand(129, 65, seed=2), rand(129, seed=3)], rtol=TOL,
             attrs={"transB": 1, "alpha": 0.5, "beta": 2.0})


def test_gemm_missing_c() -> None:
    check_op("Gemm", [rand(M, K, seed=1), C(rand(K, N, seed=2)), None], rtol=TOL, attrs={"beta": 2.0})


# -- Conv ----------------------------------------------------------------------------------------------------
# (x shape, w shape, attrs)
CONV = {
    "1d": ((1, 3, 17), (4, 3, 3), {}),
    "1d-stride-pads": ((2, 3, 17), (4, 3, 3), {"strides": [2], "pads": [1, 2]}),
    "1d-dil": ((1, 2, 33), (3, 2, 5), {"dilations": [3], "pads": [0, 4]}),
    "2d": ((2, 3, 7, 9), (5, 3, 3, 3), {}),
    "2d-1x1": ((1, 7, 5, 3), (17, 7, 1, 1), {}),
    "2d-stride": ((1, 3, 9, 11), (4, 3, 3, 3), {"strides": [2, 3]}),
    "2d-dil": ((1, 2, 11, 9), (3, 2, 3, 2), {"dilations": [2, 3]}),
    "2d-pads-asym": ((1, 3, 7, 9), (4, 3, 3, 3), {"pads": [0, 1, 2, 1]}),
    "2d-all": ((2, 3, 8, 10), (5, 3, 3, 5), {"strides": [2, 1], "dilations": [1, 2], "pads": [1, 2, 2, 0]}),
    "2d-rect-kernel": ((1, 2, 7, 7), (3, 2, 1, 5), {"pads": [0, 2, 0, 2]}),
    "2d-same-upper": ((1, 3, 7, 9), (4, 3, 3, 4), {"auto_pad": "SAME_UPPER"}),
    "2d-same-lower": ((1, 3, 7, 9), (4, 3, 3, 4), {"auto_pad": "SAME_LOWER"}),
    "2d-same-upper-s2": ((1, 3, 8, 9), (4, 3, 3, 3), {"auto_pad": "SAME_UPPER", "strides": [2, 2]}),
    "2d-same-lower-s2": ((1, 3, 8, 9), (4, 3, 2, 4), {"auto_pad": "SAME_LOWER", "strides": [2, 3]}),
    "2d-valid": ((1, 3, 7, 9), (4, 3, 3, 3), {"auto_pad": "VALID", "strides": [2, 2]}),
    "2d-group": ((1, 6, 7, 9), (4, 3, 3, 3), {"group": 2, "pads": [1, 1, 1, 1]}),
    "2d-group3": ((2, 6, 5, 7), (9, 2, 3, 3), {"group": 3, "strides": [2, 1]}),
    "2d-depthwise": ((1, 5, 7, 9), (5, 1, 3, 3), {"group": 5, "pads": [1, 1, 1, 1]}),
    "2d-depthwise-x2": ((1, 5, 7, 9), (10, 1, 3, 3), {"group": 5, "strides": [2, 2], "pads": [1, 0, 1, 0]}),
    "2d-big": ((1, 16, 33, 33), (17, 16, 3, 3), {"pads": [1, 1, 1, 1]}),
    "3d": ((1, 2, 5, 6, 7), (3, 2, 3, 3, 3), {"pads": [1, 1, 1, 1, 1, 1]}),
    "3d-stride-dil": ((1, 2, 7, 6, 9), (4, 2, 2, 3, 3), {"strides": [2, 1, 2], "dilations": [1, 2, 1],
                                                         "pads": [0, 1, 1, 1, 0, 0]}),
    "3d-group-same": ((1, 4, 5, 5, 5), (4, 2, 3, 3, 3), {"group": 2, "auto_pad": "SAME_UPPER"}),
}


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
@pytest.mark.parametrize("case", list(CONV))
def test_conv(case: str, bias: bool, width: str) -> None:
    xs, ws, attrs = CONV[case]
    args = [rand(*xs, seed=1), C(rand(*ws, seed=2))] + ([C(rand(ws[0], seed=3))] if bias else [])
    check_op("Conv", args, rtol=TOL, attrs=attrs, target=width)


@pytest.mark.parametrize("case", ["1d-stride-pads", "2d-group3", "3d"])
def test_conv_runtime_weights(case: str) -> None:
    xs, ws, attrs = CONV[case]
    check_op("Conv", [rand(*xs, seed=1), rand(*ws, seed=2), rand(ws[0], seed=3)], rtol=TOL, attrs=attrs)


# -- ConvTranspose -------------------------------------------------------------------------------------------
CONV_T = {
    "1d": ((1, 3, 7), (3, 2, 3), {}),
    "1d-stride": ((2, 3, 7), (3, 4, 3), {"strides": [2]}),
    "1d-stride-pads-outpad": ((1, 3, 7), (3, 2, 4), {"strides": [3], "pads": [1, 2], "output_padding": [2]}),
    "2d": ((1, 4, 5, 6), (4, 3, 3, 3), {}),
    "2d-stride": ((1, 4, 5, 6), (4, 3, 3, 3), {"strides": [2, 2]}),
    "2d-stride-pads": ((1, 4, 5, 6), (4, 3, 3, 3), {"strides": [2, 3], "pads": [1, 0, 0, 1]}),
    "2d-outpad": ((1, 4, 5, 6), (4, 3, 3, 3),
                  {"strides": [2, 2], "pads": [1, 1, 1, 1], "output_padding": [1, 0]}),
    "2d-dil": ((1, 2, 5, 6), (2, 3, 3, 2), {"dilations": [2, 1], "strides": [1, 2]}),
    "2d-group": ((1, 4, 5, 6), (4, 2, 3, 3), {"group": 2, "strides": [2, 2]}),
    "2d-depthwise": ((1, 3, 5, 7), (3, 1, 4, 4), {"group": 3, "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    "2d-big": ((1, 16, 17, 17), (16, 8, 4, 4), {"strides": [2, 2], "pads": [1, 1, 1, 1]}),
    "3d": ((1, 2, 3, 4, 5), (2, 3, 3, 3, 3), {"strides": [2, 1, 2], "pads": [1, 0, 1, 0, 1, 1]}),
}


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
@pytest.mark.parametrize("case", list(CONV_T))
def test_conv_transpose(case: str, bias: bool) -> None:
    xs, ws, attrs = CONV_T[case]
    cout = ws[1] * attrs.get("group", 1)
    args = [rand(*xs, seed=1), C(rand(*ws, seed=2))] + ([C(rand(cout, seed=3))] if bias else [])
    check_op("ConvTranspose", args, rtol=TOL, attrs=attrs)


@pytest.mark.parametrize("attrs", [{"output_shape": [11, 13], "strides": [2, 2]},
                                   {"auto_pad": "SAME_UPPER", "strides": [2, 2]}],
                         ids=["output_shape", "auto_pad"])
def test_conv_transpose_output_shape_and_auto_pad(attrs: dict) -> None:
    check_op("ConvTranspose", [rand(1, 4, 5, 6), C(rand(4, 3, 3, 3))], rtol=TOL, attrs=attrs)


def test_conv_on_constant_input() -> None:
    """A Conv whose every input is constant (Conv has no NumPy evaluator: it stays a kernel)."""
    xs, ws, attrs = CONV["2d-all"]
    check_op("Conv", [C(rand(*xs, seed=1)), C(rand(*ws, seed=2))], rtol=TOL, attrs=attrs)
