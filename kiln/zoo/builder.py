"""A small graph builder on top of onnx.helper, shared by every zoo model.

It owns the seeded RNG, so a model's weights depend only on the seed and on the
order in which the model's code asks for them: building twice gives identical bytes.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
# onnxruntime accepts IR version 8 for opset 17; newer onnx would stamp a higher one by default.
IR_VERSION = 8


class GraphBuilder:
    """Accumulates nodes, initializers and graph inputs/outputs for one model."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self.inputs: list[onnx.ValueInfoProto] = []
        self.outputs: list[onnx.ValueInfoProto] = []
        self._node_names: set[str] = set()
        self._inits_by_name: dict[str, onnx.TensorProto] = {}

    # ---- graph boundary -------------------------------------------------------------------------

    def input(self, name: str, shape: Sequence[int | str], elem_type: int = TensorProto.FLOAT) -> str:
        """A graph input; a str dim is a dim_param (a symbolic dimension)."""
        self.inputs.append(helper.make_tensor_value_info(name, elem_type, list(shape)))
        return name

    def output(self, name: str, shape: Sequence[int | str]) -> None:
        self.outputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, list(shape)))

    # ---- initializers ---------------------------------------------------------------------------

    def const(self, name: str, value: np.ndarray) -> str:
        """A fixed initializer; re-adding the same name reuses the first one (shared scalars)."""
        if name not in self._inits_by_name:
            tensor = numpy_helper.from_array(np.ascontiguousarray(value), name)
            self._inits_by_name[name] = tensor
            self.initializers.append(tensor)
        return name

    def value(self, name: str) -> np.ndarray:
        """The numpy value of an initializer added earlier."""
        return numpy_helper.to_array(self._inits_by_name[name])

    def normal(self, name: str, shape: Sequence[int], std: float, mean: float = 0.0) -> str:
        arr = self.rng.standard_normal(tuple(shape), dtype=np.float32)
        arr *= np.float32(std)
        arr += np.float32(mean)
        return self._fresh(name, arr)

    def uniform(self, name: str, shape: Sequence[int], low: float, high: float) -> str:
        arr = self.rng.uniform(low, high, size=tuple(shape)).astype(np.float32)
        return self._fresh(name, arr)

    def kaiming(self, name: str, shape: Sequence[int], fan_in: int) -> str:
        """He init, std = sqrt(2 / fan_in): keeps the second moment roughly constant through ReLUs."""
        return self.normal(name, shape, float(np.sqrt(2.0 / fan_in)))

    def _fresh(self, name: str, arr: np.ndarray) -> str:
        if name in self._inits_by_name:
            raise ValueError(f"duplicate initializer {name!r}")
        return self.const(name, arr)

    # ---- nodes ----------------------------------------------------------------------------------

    def op(self, op_type: str, name: str, inputs: Sequence[str], out: str | None = None,
           **attrs: object) -> str:
        """Append one single-output node; its output tensor is `out` or `<name>.out`."""
        if name in self._node_names:
            raise ValueError(f"duplicate node name {name!r}")
        self._node_names.add(name)
        out = out or f"{name}.out"
        self.nodes.append(helper.make_node(op_type, list(inputs), [out], name=name, **attrs))
        return out

    def op_outputs(self, op_type: str, name: str, inputs: Sequence[str], outs: Sequence[str],
                   **attrs: object) -> list[str]:
        """Append one node with several outputs (Split)."""
        if name in self._node_names:
            raise ValueError(f"duplicate node name {name!r}")
        self._node_names.add(name)
        self.nodes.append(helper.make_node(op_type, list(inputs), list(outs), name=name, **attrs))
        return list(outs)

    def constant_i64(self, name: str, values: Sequence[int] | int) -> str:
        """An int64 Constant node, the way the PyTorch exporter writes shape-arithmetic operands."""
        arr = np.array(values, dtype=np.int64)
        return self.op("Constant", name, [], value=numpy_helper.from_array(arr, f"{name}.value"))

    # ---- common layers --------------------------------------------------------------------------

    def linear_gemm(self, x: str, name: str, cin: int, cout: int, out: str | None = None) -> str:
        """torch.nn.Linear as the exporter writes it for 2-D input: Gemm with transB=1, W is [out, in]."""
        w = self.kaiming(f"{name}.weight", (cout, cin), cin)
        b = self.normal(f"{name}.bias", (cout,), 0.1)
        return self.op("Gemm", name, [x, w, b], out=out, alpha=1.0, beta=1.0, transB=1)

    # ---- finish ---------------------------------------------------------------------------------

    def model(self, graph_name: str) -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, graph_name, self.inputs, self.outputs, self.initializers)
        model = helper.make_model(
            graph,
            opset_imports=[helper.make_opsetid("", OPSET)],
            ir_version=IR_VERSION,
            producer_name="kiln.zoo",
            producer_version="1",
        )
        model.doc_string = f"kiln.zoo model {graph_name!r}: random seeded weights, float32"
        return model
