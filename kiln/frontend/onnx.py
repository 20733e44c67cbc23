"""ONNX → Graph IR.

Walks the ONNX graph in order; each node goes through the import function registered for its op type in
`IMPORTERS` (kiln/frontend/importers/, one module per op family). Nodes whose inputs are all constants are
evaluated right here: shape sub-graphs such as Shape→Gather→Unsqueeze→Concat→Reshape fold away at import, also
where shapes have symbolic dims (an input's `dim_param`, or an unnamed dynamic dim): Shape(x) is then a constant
of dims, the arithmetic on it is evaluated symbolically (kiln/graph/shape_eval.py), and its consumers get dims as
attributes (Reshape's shape, Expand's shape, Slice's starts/ends, Tile's repeats, Range's limit). No node computes
a shape at run time. Anything Kiln cannot compile raises at import, never at run time."""
from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from kiln.errors import ModelError, UnsupportedOperator
from kiln.graph import symbolic
from kiln.graph.ir import Graph, TensorType, Value

MIN_OPSET, MAX_OPSET = 7, 22

_ONNX_DTYPES = {onnx.TensorProto.FLOAT: "float32", onnx.TensorProto.DOUBLE: "float64",
                onnx.TensorProto.INT64: "int64", onnx.TensorProto.INT32: "int32", onnx.TensorProto.BOOL: "bool",
                onnx.TensorProto.INT8: "int8", onnx.TensorProto.UINT8: "uint8", onnx.TensorProto.FLOAT16: "float16"}


def load_model(model: onnx.ModelProto | str | bytes | os.PathLike) -> onnx.ModelProto:
    """Read a model from a path, bytes or proto; a malformed file is a ModelError, not a crash."""
    if isinstance(model, onnx.ModelProto):
        return model
    try:
        if isinstance(model, bytes):
            return onnx.load_from_string(model)
        if not os.path.exists(model):
            raise ModelError(f"no such model file: {model}")
        return onnx.load(os.fspath(model))
    except ModelError:
        raise
    except Exception as e:  # protobuf raises DecodeError and friends
        raise ModelError(f"cannot parse ONNX model {model if not isinstance(model, bytes) else '<bytes>'}: "
                         f"{type(e).__name__}: {e}") from None


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


def _input_dims(inputs: list[onnx.ValueInfoProto], input_shapes: dict[str, Sequence[int]]
                ) -> dict[str, list[symbolic.Dim]]:
    """Each graph input's dims: dim_value → int; dim_param → the symbol of that name; no value and no name → a
    fresh symbol `<input>_dim<i>`. `input_shapes` pins dims; a pinned named symbol is static in every input."""
    shapes = dict(input_shapes)
    named: dict[str, list[symbolic.Dim]] = {}
    pinned: dict[str, int] = {}
    for inp in inputs:
        dims: list[symbolic.Dim] = []
        for i, d in enumerate(inp.type.tensor_type.shape.dim):
            if d.HasField("dim_value"):
                dims.append(int(d.dim_value))
            else:
                dims.append(symbolic.symbol(d.dim_param or f"{inp.name}_dim{i}"))
        if inp.name in shapes:
            given = tuple(int(d) for d in shapes.pop(inp.name))
            if len(given) != len(dims) or any(isinstance(d, int) and d != s for d, s in zip(dims, given)):
                raise ValueError(f"input '{inp.name}': shape {given} does not fit the model's "
                                 f"{[symbolic.dim_str(d) for d in dims]}")
            for d, s in zip(dims, given):
                if not isinstance(d, int):
                    if pinned.setdefault(d.name, s) != s:
                        raise ValueError(f"input_shapes give symbol '{d.name}' two values: {pinned[d.name]} and {s}")
            dims = list(given)
        named[inp.name] = dims
    if shapes:
        raise ValueError(f"input_shapes names unknown inputs {sorted(shapes)}; inputs are {[i.name for i in inputs]}")
    return {k: [pinned.get(d.name, d) if not isinstance(d, int) else d for d in dims] for k, dims in named.items()}


def _bounds(dims: dict[str, list[symbolic.Dim]], dynamic_bounds: dict[str, tuple[int, int]] | None
            ) -> dict[str, tuple[int, int]]:
    """Every symbol's inclusive (lo, hi): from `dynamic_bounds`, else (1, symbolic.DEFAULT_BOUND)."""
    names = sorted(set().union(*(symbolic.free_symbols(d) for d in dims.values())) if dims else set())
    given = dict(dynamic_bounds or {})
    unknown = sorted(set(given) - set(names))
    if unknown:
        raise ValueError(f"dynamic_bounds names unknown symbol(s) {unknown}; the model's symbols are {names}"
                         + (" (pinned by input_shapes or none)" if not names else ""))
    bounds: dict[str, tuple[int, int]] = {}
    for name in names:
        lo, hi = given.get(name, (1, symbolic.DEFAULT_BOUND))
        if not (isinstance(lo, (int, np.integer)) and isinstance(hi, (int, np.integer))):
            raise ValueError(f"dynamic_bounds['{name}'] = {(lo, hi)}: bounds are two ints (lo, hi)")
        if lo < 1 or lo > hi:
            raise ValueError(f"dynamic_bounds['{name}'] = {(lo, hi)}: need 1 ≤ lo ≤ hi")
        bounds[name] = (int(lo), int(hi))
    return bounds


