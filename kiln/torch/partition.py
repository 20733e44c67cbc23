"""Capability-based partitioning: the nodes Kiln can import are grouped into subgraphs (torch's
CapabilityBasedPartitioner) that Kiln compiles; the rest stay ATen calls that eager PyTorch runs.

What Kiln can take is decided by the importer itself (`kiln.frontend.torch.unsupported_reason`: the node imported
on its own), so the partitioner and the frontend never disagree. A partition with nothing to compute (views,
getitem) stays eager: compiling it would only add a call."""
from __future__ import annotations

import collections
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
from torch.fx.passes.operator_support import OperatorSupportBase

from kiln.frontend.torch import unsupported_reason
from kiln.frontend.torch.importer import TorchSymbols, is_size_node, op_key, source_line

# ops that only reinterpret or route data: a partition of nothing but these is not worth a Kiln call
_FREE = {"view.default", "_unsafe_view.default", "permute.default", "unsqueeze.default", "squeeze.dims",
         "squeeze.dim", "expand.default", "slice.Tensor", "select.int", "alias.default", "clone.default",
         "t.default", "detach.default", "getitem"}


@dataclass
class Fallback:
    """One node left to eager PyTorch, and why."""
    op: str
    node: str
    reason: str
    where: str


@dataclass
class Partitioned:
    gm: torch.fx.GraphModule
    kiln: list[str] = field(default_factory=list)        # names of the submodules Kiln compiles
    fallbacks: list[Fallback] = field(default_factory=list)
    ops: int = 0                                         # call_function nodes in the whole graph

    def summary(self) -> str:
        """One line: how many ops fell back to eager PyTorch, which, why, where."""
        by_op: dict[tuple[str, str], list[Fallback]] = collections.defaultdict(list)
        for f in self.fallbacks:
            by_op[(f.op, f.reason.split(" [at ")[0])].append(f)
        parts = []
        for (op, why), fs in by_op.items():
            where = f" at {fs[0].where}" if fs[0].where else ""
            parts.append(f"{op} ×{len(fs)} ({why}){where}")
        return (f"{len(self.fallbacks)} of {self.ops} ops left to eager PyTorch, {len(self.kiln)} Kiln "
                f"partition(s): " + "; ".join(parts))


class _KilnSupport(OperatorSupportBase):
    def __init__(self, gm: torch.fx.GraphModule, symbols: TorchSymbols | None) -> None:
        super().__init__()
        self.gm, self.symbols = gm, symbols
        self.reasons: dict[torch.fx.Node, str] = {}

    def is_node_supported(self, submodules: Any, node: torch.fx.Node) -> bool:
        # sizes computed from shape symbols stay Python ints on the host (a partition reads them as its inputs)
        if node.op != "call_function" or is_size_node(node):
            return False
        why = unsupported_reason(node, self.gm, self.symbols)
        if why is not None:
            self.reasons[node] = why
        return why is None


def _short_reason(why: str) -> str:
    # "unsupported operator aten.cumprod.default (node 'cumprod'): no Kiln importer ..." → the detail
    return why.split("): ", 1)[1] if "): " in why else why


def partition(gm: torch.fx.GraphModule, symbols: TorchSymbols | None = None) -> Partitioned:
    """Fuse the Kiln-supported nodes of `gm` into submodules fused_0, fused_1, ... (call_module nodes). `symbols`:
    torch's shape symbols, for a graph traced with dynamic shapes."""
    ops = sum(1 for n in gm.graph.nodes if n.op == "call_function" and not is_size_node(n))
    support = _KilnSupport(gm, symbols)
    partitioner = CapabilityBasedPartitioner(gm, support, allows_single_node_partition=True)
    proposed = partitioner.propose_partitions()
    worth = [p for p in proposed if any(op_key(n.target) not in _FREE for n in p.nodes if n.op == "call_function")]
    fused = partitioner.fuse_partitions(worth) if worth else gm
    _constants_inside(fused)
    out = Partitioned(fused, ops=ops)
    out.kiln = [n.target for n in fused.graph.nodes if n.op == "call_module" and n.target.startswith("fused_")]
    for node, why in support.reasons.items():
        out.fallbacks.append(Fallback(f"aten.{op_key(node.target)}", node.name, _short_reason(why), source_line(node)))
    return out


def _constants_inside(gm: torch.fx.GraphModule) -> None:
    """The partitioner passes the constants a partition reads (frozen weights: get_attr nodes) in as arguments;
    move them inside, so Kiln sees constants it can fold, pack and lay out, not run-time inputs."""
    for node in gm.graph.nodes:
        if node.op != "call_module" or not node.target.startswith("fused_"):
            continue
        sub = getattr(gm, node.target)
        placeholders = [n for n in sub.graph.nodes if n.op == "placeholder"]
        kept = []
        for i, (ph, arg) in enumerate(zip(placeholders, node.args)):
            if not (isinstance(arg, torch.fx.Node) and arg.op == "get_attr"):
                kept.append(arg)
                continue
            name = f"_kiln_const_{i}"
            sub.register_buffer(name, getattr(gm, arg.target), persistent=False)
            with sub.graph.inserting_before(ph):
                const = sub.graph.get_attr(name)
            const.meta = dict(arg.meta) or dict(ph.meta)
            ph.replace_all_uses_with(const)
            sub.graph.erase_node(ph)
        node.args = tuple(kept)
        sub.recompile()
    gm.graph.eliminate_dead_code()
    gm.recompile()
