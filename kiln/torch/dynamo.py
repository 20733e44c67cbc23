"""The "kiln" backend of torch.compile (registered through the `torch_dynamo_backends` entry point, so
`torch.compile(model, backend="kiln")` works without importing kiln first). Inference only.

For each graph dynamo captures:
 1. the arguments that are parameters or buffers (dynamo marks them static) are frozen as constants;
 2. AOTAutograd traces it for the concrete input shapes into a functional Core ATen graph (kiln/torch/trace.py);
 3. the nodes Kiln can import are partitioned into subgraphs, the rest stay eager ATen calls, named in one log
    line (kiln/torch/partition.py); with `fullgraph=True` a node that would fall back is an error naming it and
    its source line;
 4. each subgraph is imported into Kiln's graph IR and compiled by `kiln.compile` (its compile cache included),
    and runs on the tensors' memory (kiln/torch/call.py).
Shapes: a graph dynamo traced with dynamic sizes (`dynamic=True`, or sizes it saw change) is traced by AOTAutograd
on dynamo's symbolic shapes and compiled ONCE, torch's shape symbols becoming Kiln's symbolic dims (kernel/dynamic.py:
tensors laid out at their upper bounds — torch's range, capped by the option `dynamic_max`, default 512); a call
whose sizes are beyond those bounds, or a graph Kiln cannot compile with symbolic dims (the log line says which op
and why), meets each new input signature with steps 2–4 instead — through Kiln's compile cache — and `stats()`
counts every specialization. Frozen parameters are
checked on every call (same tensor, same version): weights changed in place or replaced re-freeze the graph
instead of running stale constants. Options come through `torch.compile(..., options={...})`: `threads`
(or num_threads), `strategy`, `strategies`, `target`, any `kiln.compile` keyword (e.g. `tuning`, `precision`,
or a pass switch such as `fold_batchnorm=False`); kiln.compile validates them."""
from __future__ import annotations

import itertools
import logging
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import torch

from kiln.errors import KilnError
from kiln.frontend.torch import AtenProgram
from kiln.frontend.torch.importer import TorchSymbols
from kiln.graph.symbolic import DEFAULT_BOUND
from kiln.torch.call import COPIES, KilnCall
from kiln.torch.partition import partition
from kiln.torch.trace import aot_core_aten

log = logging.getLogger("kiln.torch")
_graph_ids = itertools.count()
_STATS: Counter[str] = Counter()


def stats() -> dict[str, Any]:
    """What the backend did in this process: graphs captured, specializations (one per graph and input signature),
    Kiln compilations and compile-cache hits, ops left to eager PyTorch, inputs that had to be copied."""
    return {**_STATS, "input_copies": COPIES["inputs"]}


def reset_stats() -> None:
    _STATS.clear()
    COPIES["inputs"] = 0


def compile_options(options: dict[str, Any] | None) -> dict[str, Any]:
    """torch.compile's `options` as kiln.compile keywords (`threads` is kiln.compile's num_threads)."""
    opts = dict(options or {})
    if "threads" in opts:
        opts["num_threads"] = opts.pop("threads")
    return opts


def _fullgraph() -> bool:
    """Whether dynamo is compiling with fullgraph=True (its current frame's one_graph flag)."""
    try:
        from torch._dynamo.symbolic_convert import InstructionTranslator

        return bool(InstructionTranslator.current_tx().one_graph)
    except Exception:  # noqa: BLE001  (not inside dynamo, or its internals moved)
        return False


def _frozen(args: list[Any]) -> set[int]:
    """The arguments dynamo lifted from modules (parameters and buffers): it marks them static."""
    from torch._dynamo.utils import get_static_address_type

    return {i for i, a in enumerate(args) if isinstance(a, torch.Tensor) and
            (isinstance(a, torch.nn.Parameter) or get_static_address_type(a) is not None)}


