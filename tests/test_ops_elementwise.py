"""Elementwise operators against onnxruntime: unary, parametric unary, Clip, Cast, binary (with every
broadcasting form), variadic Sum/Max/Min/Mean, Where.

Tolerances: 1e-5 relative for plain arithmetic / comparisons (exact for int and bool results),
1e-4 for transcendental functions."""
from __future__ import annotations

import numpy as np
import pytest

from conftest import C, check_op, rand

# odd sizes (not multiples of the 16-float vector), 1-D … 5-D, and one shape big enough to run in parallel
SHAPES = [(1,), (7,), (17,), (3, 33), (2, 3, 17), (1, 3, 5, 7), (2, 1, 3, 4, 5), (2, 129, 131)]
SMALL_SHAPES = SHAPES[:-1]
EXACT, ARITH, TRANSC = 0.0, 1e-5, 1e-4


def _halves(shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    """Values on a 0.5 grid, so ties for Round and exact zeros for Sign are present."""
    return (rand(*shape, lo=-12, hi=13, seed=seed, dtype="int64") / 2).astype(np.float32)


def _nonzero(shape: tuple[int, ...], seed: int) -> np.ndarray:
    """|x| in [0.5, 3), both signs."""
    sign = np.where(rand(*shape, seed=seed + 1) > 0, 1, -1).astype(np.float32)
    return rand(*shape, lo=0.5, hi=3, seed=seed) * sign


# op → (input generator, tolerance)
UNARY = {
    "Relu": (lambda s: rand(*s), ARITH),
    "Neg": (lambda s: rand(*s), ARITH),
    "Abs": (lambda s: rand(*s), ARITH),
    "Floor": (lambda s: rand(*s, lo=-5, hi=5), ARITH),
    "Ceil": (lambda s: rand(*s, lo=-5, hi=5), ARITH),
    "Round": (_halves, ARITH),
    "Sign": (_halves, ARITH),
    "Reciprocal": (lambda s: _nonzero(s, 0), ARITH),
    "Sigmoid": (lambda s: rand(*s, lo=-8, hi=8), TRANSC),
    "Tanh": (lambda s: rand(*s, lo=-4, hi=4), TRANSC),
    "Exp": (lambda s: rand(*s, lo=-5, hi=5), TRANSC),
    "Log": (lambda s: rand(*s, lo=0.01, hi=10), TRANSC),
    "Sqrt": (lambda s: rand(*s, lo=0, hi=10), TRANSC),
    "Erf": (lambda s: rand(*s, lo=-3, hi=3), TRANSC),
    "Sin": (lambda s: rand(*s, lo=-6, hi=6), TRANSC),
    "Cos": (lambda s: rand(*s, lo=-6, hi=6), TRANSC),
    "Softplus": (lambda s: rand(*s, lo=-30, hi=30), TRANSC),  # covers the x > 20 shortcut
    "HardSwish": (lambda s: rand(*s, lo=-5, hi=5), ARITH),
    "Mish": (lambda s: rand(*s, lo=-25, hi=25), TRANSC),
}

OPSET = {"Mish": 18}  # ops newer than opset 17


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("op", list(UNARY))
def test_unary(op: str, shape: tuple[int, ...]) -> None:
    gen, tol = UNARY[op]
    check_op(op, [gen(shape)], rtol=tol, opset=OPSET.get(op, 17))


@pytest.mark.parametrize("shape", [(1,), (17,), (3, 33), (2, 1, 3, 4, 5)], ids=str)
def test_not(shape: tuple[int, ...]) -> None:
    check_op("Not", [rand(*shape, dtype="bool")], rtol=EXACT)


@pytest.mark.parametrize("op,dtype", [(op, dt) for op in ("Neg", "Abs", "Sign") for dt in ("int64", "int32")]
                         + [("Relu", "int32")])  # onnxruntime has no Relu(int64)
def test_unary_int(op: str, dtype: str) -> None:
    check_op(op, [rand(3, 17, lo=-50, hi=50, dtype=dtype)], rtol=EXACT)


@pytest.mark.parametrize("shape", SMALL_SHAPES, ids=str)
def test_unary_on_constant_is_folded(shape: tuple[int, ...]) -> None:
    """All-constant inputs fold at import (NumPy evaluation in kiln.graph.ops): must agree too."""
    for op in ("Relu", "Sigmoid", "Tanh", "Exp", "Erf", "Softplus", "Mish", "HardSwish", "Round", "Sign"):
        gen, tol = UNARY[op]
        check_op(op, [C(gen(shape))], rtol=tol, opset=OPSET.get(op, 17))


# -- parametric unary ----------------------------------------------------------------------------------------
PARAM_UNARY = [
    ("LeakyRelu", {}, ARITH), ("LeakyRelu", {"alpha": 0.3}, ARITH),
    ("Elu", {}, TRANSC), ("Elu", {"alpha": 0.5}, TRANSC),
    ("HardSigmoid", {}, ARITH), ("HardSigmoid", {"alpha": 0.4, "beta": 0.3}, ARITH),
    ("Selu", {}, TRANSC), ("Selu", {"alpha": 1.5, "gamma": 0.9}, TRANSC),
    ("Celu", {}, TRANSC), ("Celu", {"alpha": 0.7}, TRANSC),
    ("ThresholdedRelu", {}, ARITH), ("ThresholdedRelu", {"alpha": 0.5}, ARITH),
]


@pytest.mark.parametrize("shape", [(7,), (3, 33), (1, 3, 5, 7), (2, 1, 3, 4, 5), (2, 129, 131)], ids=str)
@pytest.mark.parametrize("op,attrs,tol", PARAM_UNARY, ids=[f"{op}-{a}" for op, a, _ in PARAM_UNARY])
def test_param_unary(op: str, attrs: dict, tol: float, shape: tuple[int, ...]) -> None:
    check_op(op, [rand(*shape, lo=-4, hi=4)], rtol=tol, attrs=attrs, opset=17)


@pytest.mark.parametrize("shape", [(7,), (3, 33), (2, 1, 3, 4, 5), (2, 129, 131)], ids=str)
@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_opset20(approximate: str, shape: tuple[int, ...]) -> None:
    check_op("Gelu", [rand(*shape, lo=-5, hi=5)], rtol=TRANSC, attrs={"approximate": approximate}, opset=20)


# -- Clip ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("attrs", [{}, {"min": -0.5}, {"max": 0.7}, {"min": -1.0, "max": 0.25}])
@pytest.mark.parametrize("shape", [(17,), (3, 33), (2, 1, 3, 4, 5)], ids=str)
@pytest.mark.parametrize("opset", [7, 10])
def test_clip_opset6_attrs(attrs: dict, shape: tuple[int, ...], opset: int) -> None:
    """Clip-6 (min/max attributes) is the Clip of opsets 6–10; Kiln reads opsets ≥ 7."""
    check_op("Clip", [rand(*shape)], rtol=ARITH, attrs=attrs, opset=opset)


@pytest.mark.parametrize("lo,hi", [(None, None), (-0.5, None), (None, 0.7), (-1.0, 0.25), (0.5, 0.5)])
@pytest.mark.parametrize("opset", [11, 13])
@pytest.mark.parametrize("shape", [(17,), (3, 33), (1, 3, 5, 7)], ids=str)
def test_clip_inputs(lo: float | None, hi: float | None, opset: int, shape: tuple[int, ...]) -> None:
    args = [rand(*shape), None if lo is None else C(np.array(lo, np.float32)),
            None if hi is None else C(np.array(hi, np.float32))]
    check_op("Clip", args, rtol=ARITH, opset=opset)


@pytest.mark.parametrize("lo,hi", [(-5, None), (None, 7), (-3, 4)])
def test_clip_int64(lo: int | None, hi: int | None) -> None:
    args = [rand(3, 17, lo=-20, hi=20, dtype="int64"), None if lo is None else C(np.array(lo, np.int64)),
            None if hi is None else C(np.array(hi, np.int64))]
    check_op("Clip", args, rtol=EXACT, opset=13)


# -- Cast ----------------------------------------------------------------------------------------------------
CASTS = [("float32", "int64"), ("float32", "int32"), ("float32", "bool"), ("int64", "float32"),
         ("int32", "float32"), ("bool", "float32"), ("int64", "int32"), ("int32", "int64"),
         ("bool", "int64"), ("int64", "bool"), ("float32", "float32"), ("int32", "bool"),
         ("bool", "int32"), ("float32", "float64"), ("float64", "float32"), ("float64", "int64"),
         ("uint8", "float32"), ("float32", "uint8"), ("int8", "int64"), ("int64", "int8")]
_TO = {"float32": 1, "uint8": 2, "int8": 3, "int32": 6, "int64": 7, "bool": 9, "float64": 11}


def _cast_input(src: str, dst: str, shape: tuple[int, ...]) -> np.ndarray:
    """Values every destination type holds: non-integral floats of both signs and exact zeros."""
    if src.startswith("float"):
        x = rand(*shape, lo=0 if dst == "uint8" else -100, hi=100, dtype=src)
        x.reshape(-1)[::5] = 0
        return x
    if src == "bool":
        return rand(*shape, dtype="bool")
    lo, hi = {"uint8": (0, 256), "int8": (-128, 128)}.get(src, {"int8": (-128, 128)}.get(dst, (-1000, 1000)))
    return rand(*shape, lo=lo, hi=hi, dtype=src)


@pytest.mark.parametrize("shape", [(1,), (17,), (3, 33), (2, 1, 3, 4, 5)], ids=str)
@pytest.mark.parametrize("src,dst", CASTS, ids=lambda v: v)
def test_cast(src: str, dst: str, shape: tuple[int, ...]) -> None:
    check_op("Cast", [_cast_input(src, dst, shape)], rtol=EXACT, attrs={"to": _TO[dst]})


@pytest.mark.parametrize("src,dst", CASTS, ids=lambda v: v)
def test_cast_constant_folded(src: str, dst: str) -> None:
    check_op("Cast", [C(_cast_input(src, dst, (3, 17)))], rtol=EXACT, attrs={"to": _TO[dst]})


# -- binary --------------------------------------------------------------------------------------------------
# (shape of A, shape of B): same, scalar, row, column, rank-mismatched, both sides broadcast, 5-D, big
PAIRS = [((7,), (7,)), ((3, 17), ()), ((), (3, 17)), ((5, 17), (17,)), ((5, 17), (5, 1)),
         ((2, 3, 4, 33), (4, 1)), ((3, 1, 7), (1, 5, 1)), ((2, 1, 3, 1, 5), (1, 4, 1, 6, 1)),
         ((1, 3, 5, 7), (3, 1, 1)), ((2, 129, 131), (131,))]
PAIR_IDS = [f"{a}-{b}" for a, b in PAIRS]


def _ints(shape: tuple[int, ...], seed: int) -> np.ndarray:
    """Small integer-valued floats: equal elements occur, so Equal/LessOrEqual see ties."""
    return rand(*shape, lo=-3, hi=4, seed=seed, dtype="int64").astype(np.float32)


def _any(shape: tuple[int, ...], seed: int) -> np.ndarray:
    return rand(*shape, seed=seed)


def _bools(shape: tuple[int, ...], seed: int) -> np.ndarray:
    return rand(*shape, seed=seed, dtype="bool")


# op → (A generator, B generator, tolerance); generators take (shape, seed)
rand_, b_ = _any, _bools
BINARY = {
    "Add": (rand_, rand_, ARITH),
    "Sub": (rand_, rand_, ARITH),
    "Mul": (rand_, rand_, ARITH),
    "Div": (rand_, _nonzero, ARITH),
    "Pow": (lambda s, k: rand(*s, lo=0.1, hi=3, seed=k), lambda s, k: rand(*s, lo=-2, hi=2, seed=k), TRANSC),
    "PRelu": (rand_, lambda s, k: rand(*s, lo=0, hi=1, seed=k), ARITH),
    "Equal": (_ints, _ints, EXACT), "Less": (_ints, _ints, EXACT), "Greater": (_ints, _ints, EXACT),
    "LessOrEqual": (_ints, _ints, EXACT), "GreaterOrEqual": (_ints, _ints, EXACT),
    "And": (b_, b_, EXACT), "Or": (b_, b_, EXACT), "Xor": (b_, b_, EXACT),
}


@pytest.mark.parametrize("op,sa,sb", [  # PRelu's slope broadcasts to X only
    pytest.param(op, a, b, id=f"{op}-{a}-{b}") for op in BINARY for a, b in PAIRS
    if op != "PRelu" or np.broadcast_shapes(a, b) == a])
def test_binary(op: str, sa: tuple[int, ...], sb: tuple[int, ...]) -> None:
    ga, gb, tol = BINARY[op]
    check_op(op, [ga(sa, 1), gb(sb, 2)], rtol=tol)


@pytest.mark.parametrize("sa,sb", [((5, 17), (17,)), ((2, 3, 4, 33), (4, 1)), ((3, 17), ())], ids=str)
@pytest.mark.parametrize("op", list(BINARY))
def test_binary_constant_operand(op: str, sa: tuple[int, ...], sb: tuple[int, ...]) -> None:
    """B as an initializer (one-element constants become literals), and both constant (folded at import)."""
    ga, gb, tol = BINARY[op]
    check_op(op, [ga(sa, 1), C(gb(sb, 2))], rtol=tol)
    check_op(op, [C(ga(sa, 1)), C(gb(sb, 2))], rtol=tol)


@pytest.mark.parametrize("slope_shape", [(), (1,), (3, 1, 1), (1, 3, 5, 7), (7,)], ids=str)
def test_prelu_slopes(slope_shape: tuple[int, ...]) -> None:
    check_op("PRelu", [rand(2, 3, 5, 7), C(rand(*slope_shape, lo=0, hi=1, seed=3))], rtol=ARITH)


def test_pow_negative_base_integer_exponent() -> None:
    x = rand(3, 17, lo=-3, hi=3)
    check_op("Pow", [x, C(np.array([2.0, 3.0, -1.0], np.float32).reshape(3, 1))], rtol=TRANSC)


@pytest.mark.parametrize("exp_dtype", ["int64", "int32"])
def test_pow_float_base_int_exponent(exp_dtype: str) -> None:
    check_op("Pow", [rand(3, 17, lo=-3, hi=3), rand(17, lo=-2, hi=4, dtype=exp_dtype)], rtol=TRANSC)


@pytest.mark.parametrize("sa,sb", [((17,), (17,)), ((5, 17), (17,)), ((3, 1, 7), (1, 5, 1))], ids=str)
@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div", "Max", "Min", "Equal", "Less", "Greater",
                                "LessOrEqual", "GreaterOrEqual"])
