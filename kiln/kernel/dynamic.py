"""Symbolic dimensions in the kernel IR: max layouts and run-time extents (issue 15).

A graph with symbolic dims (`batch`, `seq`, `3*seq`; kiln/graph/symbolic.py) is compiled ONCE:

  * every tensor is stored at its *max layout* — each symbolic dim at its upper bound (`graph.bounds`) — so every
    stride is a compile-time constant and the vector code, register tiles and address arithmetic of the static
    path apply unchanged; the memory plan is sized once, from the bounds, with liveness reuse kept;
  * every loop over a symbolic dim runs to the dim's value at run time (`Sym`, read from the module's dims array
    that the Executable fills per call): the work and the memory touched scale with the actual size, and an edge
    is a partial tile (the schedules' masked / guarded edges), never a recompilation.

Lowering runs on `max_graph` (the graph at its upper bounds, so op lowerings need not know about symbols);
`runtime_extents` then gives each loop axis its run-time extent by where the axis indexes a symbolic dim: an axis
that indexes dim `seq` of a graph value runs to `seq`. An access that indexes a symbolic dim with anything but a
plain loop axis (a conv window, a concat offset, a negative Gather index) is refused with a ModelError naming the
op, node and dim — in the max layout such an access would read the wrong element, so it is never emitted."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kiln.errors import ModelError
from kiln.graph.ir import Graph, Node, TensorType, Value
from kiln.graph.symbolic import is_static, upper
from kiln.kernel.ir import Compute, Const, Expr, Load, Reduce, Sym, Var, substitute, walk
from kiln.kernel.lower import Lowered, axes_for

MAX_DIMS = 64  # symbolic dims per module: the size of the i64 array the kernels read them from (codegen/dims.py)
# Ops whose lowering uses a dim's VALUE (not only its extent) when the dim is reduced/indexed: refused on a
# symbolic axis (their attrs name the axes): op → attribute holding the axis/axes
_VALUE_OF_DIM = {"ArgReduce": "axis", "CumSum": "axis", "TopKIndex": "axis", "ReverseSequence": "axis"}


def _sympy():  # noqa: ANN202 - the module; imported only for symbolic graphs (static compiles never pay for it)
    import sympy
    return sympy


@dataclass
class DynamicDims:
    """The symbolic dims of one graph: their slots in the dims array, bounds, and every value's symbolic shape.

    `split`: a batch symbol every activation carries as its leading dim and no op mixes across (see `per_sample`).
    The model is then lowered for ONE sample (that dim is 1 in every layout, so every kernel keeps its static
    schedule — Winograd, packed layouts, AMX, microkernels) and kiln_main runs the kernels once per sample, on
    inputs and outputs offset by a sample's size (codegen/module.py); the arena holds one sample's activations."""
    bounds: dict[str, tuple[int, int]]
    shapes: dict[str, tuple[Any, ...]] = field(default_factory=dict)  # value name → symbolic shape (symbolic only)
    slots: dict[str, int] = field(default_factory=dict)
    split: str | None = None
    sampled: set[str] = field(default_factory=set)  # graph inputs/outputs with the split dim (offset per sample)

    @staticmethod
    def of(graph: Graph) -> DynamicDims | None:
        bounds = dict(getattr(graph, "bounds", None) or {})
        shapes = {v.name: v.shape for v in graph.values() if not all(is_static(d) for d in v.shape)}
        if not shapes:
            return None
        names = sorted({s.name for shp in shapes.values() for d in shp if not is_static(d) for s in d.free_symbols})
        missing = [s for s in names if s not in bounds]
        if missing:
            raise ModelError(f"symbolic dims {missing} have no bounds (graph.bounds)")
        if len(names) > MAX_DIMS:
            raise ModelError(f"{len(names)} symbolic dims; a module holds at most {MAX_DIMS}")
        dims = DynamicDims(bounds, shapes, {s: i for i, s in enumerate(names)})
        dims.split = per_sample(graph)
        if dims.split is not None:
            dims.sampled = {v.name for v in graph.inputs + graph.outputs
                            if v.shape and not is_static(v.shape[0]) and str(v.shape[0]) == dims.split}
            dims.shapes = {}  # one sample's shapes: the split dim is 1, what stays symbolic is the rest
            for name, shp in shapes.items():
                shp = tuple(_at_one(d, dims.split) for d in shp)
                if not all(is_static(d) for d in shp):
                    dims.shapes[name] = shp
        return dims

    def upper(self, d: Any) -> int:
        """The size of d in the max layout: its upper bound, with a split batch at 1 (one sample at a time)."""
        if self.split is not None:
            d = _at_one(d, self.split)
        return upper(d, self.bounds)

    def code(self, d: Any) -> int | str:
        """A dim for the executable's metadata: an int, or integer arithmetic over the symbols' names
        (kiln/runtime/shapes.py evaluates it without running it as code)."""
        return int(d) if is_static(d) else _code(self.expr(d))

    def meta(self, graph: Graph) -> dict[str, Any]:
        """What the Executable needs to bind, check and evaluate shapes at run time."""
        return {"symbols": sorted(self.slots, key=self.slots.get),
                "bounds": {s: list(self.bounds[s]) for s in self.slots}, "per_sample": self.split}

    def max_layout(self, v: Value) -> list[int]:
        """The whole max layout of a graph input/output of the lowered graph `v` (with all samples)."""
        shape = list(v.shape)
        if v.name in self.sampled:
            shape[0] = self.bounds[self.split][1]
        return shape

    def packed(self, v: Value) -> bool:
        """Can graph input/output `v` (of the lowered graph) be used where it lies, tightly packed, with no staging
        copy into its max layout? Yes when its live elements are a prefix of the max layout: only its first dim is
        symbolic — counting from dim 1 when it is split per sample (each sample is then a prefix of its own max
        layout, at a run-time offset: codegen/module.py)."""
        shape = self.shapes.get(v.name, v.shape)
        rest = shape[1:] if v.name in self.sampled else shape
        return all(is_static(d) for d in rest[1:]) and (not rest or is_static(rest[0])
                                                         or getattr(rest[0], "is_Symbol", False))

    def sample_step(self, v: Value) -> tuple[str | None, int]:
        """A sampled input/output's distance between samples: (symbol, bytes) = symbol's value × bytes when it is
        packed with a symbolic leading dim, else (None, bytes) — one sample of its max layout."""
        shape = self.shapes.get(v.name, v.shape)
        row = int(np.prod(v.shape[2:], dtype=np.int64)) * np.dtype(v.dtype).itemsize
        if self.packed(v) and len(shape) > 1 and not is_static(shape[1]):
            return str(shape[1]), row
        return None, v.type.nbytes

    def shape_of(self, v: Value) -> tuple[Any, ...]:
        return self.shapes.get(v.name, v.shape)

    def expr(self, d: Any) -> Expr:
        """A dim as a kernel expression over `Sym`s (int64)."""
        if is_static(d):
            return Const(int(d), "int64")
        sp = _sympy()
        if isinstance(d, sp.Integer):
            return Const(int(d), "int64")
        if isinstance(d, sp.Symbol):
            return Sym(d.name, self.slots[d.name], self.bounds[d.name][1], lo=self.bounds[d.name][0])
        if isinstance(d, sp.Add):
            out = self.expr(d.args[0])
            for a in d.args[1:]:
                out = out + self.expr(a)
            return out
        if isinstance(d, sp.Mul):
            num, den = sp.fraction(d)
            if den != 1:
                raise ModelError(f"dim {d} is not an integer expression")
            out = self.expr(num.args[0]) if isinstance(num, sp.Mul) else self.expr(num)
            for a in (num.args[1:] if isinstance(num, sp.Mul) else ()):
                out = out * self.expr(a)
            return out
        if isinstance(d, sp.floor):
            num, den = sp.fraction(sp.together(d.args[0]))
            return self.expr(sp.expand(num)) // self.expr(den)
        if isinstance(d, sp.Mod):
            return self.expr(d.args[0]) % self.expr(d.args[1])
        if isinstance(d, sp.Pow) and d.exp.is_Integer and int(d.exp) > 0:
            out = self.expr(d.base)
            for _ in range(int(d.exp) - 1):
                out = out * self.expr(d.base)
            return out
        if isinstance(d, (sp.Max, sp.Min)):
            from kiln.kernel.ir import maximum, minimum
            fn = maximum if isinstance(d, sp.Max) else minimum
            out = self.expr(d.args[0])
            for a in d.args[1:]:
                out = fn(out, self.expr(a))
            return out
        raise ModelError(f"dim {d} ({type(d).__name__}) has no kernel expression")


def _code(e: Expr) -> str:
    from kiln.kernel.ir import Bin
    if isinstance(e, Const):
        return str(int(e.value))
    if isinstance(e, Sym):
        return e.name
    if isinstance(e, Bin) and e.op in ("+", "-", "*", "//", "%"):
        return f"({_code(e.a)} {e.op} {_code(e.b)})"
    if isinstance(e, Bin) and e.op in ("max", "min"):
        return f"{e.op}({_code(e.a)}, {_code(e.b)})"
    raise ModelError(f"dim {e!r} has no integer code")


def _at_one(d: Any, name: str) -> Any:
    """d with the symbol `name` set to 1 (an int when nothing symbolic is left)."""
    if is_static(d):
        return d
    d = d.subs({s: 1 for s in d.free_symbols if s.name == name})
    return int(d) if getattr(d, "is_Integer", False) else d


# ops that mix elements along an axis attribute: on axis 0 of a batched value they would mix samples
_AXIS_ATTRS = ("axis", "axes")


def per_sample(graph: Graph) -> str | None:
    """The symbol the model can run one sample at a time over, or None. It must be the leading dim of every
    activation that has it (and appear nowhere else), every op reading a batched value must write batched values,
    and no op may work along axis 0 of a batched value (a Softmax or Concat over the batch)."""
    for name in _leading_symbols(graph):
        if _splits(graph, name) and (_row_share(graph, name) <= MAX_ROW_SHARE or _too_big_whole(graph)):
            return name
    return None


def _leading_symbols(graph: Graph) -> list[str]:
    """The symbols that are some graph input's leading dim (the batch candidates), sorted."""
    first = [v.shape[0] for v in graph.inputs if v.shape and not is_static(v.shape[0])]
    return sorted({d.name for d in first if getattr(d, "is_Symbol", False)})


