"""Fold explicit zero padding into the convolutions that read it, and drop pads that pad nothing.

    y = Conv(Pad(x, pads=[0, 0, t, l, 0, 0, b, r], mode=constant, value=0), W, pads=p)
      ⇒ y = Conv(x, W, pads=p + [t, l, b, r])

Exporters write a `Pad` before every convolution of some implementations (TF-style "same" padding, MobileNet
ports: 1×1 convs included); as its own kernel it is a full copy of the activation per conv. Folded when the Pad is
constant-zero, pads only spatial axes and never crops, and every reader is a Conv taking it as its input. A Pad
whose pads are all zero (any mode) is the identity and is dropped."""
from __future__ import annotations

from kiln.graph.ir import Graph, Node, Value


def _spatial_zero_pad(pad: Node) -> tuple[int, ...] | None:
    """The pads of the spatial axes as Conv spells them ([lo…, hi…]), if `pad` is a foldable zero pad."""
    pads, rank = pad.attrs["pads"], len(pad.inputs[0].shape)
    if pad.attrs["mode"] != "constant" or float(pad.attrs["value"]) != 0.0 or rank < 3 or min(pads) < 0:
        return None
    lo, hi = pads[:rank], pads[rank:]
    if any(lo[:2]) or any(hi[:2]):  # batch or channel padding: not a conv's padding
        return None
    return tuple(lo[2:]) + tuple(hi[2:])


def fold_pad(g: Graph) -> Graph:
    users = g.consumers()
    outputs = {id(v) for v in g.outputs}
    new_of: dict[int, Value] = {}
    drop: set[int] = set()
    for n in g.nodes:
        if n.op != "Pad" or id(n.outputs[0]) in outputs or n.inputs[0].const is not None:
            continue
        x, y = n.inputs[0], n.outputs[0]
        if not any(n.attrs["pads"]):
            new_of[id(y)] = new_of.get(id(x), x)
            drop.add(id(n))
            continue
        extra = _spatial_zero_pad(n)
        readers = users.get(id(y), [])
        if extra is None or not readers or any(r.op != "Conv" or r.inputs[0] is not y or y in r.inputs[1:]
                                               for r in readers):
            continue
        nd = len(extra) // 2
        for conv in readers:
            p = conv.attrs["pads"]
            conv.attrs = {**conv.attrs, "pads": tuple(p[i] + extra[i] for i in range(2 * nd))}
        new_of[id(y)] = new_of.get(id(x), x)
        drop.add(id(n))
    g.replace_all_uses(new_of)
    g.nodes = [n for n in g.nodes if id(n) not in drop]
    return g
