"""The type of a graph value: element type and shape (static ints or symbolic dims).

Its own module below both the graph IR (kiln/graph/ir.py) and the op table (kiln/graph/ops.py), whose type rules
take and return TensorTypes: the IR's Graph.add infers through the op table, so the table cannot import the IR."""
from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes  # noqa: F401  (registers numpy's "bfloat16" dtype: bf16 weights and values, precision="bf16")
import numpy as np

from kiln.graph import symbolic
from kiln.graph.symbolic import Dim


@dataclass(frozen=True)
class TensorType:
    dtype: str                 # numpy dtype name: "float32", "int64", "bool", ...
    shape: tuple[Dim, ...]     # ints, or sympy expressions of symbols (kiln/graph/symbolic.py)

    def __post_init__(self) -> None:
        if not all(type(d) is int for d in self.shape):  # normalized: a static dim is always a Python int
            object.__setattr__(self, "shape", symbolic.normalize_shape(self.shape))

    @property
    def is_static(self) -> bool:
        return all(type(d) is int for d in self.shape)

    @property
    def size(self) -> Dim:
        """The element count: an int, or a sympy expression where the shape is symbolic."""
        if self.is_static:
            return int(np.prod(self.shape, dtype=np.int64))
        return symbolic.prod(self.shape)

    @property
    def nbytes(self) -> Dim:
        return symbolic.normalize(self.size * np.dtype(self.dtype).itemsize)

    def __str__(self) -> str:
        return f"{self.dtype}[{','.join(map(symbolic.dim_str, self.shape))}]"
