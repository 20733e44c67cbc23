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

import numpy as np
import onnx
from onnx import numpy_helper

from kiln.errors import ModelError, UnsupportedOperator
from kiln.frontend.context import Ctx, dtype_of
from kiln.frontend.importers import IMPORTERS, fold_with_reference
from kiln.graph import symbolic
from kiln.graph.ir import Graph, TensorType, Value

MIN_OPSET, MAX_OPSET = 7, 22


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

