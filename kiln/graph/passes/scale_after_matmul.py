"""Scalar factors on a MatMul's operands move to its result:

    MatMul(Mul(a, s), Mul(b, t))  ⇒  Mul(MatMul(a, b), s·t)        (s, t scalar constants; Reshapes (views) between
                                                                  a Mul and the MatMul are kept, on a and b)

torch's scaled_dot_product_attention decomposes into q·√scale and k·√scale before the bmm, so each operand was a
copy with a multiply (the head transpose fused into it) that the MatMul could not read in place; moved to the result,
the scale is one multiply in the MatMul's epilogue (kernel/build.py) and q's head split is read in place. Each Mul
and each view on the way must have that one reader; the product's rounding differs from the factors' by at most an
ulp or two of the scale (float32)."""
from __future__ import annotations

import numpy as np

from kiln.graph.ir import Graph, Node, TensorType, Value


def _scalar(v: Value) -> float | None:
    return float(v.const.reshape(-1)[0]) if v.const is not None and v.const.size == 1 else None


def _scaled_operand(v: Value, users: dict[int, list[Node]], outputs: set[int]) -> tuple[list[Value], Node] | None:
    """(the chain of views (Reshapes) from v up to the Mul's output, the Mul) when v = views(Mul(x, s)) with every
    link read only by the next; None otherwise."""
    chain = [v]
    while True:
        cur = chain[-1]
        if len(users.get(id(cur), [])) != 1 or id(cur) in outputs or cur.producer is None:
            return None
        p = cur.producer
        if p.op == "Reshape" and p.inputs[0].type.size == cur.type.size:
            chain.append(p.inputs[0])
            continue
        if p.op == "Mul" and len(p.inputs) == 2 and cur.dtype == "float32":
            x, s = p.inputs if _scalar(p.inputs[1]) is not None else p.inputs[::-1]
            if _scalar(s) is not None and x.shape == cur.shape and x.dtype == cur.dtype:
                return chain, p
        return None


def scale_after_matmul(g: Graph) -> Graph:
    users = g.consumers()
    outputs = {id(v) for v in g.outputs}
    nodes: list[Node] = []
    for n in g.nodes:
        nodes.append(n)
        if n.op != "MatMul" or n.outputs[0].dtype != "float32":
            continue
        factor, found = 1.0, False
        for v in n.inputs:
            hit = _scaled_operand(v, users, outputs)
            if hit is None:
                continue
            chain, mul = hit
            x, s = mul.inputs if _scalar(mul.inputs[1]) is not None else mul.inputs[::-1]
            factor *= _scalar(s)  # type: ignore[operator]
            found = True
            reader = chain[-2].producer if len(chain) > 1 else n  # the first view after the Mul, or the MatMul
            assert reader is not None
            reader.inputs = [x if r is chain[-1] else r for r in reader.inputs]
        if not found:
            continue
        y = n.outputs[0]
        raw = Value(g.fresh(y.name + ".unscaled"), TensorType(y.dtype, y.shape), producer=n)
        n.outputs = [raw]
        scale = Value(g.fresh(n.name + ".scale"), TensorType("float32", ()), const=np.array(factor, np.float32))
        mul = Node("Mul", [raw, scale], [y], {}, f"{n.name}.scale")
        y.producer = mul
        nodes.append(mul)
    g.nodes = nodes  # the operands' Muls are dead now: eliminate_dead_code drops them
    return g
