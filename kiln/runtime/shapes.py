"""Run-time shapes of an executable compiled with symbolic dims (kernel/dynamic.py).

A dim in the executable's metadata is an int or the text of an integer expression over the symbols
("seq", "(seq * 3)", "((h + 1) // 2)"). Before anything runs, the symbols are bound from the inputs' shapes, checked
against each other and against their compiled bounds, and the outputs' shapes evaluated. The expressions are
evaluated by walking their syntax tree with integer operators only: a saved executable's metadata is never run
as code."""
from __future__ import annotations

import ast
import functools
import operator
from collections.abc import Sequence
from typing import Any

import numpy as np

_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv,
           ast.Mod: operator.mod}
_CALLS = {"max": max, "min": min}


def evaluate(dim: int | str, values: dict[str, int]) -> int:
    """The value of a dim for bound symbols."""
    if isinstance(dim, int):
        return dim

    def go(node: ast.AST) -> int:
        if isinstance(node, ast.Expression):
            return go(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.Name):
            return values[node.id]
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            return _BINARY[type(node.op)](go(node.left), go(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -go(node.operand)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _CALLS:
            return _CALLS[node.func.id](*(go(a) for a in node.args))
        raise ValueError(f"dim expression {dim!r} is not integer arithmetic over symbols")
    return int(go(_parsed(dim)))


@functools.lru_cache(maxsize=4096)
def _parsed(dim: str) -> ast.Expression:
    """Parsed once per expression (a run evaluates every output dim)."""
    return ast.parse(dim, mode="eval")


def shape_function(dims: Sequence[int | str]):  # noqa: ANN201 - Callable[[dict[str, int]], tuple[int, ...]]
    """A shape's evaluator, prepared once: ints and plain symbol names are looked up, only composite dims walk
    their (validated, cached) syntax tree — a 1-token decode step should not pay for parsing."""
    parts = [(0, d) if isinstance(d, int) else (1, d) if d.isidentifier() else (2, d) for d in dims]
    for kind, d in parts:
        if kind == 2:
            evaluate(d, {n: 1 for n in _names(d)})  # validate now: a bad expression fails at load, not at run
    return lambda values: tuple(d if kind == 0 else values[d] if kind == 1 else evaluate(d, values)
                                for kind, d in parts)


def _names(dim: str) -> set[str]:
    return {n.id for n in ast.walk(_parsed(dim)) if isinstance(n, ast.Name) and n.id not in _CALLS}


def bind(specs: Sequence[Any], arrays: Sequence[np.ndarray], bounds: dict[str, Sequence[int]]) -> dict[str, int]:
    """The symbols' values from the inputs' shapes. Raises ValueError, before anything runs, for a wrong rank, a
    static dim that differs, two inputs that disagree on a symbol, or a size outside the compiled bounds."""
    values: dict[str, int] = {}
    where: dict[str, str] = {}
    for s, a in zip(specs, arrays):
        if a.ndim != len(s.shape):
            raise ValueError(f"input '{s.name}' has rank {a.ndim} (shape {list(a.shape)}), expected {len(s.shape)} "
                             f"dims {list(s.shape)}")
        for axis, (d, n) in enumerate(zip(s.shape, a.shape)):
            if isinstance(d, int):
                if d != n:
                    raise ValueError(f"input '{s.name}' has shape {list(a.shape)}, expected {list(s.shape)} "
                                     f"(dim {axis} is fixed at {d})")
            elif d.isidentifier():
                if d in values and values[d] != n:
                    raise ValueError(f"inputs disagree on the symbolic dim '{d}': {values[d]} in {where[d]}, {n} in "
                                     f"'{s.name}' (dim {axis})")
                values.setdefault(d, int(n))
                where.setdefault(d, f"'{s.name}' (dim {axis})")
    for name, (lo, hi) in bounds.items():
        if name not in values:
            continue
        if not lo <= values[name] <= hi:
            raise ValueError(f"symbolic dim '{name}' = {values[name]} (from input {where[name]}) is outside the bounds "
                             f"[{lo}, {hi}] this executable was compiled for: compile with dynamic_bounds="
                             f"{{'{name}': ({lo}, {max(hi, values[name])})}}")
    for s, a in zip(specs, arrays):  # composite dims (2*seq) once every symbol is bound
        for axis, (d, n) in enumerate(zip(s.shape, a.shape)):
            if isinstance(d, str) and not d.isidentifier():
                try:
                    want = evaluate(d, values)
                except KeyError as e:
                    raise ValueError(f"input '{s.name}' dim {axis} is {d}, but {e} is not a dim of any input") from None
                if want != n:
                    raise ValueError(f"input '{s.name}' has shape {list(a.shape)}: dim {axis} must be {d} = {want}")
    return values


def is_prefix(shape: Sequence[int], full: Sequence[int]) -> bool:
    """Is a C-contiguous array of `shape` laid out exactly as the start of one of `full` (a max layout)? Its
    elements then have their max-layout offsets, and the kernels can use it in place: every dim after the first
    one above 1 is at its full size ([1, 112, 768] in [4, 512, 768]; not [2, 112, 768])."""
    dims = list(shape)
    first = next((i for i, d in enumerate(dims) if d > 1), len(dims))
    return len(dims) == len(full) and all(d == f for d, f in zip(dims[first + 1:], full[first + 1:]))


def random_feeds(specs: Sequence[Any], rng: np.random.Generator, sizes: dict[str, int] | None = None,
                 int_high: int = 4) -> dict[str, np.ndarray]:
    """Seeded inputs for `specs` (name, dtype, shape; symbolic dims sized from `sizes`): normal floats, random
    bools, integers in [0, int_high)."""
    feeds: dict[str, np.ndarray] = {}
    for s in specs:
        shape = tuple(d if isinstance(d, int) else evaluate(d, sizes or {}) for d in s.shape)
        if s.dtype.startswith("float"):
            feeds[s.name] = rng.standard_normal(shape).astype(s.dtype)
        elif s.dtype == "bool":
            feeds[s.name] = rng.random(shape) < 0.5
        else:
            feeds[s.name] = rng.integers(0, int_high, shape).astype(s.dtype)
    return feeds