def _inline_scalars(gm: torch.fx.GraphModule, args: list[Any] | tuple[Any, ...]) -> tuple[torch.fx.GraphModule,
                                                                                          dict[int, Any]]:
    """A copy of `gm` in which each 0-d tensor argument read only through `.item()` — a Python scalar dynamo did
    not specialize (under dynamic=True: a LayerNorm's eps, a BatchNorm's momentum) — is its value in `args`: a
    value on the host is data a trace on fake tensors cannot read. The call's values are checked on every call
    (`_Variant.stale`): a new value specializes again."""
    graph = torch.fx.Graph()
    graph.output(graph.graph_copy(gm.graph, {}))
    values: dict[int, Any] = {}
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    for i, (node, a) in enumerate(zip(placeholders, args)):
        items = list(node.users)
        if not (isinstance(a, torch.Tensor) and a.dim() == 0 and items and
                all(u.op == "call_method" and u.target == "item" for u in items)):
            continue
        values[i] = value = a.item()
        for item in items:
            for user in list(item.users):
                user.args = torch.fx.node.map_arg(user.args, lambda x, it=item, v=value: v if x is it else x)
                user.kwargs = torch.fx.node.map_arg(user.kwargs, lambda x, it=item, v=value: v if x is it else x)
            graph.erase_node(item)
    return (torch.fx.GraphModule(gm, graph) if values else gm), values


def _hint(a: Any) -> Any:
    """A SymInt argument's concrete value, read without adding a guard."""
    if isinstance(a, torch.SymInt):
        return a.node.hint
    return a


@dataclass
class _Variant:
    """The graph compiled for one input signature."""
    gm: torch.fx.GraphModule
    runtime: list[int]
    mutations: list[int]
    frozen: list[tuple[int, torch.Tensor, int]] = field(default_factory=list)
    scalars: dict[int, float | int | bool] = field(default_factory=dict)  # inlined by value (see _inline_scalars)

    def stale(self, args: tuple[Any, ...]) -> bool:
        return any(args[i] is not t or t._version != v for i, t, v in self.frozen) or \
            any(args[i].item() != v for i, v in self.scalars.items())

    def __call__(self, args: tuple[Any, ...]) -> tuple[Any, ...]:
        outs = self.gm(*[args[i] for i in self.runtime])
        outs = tuple(outs) if isinstance(outs, (tuple, list)) else (outs,)
        n = len(self.mutations)
        for out, i in zip(outs[:n], self.mutations):  # in-place ops on inputs: write the new values back
            args[i].copy_(out)
        return outs[n:]


