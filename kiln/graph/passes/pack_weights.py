"""Pack constant weights into NR-wide panels at compile time ("data tiling").

    MatMul(A[.., M, K], B[K, N] const)  ⇒  PackedMatMul(A, Bp[⌈N/NR⌉, K, NR])          (last panel zero-padded)
    Conv(X, W[Co, Ci, kh, kw] const)   ⇒  PackedConv(X, Wp[⌈Co/NR⌉, Ci, kh, kw, NR])  (output channels innermost)

Each NR-wide panel is one contiguous stream that the register tile reads with unit stride. For a
PackedConv the tile's vectors run over output channels (as in NHWC libraries) and the input pixels are
broadcast, so a 7×7 or strided layer fills its vectors as well as a 56×56 one; it is chosen per conv when
that fills lanes better than vectorizing along the output row. NR comes from the target's vector width."""
from __future__ import annotations

import numpy as np

from kiln.graph.ir import Graph, Node, TensorType, Value
from kiln.graph.ops import OPS, OpDef, acc_dtype, broadcast, packed_conv_shape
from kiln.strategy import strategy_of
from kiln.target import Target

MIN_N = 32   # narrower B: nothing to gain
MIN_K = 16


def _packed_shape(ts: list[TensorType], a: dict) -> list[TensorType]:
    x, bp = ts[0].shape, ts[1].shape
    if not (x[-1] <= 2 * bp[1] if a.get("vnni") else x[-1] == bp[1]):  # bf16: K in pairs, padded (passes/precision.py)
        raise ValueError(f"PackedMatMul: K of {x} differs from panels {bp}")
    return [TensorType(acc_dtype(ts[0].dtype), broadcast(x[:-2], ()) + (x[-2], a["n"]))]


def unpack(bp: np.ndarray, n: int) -> np.ndarray:
    return bp.transpose(1, 0, 2).reshape(bp.shape[1], -1)[:, :n]


OPS["PackedMatMul"] = OpDef(_packed_shape, lambda xs, a: [np.matmul(xs[0], unpack(xs[1], a["n"]))], "anchor")


def pack(b: np.ndarray, nr: int) -> np.ndarray:
    k, n = b.shape
    panels = -(-n // nr)
    padded = np.zeros((k, panels * nr), dtype=b.dtype)
    padded[:, :n] = b
    return np.ascontiguousarray(padded.reshape(k, panels, nr).transpose(1, 0, 2))


OPS["PackedConv"] = OpDef(packed_conv_shape, None, "anchor")


def lane_fill(n: int, widths: tuple[int, ...]) -> float:
    """Best fraction of vector lanes doing useful work when n elements are cut into one of `widths`."""
    return max(n / (-(-n // w) * w) for w in widths)


def conv_by_channels(x: tuple[int, ...], y: tuple[int, ...], w: tuple[int, ...], a: dict, lanes: int) -> bool:
    """Vectorize a conv over output channels (its output channels fill whole NR-wide panels and the
    reduction is long enough to pay for the strided (scatter) stores of each finished tile) when that beats
    vectors along the output row (or the whole plane for 1×1/stride-1/unpadded convs): for strided and k×k
    convs, for 1×1 convs on small planes with long weight rows, and wherever rows fill lanes badly."""
    if a["group"] != 1 or len(x) != 4 or w[1] * w[2] * w[3] < 64:
        return False
    plane = y[2] * y[3] if w[2:] == (1, 1) and a["strides"] == (1, 1) and not any(a["pads"]) else y[3]
    widths = (lanes, 2 * lanes, 3 * lanes)
    if lane_fill(w[0], (2 * lanes,)) < 0.95:
        return False
    # measured per layer in resnet50 (ms, rows → by channels, with the tile's MR kept below spilling): strided
    # and k×k convs go by channels (3×3/2 2.77 → 1.25, 3×3 at 14–56 px 1.30 → 1.15, 7×7/2 stem 1.56 → 1.42: the
    # row vectors need shuffles or pay for padding lanes); 1×1 ones only on small planes with long weight
    # rows (14×14, Ci=1024: 1.07 → 0.50; the rows' broadcasts, ≥ 2 KiB apart, share L1 sets) — with Ci=256
    # on 14×14, and on 28×28 and 56×56 planes, rows win (0.51 vs 0.55–0.95)
    if w[2:] != (1, 1) or a["strides"] != (1, 1) or (plane <= 16 * lanes and w[1] >= 512):
        return True
    return lane_fill(plane, widths) < 0.85


def pack_weights(g: Graph, target: Target) -> Graph:
    nr = 2 * target.lanes(32)
    for i, n in enumerate(g.nodes):
        strategy = strategy_of(n.attrs)
        if strategy.startswith("library"):
            continue  # a library packs its own operands from the plain layout
        # a microkernel needs its B operand in NR panels: every dense 2-D conv goes by channels
        by_channels = strategy == "ukernel" and n.op == "Conv" and n.attrs.get("group") == 1 \
            and len(n.inputs[0].shape) == 4
        if n.op == "Conv" and n.inputs[1].const is not None and n.inputs[1].dtype == "float32" and (by_channels or
                conv_by_channels(n.inputs[0].shape, n.outputs[0].shape, n.inputs[1].shape, n.attrs, target.lanes(32))):
            w = n.inputs[1].const
            co = w.shape[0]
            wp = pack(w.reshape(co, -1).T, nr).reshape((-(-co // nr),) + w.shape[1:] + (nr,))
            packed = Value(g.fresh(n.inputs[1].name + ".packed"), TensorType("float32", wp.shape), const=wp)
            attrs = {**n.attrs, "co": co, "nr": nr, "kernel": tuple(w.shape[2:])}
            node = Node("PackedConv", [n.inputs[0], packed] + n.inputs[2:], n.outputs, attrs, n.name)
            for v in node.outputs:
                v.producer = node
            g.nodes[i] = node
            continue
        if n.op != "MatMul":
            continue
        a, b = n.inputs
        if b.const is None or len(b.shape) != 2 or b.dtype != "float32" or b.shape[1] < MIN_N or b.shape[0] < MIN_K:
            continue
        bp = pack(b.const, nr)
        packed = Value(g.fresh(b.name + ".packed"), TensorType("float32", bp.shape), const=bp)
        attrs = {"n": b.shape[1], "nr": nr, "strategy": strategy, "precision": n.attrs.get("precision", "fp32")}
        node = Node("PackedMatMul", [a, packed], n.outputs, attrs, n.name)
        for v in node.outputs:
            v.producer = node
        g.nodes[i] = node
    return g
