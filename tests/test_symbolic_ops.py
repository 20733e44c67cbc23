"""Every core op's type rule on symbolic dims, checked against NumPy: the inferred shape evaluated at several sizes
equals the shape of the op's NumPy evaluation on arrays of those sizes (ops without a NumPy evaluator: equals the
op's rule applied to the concrete shapes, which the op tests check against onnxruntime)."""
from __future__ import annotations

import numpy as np
import pytest

import kiln.graph.passes  # noqa: F401  (registers the passes' ops: PackedMatMul, Winograd*)
from kiln.graph import symbolic
from kiln.graph.ir import TensorType
from kiln.graph.ops import OPS, evaluate, infer

s, t = symbolic.symbol("s"), symbolic.symbol("t")
BOUNDS = {"s": (2, 64), "t": (2, 64)}
SIZES = [{"s": 2, "t": 5}, {"s": 3, "t": 2}, {"s": 7, "t": 4}]
F, I, B = "float32", "int64", "bool"

UNARY_ATTRS = {"alpha": 0.5, "beta": 0.1, "gamma": 1.05, "lambd": 0.5, "bias": 0.1, "min": -1.0, "max": 1.0,
               "approximate": "none"}
_UNARY = [n for n, d in OPS.items() if d.kind == "unary" and n not in ("WinogradOutput", "Not", "Cast", "IsInf")]
_BINARY = ["Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Equal", "Less", "Greater", "LessOrEqual",
           "GreaterOrEqual", "Mod"]
CONV = {"strides": (1, 2), "pads": (1, 0, 1, 0), "dilations": (1, 1), "group": 1}

# op → (inputs as (dtype, shape) — a shape may hold symbols —, attributes — which may hold dims —)
CASES: dict[str, tuple[list[tuple[str, tuple]], dict]] = {
    **{op: ([(F, (s, 3))], UNARY_ATTRS) for op in _UNARY},
    "Not": ([(B, (s, t))], {}),
    "Cast": ([(F, (t, s))], {"to": "int32"}),
    "IsInf": ([(F, (s, 2))], {"positive": 1, "negative": 0}),
    **{op: ([(F, (s, 1, 4)), (F, (1, t, 4))], {"fmod": 0}) for op in _BINARY},
    "PRelu": ([(F, (s, 3)), (F, (3,))], {}),
    "And": ([(B, (s, 1)), (B, (s, t))], {}), "Or": ([(B, (s, t)), (B, ())], {}),
    "Xor": ([(B, (1, t)), (B, (s, 1))], {}),
    "BitAnd": ([(I, (s, t)), (I, (t,))], {}), "BitOr": ([(I, (s, 1)), (I, (t,))], {}),
    "BitXor": ([(I, (s, t)), (I, (s, t))], {}),
    "Where": ([(B, (s, 1)), (F, (1, t)), (F, (s, t))], {}),
    "Reduce": ([(F, (s, t, 4))], {"axes": (1,), "keepdims": 1, "kind": "sum"}),
    "ArgReduce": ([(F, (s, t, 4))], {"axis": 0, "keepdims": 0, "kind": "max"}),
    "MatMul": ([(F, (2, s, 8)), (F, (8, t))], {}),
    "MatMulInteger": ([("uint8", (s, 8)), ("int8", (8, t)), ("uint8", ()), ("int8", ())], {}),
    "Conv": ([(F, (s, 4, t + 2, 9)), (F, (6, 4, 3, 3))], CONV),
    "ConvInteger": ([("uint8", (s, 4, t + 2, 9)), ("int8", (6, 4, 3, 3))], CONV),
    "Pool": ([(F, (s, 4, 2 * t, t + 3))], {"kernel": (2, 3), "strides": (2, 1), "pads": (0, 1, 0, 1),
                                            "dilations": (1, 1)}),
    "MaxPoolIndex": ([(F, (s, 4, t + 1, 6))], {"kernel": (2, 2), "strides": (1, 2), "pads": (0, 0, 0, 0),
                                               "dilations": (1, 1)}),
    "ConvTranspose": ([(F, (s, 4, t, 5)), (F, (4, 3, 3, 3))], {"strides": (2, 2), "output_padding": (1, 0),
                                                               "dilations": (1, 1), "pads": (1, 0, 0, 1), "group": 1}),
    **{op: ([(F, (s, 4, t))], {"axis": 1}) for op in ("BatchNormalization", "LayerNormalization", "Softmax",
                                                      "LogSoftmax", "LRN", "InstanceNormalization")},
    "ToBlocked": ([(F, (s, 16, t))], {"cb": 8}),
    "FromBlocked": ([(F, (s, 2, t, 8))], {}),
    "Reshape": ([(F, (s, t, 6))], {"shape": (s, 2 * t, 3)}),
    "Transpose": ([(F, (s, t, 3))], {"perm": (2, 0, 1)}),
    "Concat": ([(F, (s, 2)), (F, (t, 2)), (F, (3, 2))], {"axis": 0}),
    "Slice": ([(F, (s, t, 8))], {"starts": (s - 1, 1, 2), "ends": (s, t, 8), "steps": (1, 1, 2)}),
    "Gather": ([(F, (s, 4)), (I, (t, 2))], {"axis": 0}),
    "GatherElements": ([(F, (s, 4)), (I, (s, t))], {"axis": 1}),
    "GatherND": ([(F, (s, 4, 3)), (I, (t, 1))], {"batch_dims": 0}),
    "Pad": ([(F, (s, t))], {"pads": (1, 0, 2, 1), "mode": "constant", "value": 0.0}),
    "Expand": ([(F, (1, 3))], {"shape": (s, 3)}),
    "Tile": ([(F, (s, 2))], {"repeats": (2, t)}),
    "Resize": ([(F, (s, 4, t, 3))], {"sizes": (s, 4, 2 * t, 6)}),
    "Range": ([], {"start": 1, "limit": 2 * s + t, "delta": 3, "dtype": "int64"}),
    "CumSum": ([(F, (s, 3))], {"axis": 0, "exclusive": 0, "reverse": 1}),
    "TopKIndex": ([(F, (s, 5))], {"k": 2, "axis": 1}),
    "ReverseSequence": ([(F, (s, t))], {}),
    "ScatterElements": ([(F, (s, 4)), (I, (s, 2)), (F, (s, 2))], {"axis": 1}),
    "ScatterND": ([(F, (s, 4)), (I, (t, 1)), (F, (t, 4))], {}),
    "Quantize": ([(F, (s, 3)), (F, ()), ("uint8", ())], {"to": "uint8"}),
    "Dequantize": ([("uint8", (s, 3)), (F, ()), ("uint8", ())], {}),
}