class KilnGraph:
    """One dynamo graph, frozen, partitioned and compiled per input signature."""

    def __init__(self, gm: torch.fx.GraphModule, example_inputs: list[Any], options: dict[str, Any]) -> None:
        options = dict(options)
        self.symbols = TorchSymbols.of(gm, int(options.pop("dynamic_max", DEFAULT_BOUND)))
        self.gm, self.options = gm, options
        self.id = next(_graph_ids)
        self.fullgraph = _fullgraph()
        self.frozen = _frozen(example_inputs)
        self.variants: dict[tuple, _Variant] = {}
        self.symbolic: _Variant | None = None  # compiled once for every size within the symbols' bounds
        # Kiln symbol → (argument, axis) holding its value in a call (axis None: the argument is the size itself)
        self.sources: dict[str, tuple[int, int | None]] = {}
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        for i, node in enumerate(placeholders):
            val = node.meta.get("example_value")
            dims = enumerate(val.shape) if isinstance(val, torch.Tensor) else [(None, val)]
            for axis, d in dims:
                if isinstance(d, torch.SymInt) and d.node.expr.is_Symbol:
                    self.sources.setdefault(self.symbols.names[str(d.node.expr)], (i, axis))
        _STATS["graphs"] += 1
        if self.symbols.names:
            try:
                self.symbolic = self._specialize(example_inputs, symbolic=True)
            except Exception as e:  # noqa: BLE001  (tracing on dynamo's fake tensors raises torch's own errors too)
                if self.fullgraph and isinstance(e, KilnError):
                    raise
                log.warning("kiln: graph %d: not compiled with symbolic dims (%s: %s); compiling per input shape "
                            "instead", self.id, type(e).__name__, str(e).splitlines()[0] if str(e) else "")
        if self.symbolic is None:
            args = [_hint(a) for a in example_inputs]
            self.variants[self._key(args)] = self._specialize(args)

    def _sizes(self, args: tuple[Any, ...] | list[Any]) -> dict[str, int]:
        """The value of each Kiln symbol in this call, read from the arguments dynamo passes (the tensors' sizes
        and the SymInts it passes as ints) where `self.sources` found them."""
        return {name: int(args[i] if axis is None else args[i].shape[axis]) for name, (i, axis) in self.sources.items()}

    def _fits(self, args: tuple[Any, ...]) -> bool:
        sizes = self._sizes(args)
        return all(lo <= sizes.get(name, lo) <= hi for name, (lo, hi) in self.symbols.bounds.items())

    def _key(self, args: list[Any] | tuple[Any, ...]) -> tuple:
        return tuple((tuple(a.shape), a.dtype) if isinstance(a, torch.Tensor) else a
                     for i, a in enumerate(args) if i not in self.frozen)

    def _specialize(self, args: list[Any] | tuple[Any, ...], symbolic: bool = False) -> _Variant:
        import kiln

        t0 = time.perf_counter()
        gm, scalars = _inline_scalars(self.gm, args)
        traced = aot_core_aten(gm, list(args), self.frozen, symbolic)
        symbols = self.symbols if symbolic else None
        part = partition(traced.gm, symbols)
        if part.fallbacks and self.fullgraph:
            f = part.fallbacks[0]
            raise kiln.UnsupportedOperator(f.op, f.node, None, "fullgraph=True, so no op may fall back to eager "
                                           f"PyTorch, and Kiln cannot compile this one: {f.reason}")
        for name in part.kiln:
            sub = getattr(part.gm, name)
            out = next(n for n in sub.graph.nodes if n.op == "output").args[0]
            exe = kiln.compile(AtenProgram(sub, name=f"torch.g{self.id}.{name}", symbols=symbols), **self.options)
            _STATS["cache_hits" if exe.cached else "compiles"] += 1
            setattr(part.gm, name, KilnCall(exe, tuple_out=isinstance(out, (tuple, list))))
        part.gm.recompile()
        if part.fallbacks:
            log.warning("kiln: graph %d: %s", self.id, part.summary())
            _STATS["fallback_ops"] += len(part.fallbacks)
        _STATS["specializations"] += 1
        if symbolic:
            _STATS["symbolic"] += 1
            log.info("kiln: graph %d compiled once for symbolic sizes %s", self.id, self.symbols.bounds)
        elif self.variants or self.symbolic is not None:
            log.warning("kiln: graph %d specialized for new input shapes %s (%d signatures so far: one compile each, "
                        "through Kiln's compile cache%s)", self.id,
                        [list(a.shape) for i, a in enumerate(args) if isinstance(a, torch.Tensor) and a.dim()
                         and i not in self.frozen], len(self.variants) + 1,
                        f"; sizes {self._sizes(args)} are beyond the symbolic bounds {self.symbols.bounds}"
                        if self.symbolic is not None else "")
        variant = _Variant(part.gm, traced.runtime, traced.mutations,
                           [(i, args[i], args[i]._version) for i in sorted(self.frozen) if i not in traced.runtime],
                           scalars)
        log.info("kiln: graph %d compiled in %.2f s (%d Kiln partition(s))", self.id, time.perf_counter() - t0,
                 len(part.kiln))
        return variant

    def __call__(self, *args: Any) -> tuple[Any, ...]:
        if self.symbolic is not None and self._fits(args):
            if self.symbolic.stale(args):
                log.warning("kiln: graph %d: parameters or inlined scalars changed since they were frozen; "
                            "re-freezing", self.id)
                _STATS["refreezes"] += 1
                self.symbolic = self._specialize(args, symbolic=True)
            return self.symbolic(args)
        key = self._key(args)
        variant = self.variants.get(key)
        if variant is None or variant.stale(args):
            if variant is not None:
                log.warning("kiln: graph %d: parameters changed since they were frozen; re-freezing", self.id)
                _STATS["refreezes"] += 1
            variant = self.variants[key] = self._specialize(args)
        return variant(args)


def backend(gm: torch.fx.GraphModule, example_inputs: list[Any], options: dict[str, Any] | None = None,
            **kwargs: Any) -> Any:
    """torch.compile(model, backend="kiln", options={...}). A graph without ops runs as it is."""
    if kwargs.get("mode") not in (None, "default"):
        log.warning("kiln: torch.compile mode=%r is ignored (pass Kiln options through options={...})", kwargs["mode"])
    if not any(n.op in ("call_function", "call_method", "call_module") for n in gm.graph.nodes):
        return gm.forward
    return KilnGraph(gm, example_inputs, compile_options(options))
