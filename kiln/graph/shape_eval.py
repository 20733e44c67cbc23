"""Evaluate shape arithmetic on symbolic dims: the constant folding of shape sub-graphs when shapes have symbols.

Shape(x) of a symbolic x is a constant whose elements are dims (a NumPy object array, `symbolic.dims_array`);
Gather/Concat/Slice/Reshape/Add/Mul/Div/Cast/Equal/Where/... on such constants are evaluated here, element by
element, with dims' arithmetic (Div of dims is floor division, as everywhere for dims: they are ≥ 1). The frontend
folds with it at import and `fold_constants` after, so no node computes a shape at run time: the consumers
(Reshape's shape, Expand's shape, Slice's ends, Tile's repeats, Range's limit) get the dims as attributes."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import sympy

from kiln.graph import symbolic
from kiln.graph.ops import evaluate

# ops whose NumPy evaluator works unchanged on object arrays of dims (indexing and data movement)
_STRUCTURAL = {"Reshape", "Transpose", "Concat", "Slice", "Gather", "Expand", "Tile", "Identity", "GatherElements"}


def _dim_max(a: Any, b: Any) -> Any:
    try:
        return a if symbolic.decide(sympy.Ge(sympy.sympify(a), b)) else b
    except TypeError:
        return sympy.Max(a, b)


def _dim_min(a: Any, b: Any) -> Any:
    try:
        return a if symbolic.decide(sympy.Le(sympy.sympify(a), b)) else b
    except TypeError:
        return sympy.Min(a, b)


def _compare(rel: Callable[[Any, Any], Any]) -> Callable[[Any, Any], bool]:
    return lambda a, b: symbolic.decide(rel(sympy.sympify(a), sympy.sympify(b)), "comparing shape values")


_ELEMENTWISE: dict[str, Callable[..., Any]] = {
    "Add": lambda a, b: a + b, "Sub": lambda a, b: a - b, "Mul": lambda a, b: a * b,
    "Div": lambda a, b: a // b,  # integer division of dims (≥ 0): floor, which sympy keeps as floor(a/b)
    "Mod": lambda a, b: a % b, "Max": _dim_max, "Min": _dim_min, "Neg": lambda a: -a, "Abs": lambda a: abs(a),
    "Equal": _compare(sympy.Eq), "Less": _compare(sympy.Lt), "Greater": _compare(sympy.Gt),
    "LessOrEqual": _compare(sympy.Le), "GreaterOrEqual": _compare(sympy.Ge),
}


def _cast(x: np.ndarray, to: str) -> np.ndarray:
    if to == "bool":
        return np.vectorize(lambda d: symbolic.decide(sympy.Ne(sympy.sympify(d), 0), "Cast to bool"),
                            otypes=[bool])(x)
    if np.dtype(to).kind in "iuf":  # a dim stays a dim (int64 → float32 → int64 chains are common in exports)
        return x
    raise TypeError(f"Cast of shape values {symbolic.shape_str(x.reshape(-1))} to {to}")


def _reduce(x: np.ndarray, a: dict) -> np.ndarray:
    fn = {"sum": np.sum, "prod": np.prod, "max": np.max, "min": np.min}.get(a["kind"])
    if fn is None:
        raise TypeError(f"Reduce kind {a['kind']} of shape values")
    if a["kind"] in ("max", "min"):
        pick = _dim_max if a["kind"] == "max" else _dim_min
        fn = lambda v, axis, keepdims: np.frompyfunc(pick, 2, 1).reduce(v, axis=axis, keepdims=keepdims)  # noqa: E731
    return np.asarray(fn(x, axis=tuple(a["axes"]), keepdims=a["keepdims"]), dtype=object)


def evaluate_symbolic(op: str, arrays: list[np.ndarray], attrs: dict[str, Any]) -> list[np.ndarray]:
    """The value of a node whose constant inputs hold symbolic dims, as object arrays of normalized dims.
    An op that has no meaning on shape values (a Conv reading one, Exp of a shape...) is a TypeError saying so;
    the caller names the node."""
    objs = [a if a.dtype == object else a.astype(object) if a.dtype.kind in "iub" else a for a in arrays]
    if op in ("Gather", "GatherElements"):
        if arrays[1].dtype == object:
            raise TypeError(f"{op} with symbolic indices")
        objs[1] = arrays[1]  # the indices stay integers
    if op in _STRUCTURAL:
        out = evaluate(op, objs, attrs)
        assert out is not None
        return [symbolic.normalize_array(np.asarray(o, dtype=object)) for o in out]
    if op == "Cast":
        return [symbolic.normalize_array(np.asarray(_cast(objs[0], attrs["to"]), dtype=object))]
    if op == "Reduce":
        return [symbolic.normalize_array(_reduce(objs[0], attrs))]
    if op == "Where":
        cond = np.asarray(arrays[0], dtype=bool)
        return [symbolic.normalize_array(np.asarray(np.where(cond, objs[1], objs[2]), dtype=object))]
    fn = _ELEMENTWISE.get(op)
    if fn is None:
        raise TypeError(f"'{op}' does not compute on shape values")
    result = np.frompyfunc(fn, len(objs), 1)(*objs)
    result = np.asarray(result, dtype=object)
    if op in ("Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual"):
        return [result.astype(bool)]
    return [symbolic.normalize_array(result)]


def concrete(arr: np.ndarray, dtype: str) -> np.ndarray:
    """A symbolic evaluation's result as an ordinary array where it has no symbols left (Shape(x)[2] of
    x[b, s, 768] is just 768), else the object array itself."""
    if arr.dtype != object or symbolic.is_symbolic_array(arr):
        return arr
    return np.asarray(arr.tolist(), dtype=dtype).reshape(arr.shape)
