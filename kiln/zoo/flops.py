"""FLOP counting from the graph itself: 2 * MACs of Conv, MatMul and Gemm, everything else ignored.

Counting from the built graph (rather than from per-model formulas) means the number can never
drift from what the model actually computes.
"""
from __future__ import annotations

import math

import onnx
from onnx import helper, shape_inference

MAC_OPS = ("Conv", "MatMul", "Gemm")


def _weightless(model: onnx.ModelProto) -> onnx.ModelProto:
    """Same graph with initializers turned into typed inputs: shape inference needs only their
    shapes, and skipping hundreds of MB of weights makes it cheap."""
    graph = model.graph
    weights = [helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)) for t in graph.initializer]
    slim = helper.make_graph(list(graph.node), graph.name, list(graph.input) + weights, list(graph.output))
    return helper.make_model(slim, opset_imports=list(model.opset_import), ir_version=model.ir_version)


def _shapes(model: onnx.ModelProto) -> dict[str, list[int]]:
    # data_prop lets inference evaluate the Shape -> Gather -> Concat -> Reshape sub-graphs.
    inferred = shape_inference.infer_shapes(_weightless(model), strict_mode=True, data_prop=True)
    g = inferred.graph
    shapes: dict[str, list[int]] = {}
    for vi in [*g.input, *g.value_info, *g.output]:
        dims = vi.type.tensor_type.shape.dim
        if all(d.HasField("dim_value") for d in dims):
            shapes[vi.name] = [d.dim_value for d in dims]
    return shapes


def _macs(node: onnx.NodeProto, shapes: dict[str, list[int]]) -> int:
    def shape(name: str) -> list[int]:
        if name not in shapes:
            raise ValueError(f"cannot count FLOPs of {node.name!r}: shape of {name!r} unknown")
        return shapes[name]

    out = shape(node.output[0])
    if node.op_type == "Conv":
        w = shape(node.input[1])  # [Cout, Cin/group, kh, kw]: every output element costs one filter
        return math.prod(out) * math.prod(w[1:])
    if node.op_type == "MatMul":
        a = shape(node.input[0])
        return math.prod(out) * a[-1]
    # Gemm: K is A's contracted dimension, which depends on transA.
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    a = shape(node.input[0])
    return math.prod(out) * (a[0] if attrs.get("transA", 0) else a[1])


def count_flops(model: onnx.ModelProto) -> float:
    shapes = _shapes(model)
    return float(2 * sum(_macs(n, shapes) for n in model.graph.node if n.op_type in MAC_OPS))