@pytest.mark.parametrize("dtype", ["int64", "int32"])
def test_binary_int(op: str, dtype: str, sa: tuple[int, ...], sb: tuple[int, ...]) -> None:
    a = rand(*sa, lo=-100, hi=100, seed=1, dtype=dtype)
    b = rand(*sb, lo=1, hi=9, seed=2, dtype=dtype) * np.where(rand(*sb, seed=3) > 0, 1, -1).astype(dtype)
    check_op(op, [a, b], rtol=EXACT)


def test_pow_int64() -> None:
    a = rand(3, 17, lo=-5, hi=6, seed=1, dtype="int64")
    b = rand(17, lo=0, hi=5, seed=2, dtype="int64")
    check_op("Pow", [a, b], rtol=EXACT)


@pytest.mark.parametrize("fmod", [0, 1])
@pytest.mark.parametrize("dtype", ["int64", "int32"])
@pytest.mark.parametrize("const", [False, True])
def test_mod_int(fmod: int, dtype: str, const: bool) -> None:
    """Mod(fmod=0) on integers takes the divisor's sign (Python %); fmod=1 the dividend's (C fmod)."""
    a = rand(5, 17, lo=-50, hi=50, seed=1, dtype=dtype)
    b = rand(17, lo=1, hi=9, seed=2, dtype=dtype) * np.where(rand(17, seed=3) > 0, 1, -1).astype(dtype)
    check_op("Mod", [C(a) if const else a, C(b) if const else b], rtol=EXACT, attrs={"fmod": fmod})


