"""How each anchor operator (MatMul, Conv) is built — the research question behind Kiln:

  * ``direct``  — the compiler emits the whole loop nest, register tile included (kiln/schedule/tile.py);
  * ``ukernel`` — the compiler packs, tiles and parallelizes, and the inner MR×NR tile is a hand-written
    microkernel (kiln/ukernels, kiln/schedule/ukernel.py);
  * ``library`` — the whole operator is one call into a vendor library (``library:openblas``,
    ``library:mkl``, ``library:onednn``, ``library:blis``; plain ``library`` = the first one installed), the epilogue a
    separate kernel after it (kiln/library, kiln/schedule/library.py);
  * ``auto``    — per operator the fastest of the above, measured on the target at compile time.

Everything else (graph passes, fusion decisions, threads) is the same for all strategies, so the comparison
is fair. The choice is stored on each anchor node as ``attrs["strategy"]`` (visible in `kiln explain`)."""
from __future__ import annotations

from collections.abc import Mapping

from kiln.graph.ir import Graph

STRATEGIES: tuple[str, ...] = ("direct", "ukernel", "library", "auto")
LIBRARIES: tuple[str, ...] = ("mkl", "openblas", "onednn", "blis")  # `library` alone picks the first available
ANCHOR_OPS: tuple[str, ...] = ("MatMul", "Conv")


def check_strategy(s: str) -> str:
    """Validate a strategy name: one of STRATEGIES or `library:<name>` with <name> in LIBRARIES."""
    if not isinstance(s, str):
        raise TypeError(f"strategy must be a string, got {type(s).__name__}")
    if s in STRATEGIES:
        return s
    kind, _, lib = s.partition(":")
    if kind == "library" and lib in LIBRARIES:
        return s
    raise ValueError(f"unknown strategy {s!r}; known: {', '.join(STRATEGIES)}, "
                     + ", ".join(f"library:{x}" for x in LIBRARIES))


def assign_strategies(g: Graph, strategy: str = "direct", overrides: Mapping[str, str] | None = None) -> Graph:
    """Set attrs["strategy"] on every anchor node: an override by node name wins over one by op type, which
    wins over the model-wide `strategy`. An override that names no anchor node or op is an error (a typo would
    otherwise silently compare the wrong thing)."""
    check_strategy(strategy)
    overrides = {k: check_strategy(v) for k, v in (overrides or {}).items()}
    anchors = [n for n in g.nodes if n.op in ANCHOR_OPS]
    known = {n.name for n in anchors} | set(ANCHOR_OPS)
    unknown = sorted(set(overrides) - known)
    if unknown:
        names = ", ".join(sorted(n.name for n in anchors)[:12]) or "none"
        raise ValueError(f"strategies= names {unknown}, which match no anchor node or op type; the anchors are "
                         f"op types {', '.join(ANCHOR_OPS)} and nodes {names}")
    for n in anchors:
        n.attrs["strategy"] = overrides.get(n.name, overrides.get(n.op, strategy))
    return g


def strategy_of(attrs: Mapping[str, object]) -> str:
    return str(attrs.get("strategy", "direct"))
