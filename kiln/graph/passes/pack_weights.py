"""Pack constant MatMul weights into column panels at compile time ("data tiling").

    MatMul(A[.., M, K], B[K, N] const)  ⇒  PackedMatMul(A, Bp[⌈N/NR⌉, K, NR])   (last panel zero-padded)

Each NR-wide panel of B is then one contiguous stream of K·NR floats: the register tile reads it with
unit stride instead of jumping N floats per k (page-sized strides that defeat the prefetcher and the
TLB on large N). NR is the register tile's width, from the target's vector width."""
from __future__ import annotations

import numpy as np

from kiln.graph.ir import Graph, Node, TensorType, Value
from kiln.graph.ops import OPS, OpDef, broadcast
from kiln.target import Target

MIN_N = 32   # narrower B: nothing to gain
MIN_K = 16


def _packed_shape(ts: list[TensorType], a: dict) -> list[TensorType]:
    x, bp = ts[0].shape, ts[1].shape
    if x[-1] != bp[1]:
        raise ValueError(f"PackedMatMul: K of {x} differs from panels {bp}")
    return [TensorType(ts[0].dtype, broadcast(x[:-2], ()) + (x[-2], a["n"]))]


def unpack(bp: np.ndarray, n: int) -> np.ndarray:
    return bp.transpose(1, 0, 2).reshape(bp.shape[1], -1)[:, :n]


OPS["PackedMatMul"] = OpDef(_packed_shape, lambda xs, a: [np.matmul(xs[0], unpack(xs[1], a["n"]))], "anchor")


def pack(b: np.ndarray, nr: int) -> np.ndarray:
    k, n = b.shape
    panels = -(-n // nr)
    padded = np.zeros((k, panels * nr), dtype=b.dtype)
    padded[:, :n] = b
    return np.ascontiguousarray(padded.reshape(k, panels, nr).transpose(1, 0, 2))


def pack_weights(g: Graph, target: Target) -> Graph:
    nr = 2 * target.lanes(32)
    for i, n in enumerate(g.nodes):
        if n.op != "MatMul":
            continue
        a, b = n.inputs
        if b.const is None or len(b.shape) != 2 or b.dtype != "float32" or b.shape[1] < MIN_N or b.shape[0] < MIN_K:
            continue
        bp = pack(b.const, nr)
        packed = Value(g.fresh(b.name + ".packed"), TensorType("float32", bp.shape), const=bp)
        node = Node("PackedMatMul", [a, packed], n.outputs, {"n": b.shape[1], "nr": nr}, n.name)
        for v in node.outputs:
            v.producer = node
        g.nodes[i] = node
    return g
