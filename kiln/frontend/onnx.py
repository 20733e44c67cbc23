"""ONNX → Graph IR.

Walks the ONNX graph in order; each node goes through the import function registered for its op type in
`IMPORTERS` (kiln/frontend/importers/, one module per op family). Nodes whose inputs are all constants are
evaluated right here (shape sub-graphs such as Shape→Gather→Unsqueeze→Concat→Reshape fold away at import,
because every shape is known). Anything Kiln cannot compile raises at import, never at run time."""
from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from kiln.errors import ModelError, UnsupportedOperator
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

    def const(self, v: Value | None, what: str) -> np.ndarray:
        """A constant input (shapes, axes, pads…); Kiln compiles for static shapes, so these must be known."""
        if v is None:
            raise self.unsupported(f"input '{what}' is missing")
        if v.const is None:
            raise self.unsupported(f"input '{what}' is computed at run time; Kiln needs it constant")
        return v.const

    def constant(self, array: np.ndarray) -> Value:
        arr = np.asarray(array, order="C")
        return Value(self.graph.fresh("const"), TensorType(arr.dtype.name, tuple(arr.shape)), const=arr)

    def add(self, op: str, inputs: Sequence[Value], **attrs: Any) -> Value:
        """Append a core node — or, when all its inputs are constants, its value (folding at import)."""
        from kiln.graph.ops import evaluate

        out = self.graph.add(op, list(inputs), attrs, name=self.name)[0]
        if inputs and all(v.const is not None for v in inputs):
            vals = evaluate(op, [v.const for v in inputs], attrs)
            if vals is not None:
                self.graph.nodes.pop()
                return self.constant(np.asarray(vals[0]).astype(out.dtype).reshape(out.shape))
        return out


def import_onnx(model: onnx.ModelProto | str | bytes | os.PathLike,
                input_shapes: dict[str, Sequence[int]] | None = None) -> Graph:
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
    shapes = dict(input_shapes or {})
    for inp in g.input:
        if inp.name in env:
            continue
        tt = inp.type.tensor_type
        if not inp.type.HasField("tensor_type"):
            raise UnsupportedOperator("<input>", inp.name, opset, "only tensor inputs are supported")
        dims = [d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim]
        if inp.name in shapes:
            given = tuple(int(d) for d in shapes.pop(inp.name))
            if len(given) != len(dims) or any(d is not None and d != s for d, s in zip(dims, given)):
                raise ValueError(f"input '{inp.name}': shape {given} does not fit the model's {dims}")
            dims = list(given)
        if any(d is None for d in dims):
            sym = [d.dim_param or "?" for d in tt.shape.dim]
            raise ValueError(f"input '{inp.name}' has symbolic dimensions {sym}: pass input_shapes="
                             f"{{'{inp.name}': (...)}} to compile for a concrete shape")
        dtype = dtype_of(tt.elem_type, inp.name)
        if dtype == "float16":
            raise UnsupportedOperator("<input>", inp.name, opset, "float16 graph inputs: Kiln computes in float32 and "
                                      "keeps float16 for stored weights only; kiln.backend widens such inputs")
        v = Value(inp.name, TensorType(dtype, tuple(dims)))
        graph.inputs.append(v)
        env[inp.name] = v
    if shapes:
        raise ValueError(f"input_shapes names unknown inputs {sorted(shapes)}; inputs are "
                         f"{[v.name for v in graph.inputs]}")
    ctx = Ctx(graph, opset)
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
    graph.verify()
    return graph


_NON_FOLDABLE = {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial", "Bernoulli"}