# Unsplit, a model's activations are laid out at every symbol's upper bound at once: BERT's attention scores at
# batch 512 × seq 512 alone are 6 GiB. Where one activation would take more than this, split even a model of
# weight-sharing matrix products — the arena then holds one sample (dynamic_bounds= with a small batch bound
# keeps such a model whole, its weights read once per batch)
MAX_WHOLE_VALUE_BYTES = 1 << 30


def _too_big_whole(graph: Graph) -> bool:
    return _largest_value_bytes(graph, getattr(graph, "bounds", None) or {}) > MAX_WHOLE_VALUE_BYTES


def _largest_value_bytes(graph: Graph, bounds: dict[str, tuple[int, int]]) -> int:
    """The bytes of the largest activation with symbolic dims, laid out at `bounds`."""
    return max((int(np.prod([upper(d, bounds) for d in v.shape], dtype=np.float64)) * np.dtype(v.dtype).itemsize
                for v in graph.values() if v.const is None and not is_static(v.shape)), default=0)


# A model that `per_sample` would split only because, whole, it is too big at its upper bounds — a transformer, whose
# dense layers would then read their weights once per sample (bert_base_dynamic without bounds at batch 4 × 3 tokens:
# 32.9 ms, 9.5 in chunks; benchmarks/batch_chunks.py) — is laid out whole for a chunk of samples instead, the largest
# power of two whose biggest activation stays within this (bert_base at 512 tokens: 8 samples, 12.6 MB of attention
# scores each), and the executable runs a larger batch chunk by chunk (runtime/executable.py)
CHUNK_VALUE_BYTES = 128 << 20


