"""Recognize GELU spelled out in elementwise nodes (how exporters write nn.GELU() before opset 20) as one Gelu node:

    d = Div(x, √2) | Mul(x, 1/√2);  e = Erf(d);  a = Add(e, 1);  y = Mul(Mul(x, a), ½) | Mul(Mul(x, ½), a)
      ⇒ y = Gelu(x, approximate="none")

Why: x is read twice (by the Div and by the Mul), so as five nodes it has two consumers and stays a tensor of its
own — the anchor that produces it (BERT's FFN up-projection) writes it and a separate kernel reads it back for
the GELU. As one Gelu node it is a single-reader unary op, which fusion (kernel/build.py) puts in the anchor's
epilogue: computed on the hot C block, and — with precision="bf16" — rounded there for the next MatMul. The
operands may come in either order (all three ops commute); every intermediate must have the chain as its only
reader and not be a graph output; the constants must be those values to float32 precision."""
from __future__ import annotations

import math

import numpy as np

from kiln.graph.ir import Graph, Node, Value


def _scalar(v: Value, want: float) -> bool:
    c = v.const
    return c is not None and c.size == 1 and c.dtype == np.float32 and \
        abs(float(c.reshape(())) - want) <= 1e-6 * abs(want)


def _split(n: Node, want: float) -> Value | None:
    """The non-constant operand of a binary node whose other operand is the scalar `want`."""
    a, b = n.inputs
    if _scalar(b, want) and a.const is None:
        return a
    if n.op in ("Mul", "Add") and _scalar(a, want) and b.const is None:
        return b
    return None


def fuse_gelu(g: Graph) -> Graph:
    users = g.consumers()
    outputs = {id(v) for v in g.outputs}

    def only_reader(v: Value) -> Node | None:
        readers = users.get(id(v), [])
        return readers[0] if len(readers) == 1 and id(v) not in outputs else None

    replace: dict[int, Node] = {}   # id(last node of a chain) → its Gelu
    drop: set[int] = set()
    for erf in g.nodes:
        if erf.op != "Erf":
            continue
        d = erf.inputs[0].producer
        if d is None or only_reader(erf.inputs[0]) is not erf:
            continue
        x = _split(d, math.sqrt(2.0)) if d.op == "Div" else _split(d, 1 / math.sqrt(2.0)) if d.op == "Mul" else None
        add = only_reader(erf.outputs[0])
        if x is None or add is None or add.op != "Add" or _split(add, 1.0) is not erf.outputs[0]:
            continue
        mul = only_reader(add.outputs[0])
        if mul is None or mul.op != "Mul":
            continue
        other = mul.inputs[1] if mul.inputs[0] is add.outputs[0] else mul.inputs[0]
        if other is x:                                        # (x · a) · ½
            half = only_reader(mul.outputs[0])
            if half is None or half.op != "Mul" or _split(half, 0.5) is not mul.outputs[0]:
                continue
            chain = [d, erf, add, mul, half]
        else:                                                 # (x · ½) · a
            half = other.producer
            if half is None or half.op != "Mul" or _split(half, 0.5) is not x or only_reader(other) is not mul:
                continue
            chain = [d, erf, add, half, mul]
        if x.dtype != "float32":
            continue
        last = chain[-1]
        y = last.outputs[0]
        gelu = Node("Gelu", [x], [y], {"approximate": "none"}, last.name)
        y.producer = gelu
        replace[id(last)] = gelu
        drop.update(id(n) for n in chain[:-1])
    g.nodes = [replace.get(id(n), n) for n in g.nodes if id(n) not in drop]
    return g
