"""Graph IR: typed values, nodes with normalized attributes, printable and verifiable.

Node ops are Kiln's core op set (see `ops.py`); the frontend maps ONNX onto it, so passes and
lowering never deal with opset differences."""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

import numpy as np

import kiln.graph.quant_ops  # noqa: F401  (registers the quantized core ops in the op table)
from kiln.errors import ModelError
from kiln.graph.ops import infer
from kiln.graph.symbolic import Dim
from kiln.graph.types import TensorType

__all__ = ["Graph", "Node", "TensorType", "Value"]


@dataclass(eq=False)
class Value:
    name: str
    type: TensorType
    const: np.ndarray | None = None   # set for initializers and folded constants
    producer: Node | None = None

    @property
    def shape(self) -> tuple[Dim, ...]:
        return self.type.shape

    @property
    def dtype(self) -> str:
        return self.type.dtype

    def __repr__(self) -> str:
        return f"%{self.name}"


@dataclass(eq=False)
class Node:
    op: str
    inputs: list[Value]
    outputs: list[Value]
    attrs: dict[str, Any] = field(default_factory=dict)
    name: str = ""

    def __str__(self) -> str:
        outs = ", ".join(f"%{v.name}: {v.type}" for v in self.outputs)
        ins = ", ".join(f"%{v.name}" + ("(const)" if v.const is not None else "") for v in self.inputs)
        attrs = "".join(f" {k}={_fmt(v)}" for k, v in self.attrs.items())
        return f"{outs} = {self.op}({ins}){attrs}  # {self.name}"


def _fmt(v: Any) -> str:
    if isinstance(v, Graph):
        return "{" + "; ".join(f"{n.op}" for n in v.nodes) + "}"
    if isinstance(v, np.ndarray):
        return f"array{list(v.shape)}"
    return repr(v)


@dataclass(eq=False)
class Graph:
    inputs: list[Value]
    outputs: list[Value]
    nodes: list[Node] = field(default_factory=list)
    name: str = "main"
    output_names: list[str] = field(default_factory=list)  # the model's names for `outputs`
    # every symbol in any shape → its inclusive (lo, hi); empty for a static graph (kiln/graph/symbolic.py)
    bounds: dict[str, tuple[int, int]] = field(default_factory=dict)
    _ids: itertools.count = field(default_factory=itertools.count, repr=False)

    # -- construction -------------------------------------------------------------------------------------
    def fresh(self, hint: str) -> str:
        return f"{hint}.{next(self._ids)}"

    def add(self, op: str, inputs: list[Value], attrs: dict[str, Any] | None = None, name: str = "",
            out_names: list[str] | None = None) -> list[Value]:
        """Append a node, inferring its output types from the core op table."""
        attrs = attrs or {}
        types = infer(op, [v.type for v in inputs], attrs, name, self.bounds)
        names = out_names or [self.fresh(name or op) for _ in types]
        node = Node(op, list(inputs), [], attrs, name or names[0])
        node.outputs = [Value(n, t, producer=node) for n, t in zip(names, types)]
        self.nodes.append(node)
        return node.outputs

    # -- queries -----------------------------------------------------------------------------------------
    def consumers(self) -> dict[int, list[Node]]:
        """id(value) → nodes reading it."""
        users: dict[int, list[Node]] = {}
        for n in self.nodes:
            for v in n.inputs:
                users.setdefault(id(v), []).append(n)
        return users

    def values(self) -> list[Value]:
        seen: dict[int, Value] = {id(v): v for v in self.inputs}
        for n in self.nodes:
            for v in itertools.chain(n.inputs, n.outputs):
                seen.setdefault(id(v), v)
        return list(seen.values())

    def replace_uses(self, old: Value, new: Value) -> None:
        self.replace_all_uses({id(old): new})

    def replace_all_uses(self, new_of: dict[int, Value]) -> None:
        """Every read of a value whose id is in `new_of` reads its replacement instead: one walk over the graph
        for any number of replacements (a pass that replaced values one at a time was quadratic)."""
        if not new_of:
            return
        for n in self.nodes:
            if any(id(v) in new_of for v in n.inputs):
                n.inputs = [new_of.get(id(v), v) for v in n.inputs]
        self.outputs = [new_of.get(id(v), v) for v in self.outputs]

    # -- checking and printing -----------------------------------------------------------------------------
    def verify(self) -> None:
        """Every input defined before use (topological order), types consistent with the op table."""
        defined = {id(v) for v in self.inputs}
        for n in self.nodes:
            for v in n.inputs:
                if id(v) not in defined and v.const is None:
                    raise ModelError(f"node '{n.name}' ({n.op}) reads %{v.name}, which is not defined before it")
            types = infer(n.op, [v.type for v in n.inputs], n.attrs, n.name, self.bounds)
            if types != [v.type for v in n.outputs]:
                raise ModelError(f"node '{n.name}' ({n.op}): output types {[str(v.type) for v in n.outputs]} "
                                 f"but the op infers {[str(t) for t in types]}")
            for v in n.outputs:
                if v.producer is not n:
                    raise ModelError(f"%{v.name} has a stale producer link")
                defined.add(id(v))
        for v in self.outputs:
            if id(v) not in defined and v.const is None:
                raise ModelError(f"graph output %{v.name} is never produced")

    def __str__(self) -> str:
        lines = [f"graph {self.name}(" + ", ".join(f"%{v.name}: {v.type}" for v in self.inputs) + ") {"]
        if self.bounds:
            lines.insert(0, "symbols " + ", ".join(f"{k} in [{lo}, {hi}]" for k, (lo, hi) in self.bounds.items()))
        lines += ["  " + str(n) for n in self.nodes]
        lines.append("  return " + ", ".join(f"%{v.name}" for v in self.outputs))
        lines.append("}")
        return "\n".join(lines)