@dataclass(frozen=True)
class BatchChunk:
    """Run the batch symbol `symbol` in chunks of at most `samples`; `bounds` are the symbol's declared ones."""
    symbol: str
    samples: int
    bounds: tuple[int, int]

    def meta(self) -> dict[str, Any]:
        return {"symbol": self.symbol, "samples": self.samples, "bounds": list(self.bounds)}


def batch_chunk(graph: Graph) -> BatchChunk | None:
    """The chunk of samples for a model that would otherwise run one sample at a time only for its size, or None:
    a batch symbol along which it splits (`_splits`), matrix products over its rows above MAX_ROW_SHARE of the work,
    too big whole, every output leading with the symbol (the chunks' outputs are concatenated), and at least two
    samples per chunk within CHUNK_VALUE_BYTES."""
    bounds = dict(getattr(graph, "bounds", None) or {})
    for name in _leading_symbols(graph):
        if not (_splits(graph, name) and _too_big_whole(graph) and _row_share(graph, name) > MAX_ROW_SHARE):
            continue
        if not all(v.shape and str(v.shape[0]) == name for v in graph.outputs):
            continue
        lo, hi = bounds[name]
        samples = 1
        while samples * 2 <= hi and \
                _largest_value_bytes(graph, {**bounds, name: (lo, samples * 2)}) <= CHUNK_VALUE_BYTES:
            samples *= 2
        if 2 <= samples < hi:
            return BatchChunk(name, samples, (lo, hi))
    return None


