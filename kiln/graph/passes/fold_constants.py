"""Replace every node whose inputs are all constants by its value (NumPy evaluation; on constants holding
symbolic dims — shape arithmetic — the symbolic evaluation of kiln/graph/shape_eval.py). A node whose output
shape is symbolic (Expand of a constant to [seq, 256], a constant mask sliced to [seq, seq]) stays: its value
depends on the run's sizes."""
from __future__ import annotations

import numpy as np

from kiln.graph import symbolic
from kiln.graph.ir import Graph
from kiln.graph.ops import evaluate
from kiln.graph.shape_eval import concrete, evaluate_symbolic

MAX_FOLD_BYTES = 256 << 20  # never materialize absurd constants (Expand to a huge shape)


def fold_constants(g: Graph) -> Graph:
    kept = []
    for n in g.nodes:
        if n.inputs and all(v.const is not None for v in n.inputs) and all(v.type.is_static for v in n.outputs) \
                and sum(v.type.nbytes for v in n.outputs) <= MAX_FOLD_BYTES:
            if any(symbolic.is_symbolic_array(v.const) for v in n.inputs):
                try:
                    vals = evaluate_symbolic(n.op, [v.const for v in n.inputs], n.attrs)
                except (TypeError, ValueError):
                    vals = None  # not shape arithmetic: the node stays (and its reader is reported by the frontend)
                if vals is not None:
                    for out, val in zip(n.outputs, vals):
                        out.const = concrete(np.asarray(val, dtype=val.dtype).reshape(out.shape), out.dtype)
                        out.producer = None
                    continue
            else:
                vals = evaluate(n.op, [v.const for v in n.inputs], n.attrs)
                if vals is not None:
                    for out, val in zip(n.outputs, vals):
                        out.const = np.asarray(np.asarray(val).astype(out.dtype).reshape(out.shape), order="C")
                        out.producer = None
                    continue
        kept.append(n)
    g.nodes = kept
    return g
