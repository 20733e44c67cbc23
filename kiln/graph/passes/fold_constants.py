"""Replace every node whose inputs are all constants by its value (NumPy evaluation)."""
from __future__ import annotations

import numpy as np

from kiln.graph.ir import Graph
from kiln.graph.ops import evaluate

MAX_FOLD_BYTES = 256 << 20  # never materialize absurd constants (Expand to a huge shape)


def fold_constants(g: Graph) -> Graph:
    kept = []
    for n in g.nodes:
        if n.inputs and all(v.const is not None for v in n.inputs) and \
                sum(v.type.nbytes for v in n.outputs) <= MAX_FOLD_BYTES:
            vals = evaluate(n.op, [v.const for v in n.inputs], n.attrs)
            if vals is not None:
                for out, val in zip(n.outputs, vals):
                    out.const = np.asarray(np.asarray(val).astype(out.dtype).reshape(out.shape), order="C")
                    out.producer = None
                continue
        kept.append(n)
    g.nodes = kept
    return g
