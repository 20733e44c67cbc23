"""1-D convolutions as 2-D ones of height 1, so they take the 2-D paths (packed weights, the blocked layout, the
register tile over output pixels) instead of a generic loop nest:

    y[N, Co, L'] = Conv(x[N, C, L], W[Co, C, k], strides=(s,), pads=(a, b), dilations=(d,))
  ⇒ y = Reshape(Conv(Reshape(x, [N, C, 1, L]), W[Co, C, 1, k], strides=(1, s), pads=(0, a, 0, b),
                     dilations=(1, d)), [N, Co, L'])

Reshapes are views (no copy). Speech models start with such convs (wav2vec2's feature extractor, Whisper's two
convs over log-mel frames): generic loop nest ≈ 4 GFLOP/s, as 2-D convs the register tile's rate."""
from __future__ import annotations

from kiln.graph.ir import Graph, Node, TensorType, Value


def conv1d_as_2d(g: Graph) -> Graph:
    nodes: list[Node] = []
    for n in g.nodes:
        if n.op != "Conv" or len(n.inputs[0].shape) != 3 or n.inputs[1].const is None:
            nodes.append(n)
            continue
        x, w = n.inputs[0], n.inputs[1]
        a = n.attrs
        (s,), (d,), (p0, p1) = a["strides"], a["dilations"], a["pads"]
        x4 = Value(g.fresh(x.name + ".2d"), TensorType(x.dtype, x.shape[:2] + (1,) + x.shape[2:]))
        nodes.append(Node("Reshape", [x], [x4], {"shape": x4.shape}, f"{n.name}.in2d"))
        x4.producer = nodes[-1]
        w4 = Value(g.fresh(w.name + ".2d"), TensorType(w.dtype, w.shape[:2] + (1,) + w.shape[2:]),
                   const=w.const.reshape(w.shape[:2] + (1,) + w.shape[2:]))
        y = n.outputs[0]
        y4 = Value(g.fresh(y.name + ".2d"), TensorType(y.dtype, y.shape[:2] + (1,) + y.shape[2:]))
        attrs = {**a, "strides": (1, s), "dilations": (1, d), "pads": (0, p0, 0, p1)}
        conv = Node("Conv", [x4, w4] + n.inputs[2:], [y4], attrs, n.name)
        y4.producer = conv
        back = Node("Reshape", [y4], [y], {"shape": y.shape}, f"{n.name}.out1d")
        y.producer = back
        nodes += [conv, back]
    g.nodes = nodes
    return g
