"""GELU spelled out in elementwise nodes (as torch.onnx exports nn.GELU / HF's `gelu` before opset 20) becomes one
`Gelu` node:

    d = Div(x, √2) (or Mul(x, 1/√2));  e = Erf(d);  a = Add(e, 1);  y = Mul(Mul(x, a), 0.5)
  ⇒ y = Gelu(x, approximate="none")

with the three factors x, a, 0.5 multiplied in any order and association (Mul(Mul(x, 0.5), a), Mul(x, Mul(a, 0.5)),
…). Spelled out, x has two readers (the Div and the Mul), so neither the erf chain nor the product fuses into the
GEMM that produces x: the product ran as a kernel of its own, reading the [tokens, 3072] activation twice (BERT-base
ONNX: one per layer). As one node it is the GEMM's epilogue (kernel/build.py). Every intermediate value must have
that one reader and be no graph output; the constants must match to float32 rounding."""
from __future__ import annotations

import math

import numpy as np

from kiln.graph.ir import Graph, Node, Value


def _const(v: Value, want: float) -> bool:
    return v.const is not None and v.const.size == 1 and bool(np.isclose(float(v.const.reshape(-1)[0]), want,
                                                                          rtol=1e-6, atol=0.0))


def _other(n: Node, v: Value) -> Value | None:
    """The operand of binary node n that is not v (None if v is not an operand)."""
    if len(n.inputs) != 2:
        return None
    a, b = n.inputs
    return b if a is v else a if b is v else None


def _erf_argument(a: Value) -> Value | None:
    """x, if a = Add(Erf(x / √2), 1) in either operand order."""
    add = a.producer
    if add is None or add.op != "Add":
        return None
    for e, one in (add.inputs, add.inputs[::-1]):
        if not _const(one, 1.0) or e.producer is None or e.producer.op != "Erf":
            continue
        d = e.producer.inputs[0].producer
        if d is None:
            continue
        if d.op == "Div" and _const(d.inputs[1], math.sqrt(2.0)):
            return d.inputs[0]
        if d.op == "Mul":
            for x, c in (d.inputs, d.inputs[::-1]):
                if _const(c, 1.0 / math.sqrt(2.0)):
                    return x
    return None


def _factors(v: Value, users: dict[int, list[Node]], outputs: set[int], top: bool) -> list[Value]:
    """The leaves of the tree of single-reader Muls computing v (v itself if it is not such a Mul)."""
    p = v.producer
    if p is None or p.op != "Mul" or len(p.inputs) != 2 or (
            not top and (len(users.get(id(v), [])) != 1 or id(v) in outputs)):
        return [v]
    return _factors(p.inputs[0], users, outputs, False) + _factors(p.inputs[1], users, outputs, False)


def _chain_private(a: Value, users: dict[int, list[Node]], outputs: set[int]) -> bool:
    """The Add, the Erf and the division each have one reader and are no graph output (x itself may have any)."""
    e = next(v for v in a.producer.inputs if v.producer is not None and v.producer.op == "Erf")
    d = e.producer.inputs[0]
    return all(len(users.get(id(v), [])) == 1 and id(v) not in outputs for v in (a, e, d))


def recognize_gelu(g: Graph) -> Graph:
    users = g.consumers()
    outputs = {id(v) for v in g.outputs}
    nodes: list[Node] = []
    for n in g.nodes:
        nodes.append(n)
        if n.op != "Mul" or len(n.outputs) != 1 or n.outputs[0].dtype != "float32":
            continue
        leaves = _factors(n.outputs[0], users, outputs, True)
        if len(leaves) != 3:
            continue
        half = [v for v in leaves if _const(v, 0.5)]
        rest = [v for v in leaves if not _const(v, 0.5)]
        if len(half) != 1 or len(rest) != 2:
            continue
        for x, a in (rest, rest[::-1]):
            if _erf_argument(a) is x and _chain_private(a, users, outputs) and x.shape == n.outputs[0].shape:
                y = n.outputs[0]
                gelu = Node("Gelu", [x], [y], {"approximate": "none"}, n.name)
                y.producer = gelu
                nodes[-1] = gelu
                break
    g.nodes = nodes  # the spelled-out chain is dead now: eliminate_dead_code drops it
    return g