# A per-sample split turns every matrix product of constant weights whose rows are (or lead with) the samples
# ([batch, K] × [K, N]: an MLP, a classifier head; [batch, seq, K] × [K, N]: a transformer's dense layers) into one
# product per sample, reading the weights once per sample (BERT at batch 4 × seq 16: 1.7× the static build).
# Worth it for a CNN (its head is 0.1% of resnet50's work, its convs keep their static schedules), not for an MLP
# or a transformer: split only where such products are at most this share of the work.
MAX_ROW_SHARE = 0.25
_ANCHORS = ("MatMul", "PackedMatMul", "Conv", "PackedConv", "QMatMul", "QPackedMatMul", "QConv", "QPackedConv",
            "WinogradProduct", "ConvTranspose")


def _row_share(graph: Graph, name: str) -> float:
    """The share of the anchors' multiply-adds (per sample) in matrix products whose rows are the samples."""
    rows = total = 0.0
    for n in graph.nodes:
        if n.op not in _ANCHORS or not n.inputs or not n.outputs:
            continue
        out = float(np.prod([1 if not is_static(d) else int(d) for d in n.outputs[0].shape]))
        a = n.inputs[0]
        if "MatMul" in n.op:
            work = out * (int(a.shape[-1]) if is_static(a.shape[-1]) else 1)
            weights = n.op.startswith(("Packed", "QPacked")) or (len(n.inputs) > 1 and n.inputs[1].const is not None)
            if weights and len(a.shape) >= 2 and not is_static(a.shape[0]) and str(a.shape[0]) == name:
                rows += work  # (a [batch, seq, K] input too: per sample, its weights would stream once per sample)
        else:
            w = n.inputs[1].shape if len(n.inputs) > 1 else ()
            work = out * float(np.prod([int(d) for d in w[1:] if is_static(d)] or [1]))
        total += work
    return rows / total if total else 0.0


def _splits(graph: Graph, name: str) -> bool:
    def batched(v: Value) -> bool | None:  # True: leading dim is the symbol; False: no trace of it; None: elsewhere
        has = [i for i, d in enumerate(v.shape) if not is_static(d) and any(s.name == name for s in d.free_symbols)]
        if not has:
            return False
        return True if has == [0] and getattr(v.shape[0], "is_Symbol", False) else None

    for v in graph.inputs:
        if batched(v) is None:
            return False
    for n in graph.nodes:
        ins = [batched(v) for v in n.inputs if v.const is None]
        outs = [batched(v) for v in n.outputs]
        if None in ins or None in outs:
            return False
        if any(ins) and not all(outs):
            return False  # a batched value reduced to an unbatched one: mixes samples
        # an axis attribute names an axis of the first input (of every input for Concat): Gather(table, batched ids,
        # axis=0) looks rows up per sample, Gather(batched, ids, axis=0) would pick samples
        if (n.inputs and batched(n.inputs[0])) or (n.op == "Concat" and any(ins)):
            for attr in _AXIS_ATTRS:
                a = n.attrs.get(attr)
                if a == 0 or (isinstance(a, (list, tuple)) and 0 in a):
                    return False
            if n.op == "Transpose" and n.attrs.get("perm", (0,))[0] != 0:
                return False
    return True


# -- the graph at its upper bounds ----------------------------------------------------------------------------------
def _concrete(a: Any, dims: DynamicDims) -> Any:
    if isinstance(a, (list, tuple)):
        return type(a)(_concrete(x, dims) for x in a)
    if isinstance(a, (int, float, str, bool, np.ndarray, type(None))) or isinstance(a, Graph):
        return a
    return dims.upper(a) if hasattr(a, "free_symbols") else a


