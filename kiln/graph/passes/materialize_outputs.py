"""Give every graph output its own kernel-written buffer: an output that is a graph input, a constant,
a view (Reshape) of another value, or listed twice gets an explicit copy."""
from __future__ import annotations

from kiln.graph.ir import Graph


def materialize_outputs(g: Graph) -> Graph:
    seen: set[int] = set()
    inputs = {id(v) for v in g.inputs}
    for i, v in enumerate(g.outputs):
        needs_copy = (id(v) in seen or id(v) in inputs or v.const is not None
                      or (v.producer is not None and v.producer.op == "Reshape"))
        if needs_copy:
            g.outputs[i] = g.add("Identity", [v], name=f"output_copy.{i}")[0]
        seen.add(id(g.outputs[i]))
    return g
