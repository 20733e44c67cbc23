"""What an ONNX import function works with: the import context (graph being built, opset, the node, helpers) and
ONNX's element types. Its own module below both the ONNX walker (kiln/frontend/onnx.py) and the per-op import
functions (kiln/frontend/importers/), which the walker dispatches to."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from kiln.errors import ModelError, UnsupportedOperator
from kiln.graph import symbolic
from kiln.graph.ir import Graph, TensorType, Value

_ONNX_DTYPES = {onnx.TensorProto.FLOAT: "float32", onnx.TensorProto.DOUBLE: "float64",
                onnx.TensorProto.INT64: "int64", onnx.TensorProto.INT32: "int32", onnx.TensorProto.BOOL: "bool",
                onnx.TensorProto.INT8: "int8", onnx.TensorProto.UINT8: "uint8", onnx.TensorProto.FLOAT16: "float16"}


def dtype_of(elem_type: int, what: str) -> str:
    if elem_type not in _ONNX_DTYPES:
        known = elem_type in onnx.TensorProto.DataType.values()
        name = onnx.TensorProto.DataType.Name(elem_type) if known else elem_type
        raise UnsupportedOperator("<tensor type>", what, detail=f"element type {name} is not supported")
    return _ONNX_DTYPES[elem_type]


@dataclass
class Ctx:
    """What an import function sees: the graph being built, the opset, and helpers."""
    graph: Graph
    opset: int
    node: onnx.NodeProto = field(default_factory=onnx.NodeProto)

    @property
    def name(self) -> str:
        return self.node.name or f"{self.node.op_type}:{self.node.output[0] if self.node.output else '?'}"

    def attr(self, key: str, default: Any = None) -> Any:
        for a in self.node.attribute:
            if a.name == key:
                v = helper.get_attribute_value(a)
                if isinstance(v, bytes):
                    return v.decode()
                if isinstance(v, onnx.TensorProto):
                    return numpy_helper.to_array(v)
                if isinstance(v, list) and v and isinstance(v[0], bytes):
                    return [s.decode() for s in v]
                return v
        return default

    def unsupported(self, detail: str) -> UnsupportedOperator:
        return UnsupportedOperator(self.node.op_type, self.name, self.opset, detail)

    def const(self, v: Value | None, what: str, dims: bool = False) -> np.ndarray:
        """A constant input (shapes, axes, pads…): these must be known at compile time. `dims=True`: the input
        may hold symbolic dims (an object array, see kiln/graph/symbolic.py) — only where the importer puts them
        into an attribute that takes dims (Reshape/Expand shape, Slice starts/ends, Tile repeats, Range)."""
        if v is None:
            raise self.unsupported(f"input '{what}' is missing")
        if v.const is None:
            source = " (a graph input)" if v.producer is None else ""
            raise self.unsupported(f"input '{what}'{source} is computed at run time; Kiln needs it constant")
        if not dims and symbolic.is_symbolic_array(v.const):
            raise self.unsupported(f"input '{what}' = {symbolic.shape_str(v.const.reshape(-1))} depends on symbolic "
                                   f"dimension(s) {sorted(symbolic.free_symbols(list(v.const.reshape(-1))))}; "
                                   f"{self.node.op_type} needs it to be a constant")
        return v.const

    def constant(self, array: np.ndarray, dtype: str | None = None) -> Value:
        """A constant value; an object array of dims (a symbolic shape tensor) takes `dtype` (int64 by default)."""
        arr = np.asarray(array, order="C")
        if arr.dtype == object:
            arr = symbolic.normalize_array(arr)
            return Value(self.graph.fresh("const"), TensorType(dtype or "int64", tuple(arr.shape)), const=arr)
        return Value(self.graph.fresh("const"), TensorType(arr.dtype.name, tuple(arr.shape)), const=arr)

    def add(self, op: str, inputs: Sequence[Value], **attrs: Any) -> Value:
        """Append a core node — or, when all its inputs are constants, its value (folding at import; on symbolic
        dims, shape arithmetic is evaluated symbolically). A node whose output has a symbolic shape stays a node."""
        from kiln.graph.ops import evaluate
        from kiln.graph.shape_eval import concrete, evaluate_symbolic

        out = self.graph.add(op, list(inputs), attrs, name=self.name)[0]
        if inputs and all(v.const is not None for v in inputs) and out.type.is_static:
            if any(symbolic.is_symbolic_array(v.const) for v in inputs):
                try:
                    val = evaluate_symbolic(op, [v.const for v in inputs], attrs)[0]
                except (TypeError, ValueError) as e:
                    raise ModelError(f"node '{self.name}' ({self.node.op_type}): computes on shape values that "
                                     f"depend on symbolic dimensions, which Kiln folds at compile time: {e}") from None
                self.graph.nodes.pop()
                return self.constant(concrete(val.reshape(out.shape), out.dtype), out.dtype)
            vals = evaluate(op, [v.const for v in inputs], attrs)
            if vals is not None:
                self.graph.nodes.pop()
                return self.constant(np.asarray(vals[0]).astype(out.dtype).reshape(out.shape))
        return out