# attributes that may hold a symbolic dim: they only size the output (whose extents become run-time ones); any other
# attribute (a Slice's start, a Pad amount, a Range's start) is a position, which the max layout would get wrong
SIZE_ATTRS = {"Reshape": {"shape"}, "Expand": {"shape"}, "Slice": {"ends"}, "Range": {"limit"},
              "ConstantOfShape": {"shape"}, "Tile": {"repeats"}}


def _symbolic_attr(a: Any) -> bool:
    if isinstance(a, (list, tuple)):
        return any(_symbolic_attr(x) for x in a)
    return hasattr(a, "free_symbols") and not is_static(a)


def max_graph(graph: Graph, dims: DynamicDims) -> Graph:
    """A copy of `graph` with every symbolic dim (shapes and attributes) at its upper bound: what lowering sees."""
    for n in graph.nodes:
        for k, a in n.attrs.items():
            if _symbolic_attr(a) and k not in SIZE_ATTRS.get(n.op, ()):
                raise ModelError(f"{n.op} node '{n.name}': attribute {k}={a} holds a symbolic dim; Kiln compiles "
                                 f"symbolic dims in attributes that size an output ({', '.join(sorted(SIZE_ATTRS))}), "
                                 f"not in positions: pin the dim with input_shapes=")
    new_of: dict[int, Value] = {}

    def val(v: Value) -> Value:
        if id(v) not in new_of:
            shape = tuple(dims.upper(d) for d in v.shape)
            new_of[id(v)] = Value(v.name, TensorType(v.dtype, shape), v.const)
        return new_of[id(v)]

    g = Graph([val(v) for v in graph.inputs], [], name=graph.name, output_names=list(graph.output_names))
    for n in graph.nodes:
        node = Node(n.op, [val(v) for v in n.inputs], [], {k: _concrete(a, dims) for k, a in n.attrs.items()}, n.name)
        node.outputs = [val(v) for v in n.outputs]
        for v in node.outputs:
            v.producer = node
        g.nodes.append(node)
    g.outputs = [val(v) for v in graph.outputs]
    return g


# -- run-time extents ---------------------------------------------------------------------------------------------
def check_node(n: Node, dims: DynamicDims) -> None:
    """Refuse the ops whose lowering uses a symbolic dim's value (not its extent) on the axis it reduces."""
    attr = _VALUE_OF_DIM.get(n.op)
    if attr is None or not n.inputs:
        return
    shape = dims.shapes.get(n.inputs[0].name)
    if shape is None:
        return
    axes = n.attrs.get(attr)
    for ax in (axes if isinstance(axes, (list, tuple)) else (axes,)):
        if isinstance(ax, int) and not is_static(shape[ax]):
            raise _refuse(n, n.inputs[0].name, ax, shape[ax], f"{n.op} along it")


def _refuse(n: Node, buf: str, axis: int, d: Any, how: str) -> ModelError:
    return ModelError(f"{n.op} node '{n.name}': dim {axis} of %{buf} is symbolic ({d}) and the op uses it as "
                      f"{how}; Kiln compiles symbolic dims where ops map them one to one (elementwise ops, MatMul, "
                      f"reductions, Softmax, LayerNorm, Transpose, Gather of rows, the batch of Conv/Pool): pin it "
                      f"with input_shapes=")


def runtime_extents(n: Node, low: Lowered, dims: DynamicDims) -> Lowered:
    """Give each compute axis and reduction axis of a lowered node its run-time extent (see the module docstring)."""
    check_node(n, dims)
    if n.op == "Reduce" and n.attrs.get("kind") in ("mean",):
        shape = dims.shapes.get(n.inputs[0].name)
        if shape is not None and any(not is_static(shape[a]) for a in n.attrs["axes"]):
            a = next(a for a in n.attrs["axes"] if not is_static(shape[a]))
            raise _refuse(n, n.inputs[0].name, a, shape[a], "the count of a mean")
    # a temporary's dims (softmax's exp(x − max), a norm's statistics) are its writer's extents: a later compute that
    # reads only temporaries (softmax's Σ) learns its run-time extents from them
    temps: dict[str, tuple[Expr | None, ...]] = {}
    out = []
    for c in low.computes:
        c = _compute_extents(n, c, dims, temps)
        if c.out not in dims.shapes and c.store is None:
            temps[c.out] = tuple(None if isinstance(e, int) else e for e in c.extents)
        out.append(c)
    return Lowered(out, low.temps)


