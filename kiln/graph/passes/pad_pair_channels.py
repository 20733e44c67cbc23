"""bf16 convs on a few input channels (an RGB stem) read them padded to a 4-channel block, where `vdpbf16ps` is the
target's only bf16 dot product (`pairs_only`: Zen 4, Cooper Lake):

    Conv(x[N, 3, H, W], W[Co, 3, kh, kw])  precision=bf16
  ⇒ Conv(Pad(x, channels 3 → 4, zeros), W[Co, 4, kh, kw] (the 4th channel's weights zero))  pair_block=4

block_layout then reorders the padded input into blocks of 4 (`pair_block`: 8 bytes a pixel once it is bf16), and
the conv's A holds each channel pair contiguously — the form of the pair tile (schedule/bf16.py). Without the pad
the input stays NCHW, whose flattened K (Ci·kh·kw) is strided, and there the anchor stays float32
(graph/passes/precision.py): resnet50's 7×7/2 stem was 1.16 ms of its 21.3 ms bf16 run at 204 GFLOP/s, the rate of
float32. The zero channel costs a third more multiply-adds on a dot product with twice float32's throughput.
Convs whose channels a float block already divides, and every other target, are left as they are."""
from __future__ import annotations

import numpy as np

from kiln.graph.ir import Graph, Node, TensorType, Value
from kiln.graph.passes.block_layout import BLOCKED_STRATEGIES, channel_block
from kiln.graph.passes.precision import pairs_only
from kiln.strategy import strategy_of
from kiln.target import Target

PAIR_BLOCK = 4  # channels: two pairs, 8 bytes of bf16 a pixel


def _takes(n: Node, target: Target) -> bool:
    if n.op != "Conv":
        return False
    x, w = n.inputs[0], n.inputs[1]
    return (n.attrs.get("precision") == "bf16" and n.attrs.get("group", 1) == 1
            and len(x.shape) == 4 and isinstance(x.shape[1], int) and x.dtype == "float32"
            and w.const is not None and w.dtype == "float32" and strategy_of(n.attrs) in BLOCKED_STRATEGIES
            and x.shape[1] < PAIR_BLOCK * 2 and channel_block(x.shape[1], target) == 0)


def pad_pair_channels(g: Graph, target: Target, options: dict[str, bool] | None = None) -> Graph:
    if not pairs_only(target) or not (options or {}).get("block_layout", True):  # the pad is for the blocked tile
        return g
    old, g.nodes = g.nodes, []      # rebuilt in order: g.add appends each pad before its conv
    padded: dict[int, Value] = {}  # id(x) → Pad(x): convs reading the same input share one pad
    for n in old:
        if _takes(n, target):
            x, w = n.inputs[0], n.inputs[1]
            extra = -x.shape[1] % PAIR_BLOCK
            if extra and id(x) not in padded:
                (padded[id(x)],) = g.add("Pad", [x], {"pads": (0, 0, 0, 0, 0, extra, 0, 0), "mode": "constant",
                                                      "value": 0.0}, f"{n.name}.pad_channels")
            wp = np.pad(w.const, ((0, 0), (0, extra), (0, 0), (0, 0)))
            wv = Value(g.fresh(w.name + ".pad_channels"), TensorType("float32", wp.shape), const=wp)
            n.inputs = [padded.get(id(x), x), wv] + n.inputs[2:]
            n.attrs = {**n.attrs, "pair_block": PAIR_BLOCK}
        g.nodes.append(n)
    return g