def _check_no_shape_values(graph: Graph) -> None:
    """After import no node reads a shape tensor that holds symbolic dims: those fold into attributes."""
    for n in graph.nodes:
        for v in n.inputs:
            if v.const is not None and symbolic.is_symbolic_array(v.const):
                raise ModelError(f"node '{n.name}' ({n.op}) reads %{v.name} = "
                                 f"{symbolic.shape_str(v.const.reshape(-1))}, shape values computed from symbolic "
                                 "dimensions, as data: Kiln folds shape arithmetic at compile time and has no kernel "
                                 "that computes shapes at run time")
    for name, v in zip(graph.output_names, graph.outputs):
        if v.const is not None and symbolic.is_symbolic_array(v.const):
            raise ModelError(f"graph output '{name}' is a shape computed from symbolic dimensions "
                             f"({symbolic.shape_str(v.const.reshape(-1))}): Kiln cannot return it as a tensor")


def import_onnx(model: onnx.ModelProto | str | bytes | os.PathLike,
                input_shapes: dict[str, Sequence[int]] | None = None,
                dynamic_bounds: dict[str, tuple[int, int]] | None = None) -> Graph:
    """The graph IR of an ONNX model. Symbolic input dims (dim_param, or unnamed) stay symbols through every
    shape; `input_shapes` pins dims to ints; `dynamic_bounds` {symbol: (lo, hi)} bounds them (default
    (1, symbolic.DEFAULT_BOUND)), recorded in `Graph.bounds`."""
    from kiln.frontend.importers import IMPORTERS, fold_with_reference

    model = load_model(model)
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
    if opset is None:
        raise ModelError("model declares no default-domain opset")
    if not MIN_OPSET <= opset <= MAX_OPSET:
        raise UnsupportedOperator("<model>", model.graph.name, opset, f"opsets {MIN_OPSET}–{MAX_OPSET} are supported")
    g = model.graph
    env: dict[str, Value] = {}
    for init in g.initializer:
        try:
            arr = numpy_helper.to_array(init)
        except Exception as e:
            raise ModelError(f"initializer '{init.name}' cannot be read: {e}") from None
        if arr.dtype == np.float16:
            arr = arr.astype(np.float32)  # float16 storage is widened at import; compute is float32
        arr = np.asarray(arr, order="C")
        env[init.name] = Value(init.name, TensorType(arr.dtype.name, tuple(arr.shape)), const=arr)
    graph = Graph([], [], name=g.name or "main")
    graph_inputs = [inp for inp in g.input if inp.name not in env]
    for inp in graph_inputs:
        if not inp.type.HasField("tensor_type"):
            raise UnsupportedOperator("<input>", inp.name, opset, "only tensor inputs are supported")
    input_dims = _input_dims(graph_inputs, dict(input_shapes or {}))
    graph.bounds = _bounds(input_dims, dynamic_bounds)
    for inp in graph_inputs:
        tt = inp.type.tensor_type
        dims = input_dims[inp.name]
        dtype = dtype_of(tt.elem_type, inp.name)
        if dtype == "float16":
            raise UnsupportedOperator("<input>", inp.name, opset, "float16 graph inputs: Kiln computes in float32 and "
                                      "keeps float16 for stored weights only; kiln.backend widens such inputs")
        v = Value(inp.name, TensorType(dtype, tuple(dims)))
        graph.inputs.append(v)
        env[inp.name] = v
    ctx = Ctx(graph, opset)
    with symbolic.using_bounds(graph.bounds):  # the symbols' bounds decide the importers' comparisons of dims
        for node in g.node:
            ctx.node = node
            if node.domain not in ("", "ai.onnx"):
                raise UnsupportedOperator(node.op_type, ctx.name, opset, f"domain '{node.domain}' is not supported")
            ins: list[Value | None] = []
            for name in node.input:
                if name == "":
                    ins.append(None)
                elif name not in env:
                    raise ModelError(f"node '{ctx.name}' ({node.op_type}) reads '{name}', which no earlier node, input "
                                     "or initializer defines (missing initializer, or nodes not in topological order)")
                else:
                    ins.append(env[name])
            present = [v for v in ins if v is not None]
            if node.op_type not in IMPORTERS:
                if any(v.const is not None and symbolic.is_symbolic_array(v.const) for v in present):
                    raise UnsupportedOperator(node.op_type, ctx.name, opset, "no import function evaluates it on shape "
                                              "values that depend on symbolic dimensions")
                if present and all(v.const is not None for v in present) and node.op_type not in _NON_FOLDABLE:
                    outs = fold_with_reference(ctx, ins)
                else:
                    raise UnsupportedOperator(node.op_type, ctx.name, opset)
            else:
                outs = IMPORTERS[node.op_type](ctx, ins)
            if len(outs) < len([o for o in node.output if o]):
                raise UnsupportedOperator(node.op_type, ctx.name, opset,
                                          f"only the first {len(outs)} output(s) are supported")
            for name, v in zip(node.output, outs):
                if name:
                    env[name] = v
    for out in g.output:
        if out.name not in env:
            raise ModelError(f"graph output '{out.name}' is never produced")
        graph.outputs.append(env[out.name])
    graph.output_names = [o.name for o in g.output]
    _check_no_shape_values(graph)
    graph.verify()
    return graph


_NON_FOLDABLE = {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial", "Bernoulli"}