def _compute_extents(n: Node, c: Compute, dims: DynamicDims,
                     temps: dict[str, tuple[Expr | None, ...]] | None = None) -> Compute:
    found: dict[Var, set[Expr]] = {}

    def visit(buf: str, index: tuple[Expr, ...]) -> None:
        if buf in (temps or {}):
            for i, e in zip(index, temps[buf]):
                if e is not None and isinstance(i, Var):
                    found.setdefault(i, set()).add(e)
            return
        shape = dims.shapes.get(buf)
        if shape is None:
            return
        for j, (i, d) in enumerate(zip(index, shape)):
            if is_static(d):
                continue
            if isinstance(i, Var):
                found.setdefault(i, set()).add(dims.expr(d))
            elif isinstance(i, Const) and int(i.value) < min(dims.bounds[s.name][0] for s in d.free_symbols):
                continue  # a fixed position every size has (x[:, 0], the CLS token)
            else:
                raise _refuse(n, buf, j, d, f"the index {i!r}")

    visit(c.out, c.store_index)
    for e in walk(c.body):
        if isinstance(e, Load):
            visit(e.buf, e.index)
    for s in c.store or ():
        for e in walk(s):
            if isinstance(e, Load):
                visit(e.buf, e.index)

    def extent_of(v: Var, n_max: int) -> int | Expr:
        exprs = found.get(v)
        if not exprs:
            return n_max
        if len(exprs) > 1:
            raise ModelError(f"{n.op} node '{n.name}': loop axis {v.name} runs over symbolic dims "
                             f"{sorted(map(repr, exprs))} that the graph does not prove equal")
        return next(iter(exprs))

    extents = tuple(extent_of(v, e) for v, e in zip(c.axes, c.extents))
    swap: dict[Expr, Expr] = {}
    for r in (x for x in walk(c.body) if isinstance(x, Reduce)):
        axes = tuple((v, extent_of(v, e)) for v, e in r.axes)
        if axes != r.axes:
            swap[r] = Reduce(r.op, axes, r.body)
    body = substitute(c.body, swap) if swap else c.body
    return Compute(c.out, c.axes, extents, body, c.store, c.hints)


# -- Reshape in the max layout ---------------------------------------------------------------------------------------
def reshape_is_view(src: tuple[Any, ...], dst: tuple[Any, ...]) -> bool:
    """Is Reshape src → dst the same storage in the max layouts? Yes when, size-1 dims aside, every symbolic dim maps
    one to one and the static dims between them group into runs of equal product ([b, s, 768] → [b, s, 12, 64]);
    a reshape that merges or splits a symbolic dim ([b, s, 768] → [b·s, 768]) moves elements: a copy."""
    s, t = [d for d in src if d != 1], [d for d in dst if d != 1]
    i = j = 0
    while i < len(s) and j < len(t):
        if not (is_static(s[i]) and is_static(t[j])):
            if is_static(s[i]) or is_static(t[j]) or _sympy().simplify(s[i] - t[j]) != 0:
                return False
            i, j = i + 1, j + 1
            continue
        pa, pb = int(s[i]), int(t[j])
        i, j = i + 1, j + 1
        while pa != pb:
            side = s if pa < pb else t
            k = i if pa < pb else j
            if k >= len(side) or not is_static(side[k]):
                return False
            if pa < pb:
                pa, i = pa * int(s[i]), i + 1
            else:
                pb, j = pb * int(t[j]), j + 1
    return i == len(s) and j == len(t)


def reshape_copy(n: Node, dims: DynamicDims) -> Lowered:
    """A Reshape that is not a view in the max layouts: copy element by element through the run-time row-major
    index (flat = Σ index·live stride over dst, then unflattened over src's live dims)."""
    x, y = n.inputs[0], n.outputs[0]
    src = dims.shapes.get(x.name, x.shape)
    dst = dims.shapes.get(y.name, y.shape)
    ax = axes_for(y.shape)
    flat: Expr = Const(0, "int64")
    for v, d in zip(ax, dst):
        flat = flat * dims.expr(d) + v
    index: list[Expr] = []
    rest = flat
    for d in reversed(src):
        e = dims.expr(d)
        index.append(rest % e)
        rest = rest // e
    extents = tuple(dims.expr(d) if not is_static(d) else int(d) for d in dst)
    return Lowered([Compute(y.name, ax, extents, Load(x.name, tuple(reversed(index)), x.dtype))])
