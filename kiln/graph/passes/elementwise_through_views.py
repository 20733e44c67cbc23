"""Run an elementwise op on the value under a unit-axis view, so it fuses with that value's producer:

    t = Reshape(v[128, 3072], [1, 128, 3072]);  y = Gelu(t)
  ⇒ y' = Gelu(v);  y = Reshape(y', [1, 128, 3072])

    t = Reshape(v[128, 768], [1, 128, 768]);   y = Add(x[1, 128, 768], t)
  ⇒ y' = Add(Reshape(x, [128, 768]), v);  y = Reshape(y', [1, 128, 768])

torch's `nn.Linear` on a 3-D input is `view → addmm → view`, so every activation and residual add after a linear
layer reads a view; fusion (kernel/build.py) inlines a producer only into a consumer that reads it directly, and
these ran as kernels of their own (torch BERT-base: the GELU, the two residual adds per layer). Reshapes are views,
so the rewrite costs nothing. It applies where the view only adds leading size-1 axes, the view is the value's
only reader and the op the view's, every other operand either broadcasts against the narrower shape unchanged
(rank ≤ the view's input rank) or has only size-1 axes in front (viewed down the same way), the op's result is not
a graph output (it would be copied out), and the op keeps its meaning (same element type, same attributes)."""
from __future__ import annotations

from kiln.graph.ir import Graph, Node, TensorType, Value
from kiln.graph.ops import OPS, infer


def _unit_lead(wide: tuple[int, ...], narrow: tuple[int, ...]) -> bool:
    """wide = (1, …, 1) + narrow, with at least one leading 1."""
    j = len(wide) - len(narrow)
    return j > 0 and wide[j:] == narrow and all(d == 1 for d in wide[:j])


def _view_source(v: Value, shape: tuple[int, ...], users: dict[int, list[Node]], outputs: set[int]) -> Value | None:
    """The value a unit-axis view `v` (of the op's full output shape) shows, if the view is its only reader and
    the op the view's only reader (then the op can fuse into the value's producer), else None."""
    p = v.producer
    if p is None or p.op != "Reshape" or v.shape != shape or len(users.get(id(v), [])) != 1 or id(v) in outputs:
        return None
    src = p.inputs[0]
    return src if _unit_lead(v.shape, src.shape) and len(users.get(id(src), [])) == 1 else None


def elementwise_through_views(g: Graph) -> Graph:
    users = g.consumers()
    outputs = {id(v) for v in g.outputs}  # a graph output left as a view would be copied out: not rewritten
    nodes: list[Node] = []
    for n in g.nodes:
        nodes.append(n)
        if OPS[n.op].kind not in ("unary", "binary") or len(n.outputs) != 1:
            continue
        y = n.outputs[0]
        if id(y) in outputs:
            continue
        src = next((s for s in (_view_source(v, y.shape, users, outputs) for v in n.inputs) if s is not None), None)
        if src is None:
            continue
        rank = len(src.shape)
        pre: list[Node] = []
        inputs: list[Value] = []
        for v in n.inputs:
            s = _view_source(v, y.shape, users, outputs)
            if s is not None and s.shape == src.shape:
                inputs.append(s)
            elif len(v.shape) <= rank:
                inputs.append(v)
            elif _unit_lead(v.shape, v.shape[len(v.shape) - rank:]):
                narrow = TensorType(v.dtype, v.shape[len(v.shape) - rank:])
                if v.const is not None:
                    inputs.append(Value(g.fresh(v.name + ".narrow"), narrow, const=v.const.reshape(narrow.shape)))
                    continue
                nv = Value(g.fresh(v.name + ".narrow"), narrow)
                pre.append(Node("Reshape", [v], [nv], {"shape": narrow.shape}, f"{n.name}.narrow_in"))
                nv.producer = pre[-1]
                inputs.append(nv)
            else:
                break
        else:
            narrow_out = TensorType(y.dtype, src.shape)
            if infer(n.op, [v.type for v in inputs], n.attrs, n.name) != [narrow_out]:
                continue
            y2 = Value(g.fresh(y.name + ".narrow"), narrow_out)
            op = Node(n.op, inputs, [y2], dict(n.attrs), n.name)
            y2.producer = op
            back = Node("Reshape", [y2], [y], {"shape": y.shape}, f"{n.name}.view")
            y.producer = back
            users[id(y2)] = [back]
            nodes[-1:] = pre + [op, back]
    g.nodes = nodes
    return g
