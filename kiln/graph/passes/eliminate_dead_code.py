"""Drop nodes whose outputs nothing reads (after folding, shape sub-graphs are dead)."""
from __future__ import annotations

from kiln.graph.ir import Graph


def eliminate_dead_code(g: Graph) -> Graph:
    live = {id(v) for v in g.outputs}
    kept = []
    for n in reversed(g.nodes):
        if any(id(v) in live for v in n.outputs):
            kept.append(n)
            live.update(id(v) for v in n.inputs)
    g.nodes = kept[::-1]
    return g