@pytest.mark.parametrize("sa,sb", PAIRS[:-1], ids=PAIR_IDS[:-1])
def test_mod_fmod_float(sa: tuple[int, ...], sb: tuple[int, ...]) -> None:
    check_op("Mod", [rand(*sa, lo=-10, hi=10, seed=1), _nonzero(sb, 2)], rtol=ARITH, attrs={"fmod": 1})


# -- variadic ------------------------------------------------------------------------------------------------
VARIADIC_SHAPES = [[(17,)], [(3, 17), (3, 17)], [(3, 17), (17,), ()],
                   [(2, 1, 5), (3, 1), (1, 1, 5), (2, 3, 5)], [(2, 1, 3, 4, 5), (5,), (1, 3, 1, 1)],
                   [(2, 129, 131), (131,)]]


@pytest.mark.parametrize("shapes", VARIADIC_SHAPES, ids=str)
@pytest.mark.parametrize("op", ["Sum", "Max", "Min", "Mean"])
def test_variadic(op: str, shapes: list[tuple[int, ...]]) -> None:
    check_op(op, [rand(*s, seed=i) for i, s in enumerate(shapes)], rtol=ARITH)


@pytest.mark.parametrize("op", ["Max", "Min"])  # onnxruntime's Sum and Mean are float-only
def test_variadic_int64(op: str) -> None:
    args = [rand(3, 17, lo=-9, hi=9, seed=1, dtype="int64"), rand(17, lo=-9, hi=9, seed=2, dtype="int64"),
            C(rand(3, 1, lo=-9, hi=9, seed=3, dtype="int64"))]
    check_op(op, args, rtol=EXACT)