# ops that only graph passes create, from attributes those passes compute: their rules are checked on whole
# models instead (test_symbolic_shapes.py: every value's shape after the passes, symbolic vs static imports)
PASS_OPS = {"PackedMatMul", "PackedConv", "WinogradInput", "WinogradProduct", "WinogradOutput", "QConv", "QMatMul",
            "QPackedConv", "QPackedMatMul"}


def test_every_op_has_a_case() -> None:
    assert set(OPS) == set(CASES) | PASS_OPS, sorted(set(OPS) ^ (set(CASES) | PASS_OPS))


def _array(dtype: str, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    if dtype == "bool":
        return rng.random(shape) < 0.5
    if np.dtype(dtype).kind in "iu":
        return np.zeros(shape, dtype=dtype)  # valid indices; divisors are float in the binary cases
    return rng.uniform(0.2, 0.8, size=shape).astype(dtype)


@pytest.mark.parametrize("op", sorted(CASES))
def test_rule_on_symbolic_dims_matches_numpy(op: str) -> None:
    ins, attrs = CASES[op]
    (out,) = infer(op, [TensorType(d, sh) for d, sh in ins], attrs, f"node_{op}", BOUNDS)
    assert symbolic.free_symbols(out.shape) <= {"s", "t"}
    assert not out.is_static or op in ("Reduce",), f"{op}: {out}"  # Reduce sums t away but keeps s
    rng = np.random.default_rng(0)
    for values in SIZES:
        shapes = [symbolic.evaluate_shape(sh, values) for _, sh in ins]
        cattrs = symbolic.substitute(attrs, values)
        want: tuple[int, ...]
        if OPS[op].eval is not None:
            arrays = [_array(d, sh, rng) for (d, _), sh in zip(ins, shapes)]
            want = tuple(evaluate(op, arrays, cattrs)[0].shape)
        else:
            (ref,) = infer(op, [TensorType(d, sh) for (d, _), sh in zip(ins, shapes)], cattrs, f"node_{op}")
            want = ref.shape
        assert symbolic.evaluate_shape(out.shape, values) == want, (op, values, str(out))