# -- Where ---------------------------------------------------------------------------------------------------
WHERE_SHAPES = [((7,), (7,), (7,)), ((3, 17), (), (3, 17)), ((3, 1), (1, 17), (17,)), ((2, 1, 5), (3, 1), ()),
                ((2, 1, 3, 1, 5), (1, 4, 1, 6, 1), (5,)), ((2, 129, 131), (131,), (2, 1, 1))]


@pytest.mark.parametrize("sc,sa,sb", WHERE_SHAPES, ids=str)
@pytest.mark.parametrize("dtype", ["float32", "int64"])
def test_where(sc: tuple[int, ...], sa: tuple[int, ...], sb: tuple[int, ...], dtype: str) -> None:
    check_op("Where", [rand(*sc, dtype="bool"), rand(*sa, lo=-9, hi=9, seed=1, dtype=dtype),
                       rand(*sb, lo=-9, hi=9, seed=2, dtype=dtype)], rtol=EXACT)


def test_where_constant_condition() -> None:
    args = [C(rand(3, 1, dtype="bool")), rand(3, 17, seed=1), C(np.array(-1.0, np.float32))]
    check_op("Where", args, rtol=EXACT)


# -- float64 -------------------------------------------------------------------------------------------------
F64 = [("Add", 2, ARITH), ("Mul", 2, ARITH), ("Div", 2, ARITH), ("Max", 2, ARITH), ("Relu", 1, ARITH),
       ("Neg", 1, ARITH), ("Exp", 1, TRANSC), ("Sigmoid", 1, TRANSC), ("Tanh", 1, TRANSC),
       ("Sqrt", 1, TRANSC), ("LeakyRelu", 1, ARITH), ("Floor", 1, ARITH), ("Less", 2, EXACT)]


@pytest.mark.parametrize("op,arity,tol", F64, ids=[c[0] for c in F64])
def test_float64(op: str, arity: int, tol: float) -> None:
    """float64 end to end (8 lanes per vector instead of 16)."""
    lo = 0.1 if op in ("Sqrt", "Div") else -3.0
    args = [rand(3, 33, lo=lo, hi=3, dtype="float64"), rand(33, lo=lo, hi=3, seed=1, dtype="float64")][:arity]
    check_op(op, args, rtol=tol)


def test_clip_float64_and_uint8_add() -> None:
    check_op("Clip", [rand(3, 33, dtype="float64"), C(np.array(-0.5)), C(np.array(0.5))], rtol=EXACT,
             opset=13)
    check_op("Add", [rand(3, 33, lo=0, hi=100, dtype="uint8"), rand(33, lo=0, hi=100, dtype="uint8")],
             rtol=EXACT)
