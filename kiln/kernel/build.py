"""Graph → kernels: lower every node to compute definitions, fuse them into kernels, bind buffers.

Fusion here is *inlining*: a producer's expression is substituted into its consumer's loads when
  * the producer has one consumer, is not a graph output, and writes its whole output in one compute;
  * and either it is cheap elementwise/data movement (no reduction) and the consumer is not an anchor
    (MatMul/Conv/Pool keep plain loads — except a plain MatMul reading a pure data movement that stays unit-stride
    along its vectors: attention's head split), or the consumer reads it only at its own index
    (an epilogue: bias, BatchNorm, activation, residual add applied on the anchor's accumulator).
Reshape-like ops are views: no kernel, the consumer reads the same storage with its own shape."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

import kiln.kernel.lower_indexing  # noqa: F401  (registers the indexing ops' lowerings)
import kiln.kernel.lower_packed  # noqa: F401  (registers the PackedMatMul / PackedConv lowerings)
import kiln.kernel.lower_quant  # noqa: F401  (registers the quantized ops' lowerings)
import kiln.kernel.lower_winograd  # noqa: F401  (registers the Winograd stages' lowerings)
from kiln.errors import UnsupportedOperator
from kiln.graph.ir import Graph, Node, Value
from kiln.graph.ops import OPS
from kiln.kernel.analysis import coef, flat_index
from kiln.kernel.dynamic import DynamicDims, max_graph, reshape_copy, reshape_is_view, runtime_extents
from kiln.kernel.ir import (
    Buffer,
    Compute,
    Const,
    Expr,
    Kernel,
    Load,
    Reduce,
    children,
    is_float,
    rewrite,
    substitute,
    walk,
)
from kiln.kernel.lower import Lowered, axes_for, lower_node
from kiln.kernel.simplify import drop_satisfied_clamps

VIEW_OPS = {"Reshape"}
KERNEL_DTYPES = {"float32", "float64", "int64", "int32", "int16", "int8", "uint8", "bool", "bfloat16"}
MAX_DUPLICATED_NODES = 48  # expression nodes an inlined producer may be copied into its consumer


@dataclass
class Group:
    computes: list[Compute]
    temps: list[Buffer]
    nodes: list[Node]
    output: Value          # the value this group materializes

    @property
    def anchor(self) -> Node:
        kinds = [n for n in self.nodes if OPS[n.op].kind in ("anchor", "norm", "reduce")]
        return kinds[0] if kinds else self.nodes[-1]


@dataclass
class Program:
    """Kernels in execution order, each with the graph buffers bound to its arguments."""
    graph: Graph
    kernels: list[Kernel] = field(default_factory=list)
    bindings: list[list[str]] = field(default_factory=list)   # per kernel: buffer names (values or temps)
    buffers: dict[str, Buffer] = field(default_factory=dict)    # every bound buffer by name
    view_of: dict[str, str] = field(default_factory=dict)       # view value → the value that owns storage
    consts: dict[str, object] = field(default_factory=dict)     # constant value name → numpy array
    groups: list[Group] = field(default_factory=list)
    dims: DynamicDims | None = None  # the symbolic dims (kernel/dynamic.py); None for a static model


def root(view_of: dict[str, str], name: str) -> str:
    while name in view_of:
        name = view_of[name]
    return name


def _replace_loads(e: Expr, buf: str, fn) -> Expr:  # noqa: ANN001
    """Rebuild `e` with every Load of `buf` replaced by fn(load)."""
    return rewrite(e, lambda x, y: fn(y) if isinstance(x, Load) and x.buf == buf else y)


def rename_loads(e: Expr, canon: dict[str, str], memo: dict[Expr, Expr] | None = None) -> Expr:
    """`e` with every Load's buffer renamed through `canon` (which must name each); `memo` may be shared by calls
    over expressions with common parts (a Winograd transform's 16 stores: schedule/winograd_fuse.py). Only a Load
    itself is renamed: a rebuilt x + 0 may fold to its (already renamed) operand."""
    return rewrite(e, lambda x, y: Load(canon[y.buf], y.index, y.dtype) if isinstance(x, Load) else y, memo=memo)


def _loads_of(e: Expr, buf: str) -> list[Load]:
    return [x for x in walk(e) if isinstance(x, Load) and x.buf == buf]


def _count_loads(e: Expr, buf: str) -> int:
    """Loads of buf counted with multiplicity (walk() deduplicates identical sub-expressions)."""
    if isinstance(e, Load) and e.buf == buf:
        return 1 + sum(_count_loads(i, buf) for i in e.index)
    return sum(_count_loads(k, buf) for k in children(e))


def _same_point(index: tuple[Expr, ...], axes: tuple[Expr, ...], extents: tuple[int, ...]) -> bool:
    """index addresses the point `axes` (a size-1 axis may be indexed by the literal 0)."""
    return len(index) == len(axes) and all(
        i == a or (n == 1 and isinstance(i, Const) and i.value == 0) for i, a, n in zip(index, axes, extents))


def _movement_into_matmul(prod: Group, cons: Group, consumer: Node, shapes: dict[str, tuple[int, ...]]) -> bool:
    """A pure data-movement producer (Transpose, Slice, …: one compute whose body is one Load) read by a plain fp32
    MatMul built directly, where the inlined operand stays unit-stride or uniform along the MatMul's vector axis (its
    last, the tile's n): attention's head split, Q = x[s, h, d] as A[h, s, d] and V as B[h, s, d], is then read in
    place instead of copied out first (Kᵀ, B[h, d, s] = x[s, h, d], is strided along n and keeps its copy)."""
    last = prod.computes[-1]
    if (len(prod.computes) != 1 or not isinstance(last.body, Load) or consumer.op != "MatMul"
            or consumer.attrs.get("strategy", "direct") != "direct"
            or consumer.attrs.get("precision", "fp32") != "fp32"):
        return False
    cons_last = cons.computes[-1]
    n = cons_last.axes[-1]
    for ld in _loads_of(cons_last.body, last.out):
        src = substitute(last.body, dict(zip(last.axes, ld.index)))
        if not isinstance(src, Load) or src.buf not in shapes or \
                coef(flat_index(src.index, shapes[src.buf]), n) not in (0, 1):
            return False
    return True


def can_inline(prod: Group, cons: Group, consumer: Node, options: dict[str, bool],
               shapes: dict[str, tuple[int, ...]] | None = None) -> bool:
    if not options.get("fusion", True):
        return False
    last = prod.computes[-1]
    if last.store is not None or any(c.out == last.out for c in prod.computes[:-1]):
        return False
    cons_last = cons.computes[-1]
    if any(_loads_of(c.body, last.out) for c in cons.computes[:-1]):
        return False
    has_reduce = any(isinstance(x, Reduce) for x in walk(last.body))
    if not has_reduce:
        # a consumer that reads the producer k times gets k copies of its expression: bound the growth, or a
        # chain of such ops (Softplus, HardSwish, float16 rounding) grows exponentially
        copies = _count_loads(cons_last.body, last.out)
        if OPS[consumer.op].kind == "anchor":
            return options.get("fuse_elementwise", True) and shapes is not None and \
                _movement_into_matmul(prod, cons, consumer, shapes)
        return (options.get("fuse_elementwise", True)
                and (copies <= 1 or copies * len(walk(last.body)) <= MAX_DUPLICATED_NODES))
    # epilogue: the consumer reads the anchor at its own output index only (once, or more often at that one point:
    # GELU's x·Φ(x) — the copies are one expression, one accumulator), over the same domain — unless the
    # consumer already carries a Winograd output transform (16 loads and selects per output: cheaper in its own
    # transposed schedule, reading the anchor's result, than in the anchor's tile epilogue)
    loads = _loads_of(cons_last.body, last.out)
    kind = OPS[consumer.op].kind
    # a Dequantize stays out of an (integer) anchor's epilogue: the anchor then stores its 8-bit result, not 4× the
    # bytes in float32, and the Dequantize inlines into its reader (a residual Add's other operand) instead
    return (options.get("fuse_epilogue", True) and kind in ("unary", "binary") and consumer.op != "Dequantize"
            and "winograd" not in cons_last.hints
            and cons_last.store is None and cons_last.extents == last.extents
            and len(loads) == 1 and _same_point(loads[0].index, cons_last.axes, cons_last.extents)
            and not any(isinstance(x, Reduce) for x in walk(cons_last.body)))


def inline(prod: Group, cons: Group) -> Group:
    last = prod.computes[-1]

    def at(load: Load) -> Expr:
        return substitute(last.body, dict(zip(last.axes, load.index)))
    cons_last = cons.computes[-1]
    body = _replace_loads(cons_last.body, last.out, at)
    fused = Compute(cons_last.out, cons_last.axes, cons_last.extents, body, cons_last.store,
                    {**last.hints, **cons_last.hints})
    merged = prod.computes[:-1] + cons.computes[:-1] + [fused]
    return Group(merged, prod.temps + cons.temps, prod.nodes + cons.nodes, cons.output)


def _view_reindex(index: tuple[Expr, ...], shape: tuple[int, ...], to: tuple[int, ...]) -> tuple[Expr, ...] | None:
    """The index into `to` of the element at `index` into `shape`, when each axis of `to` is a run of consecutive
    axes of `shape` (a view that splits axes, adds or drops unit axes: [b, s, 4, 64] of [b, s, 256], [1, 12, 128, 64]
    of [12, 128, 64]): that axis's index is the run's indices in row-major order. Else (a view that merges axes)
    None."""
    out: list[Expr] = []
    i = 0
    for d in to:
        if d == 1:
            out.append(Const(0, "int64"))
            continue
        idx: Expr | None = None
        size = 1
        while size < d:
            while i < len(shape) and shape[i] == 1:  # a unit axis's index is 0
                i += 1
            if i == len(shape):
                return None
            idx = index[i] if idx is None else idx * shape[i] + index[i]
            size *= shape[i]
            i += 1
        if size != d:
            return None
        out.append(idx)
    return tuple(out) if all(n == 1 for n in shape[i:]) else None


def _through_view(v: Value, g: Group, by_name: dict[str, Value], view_of: dict[str, str],
                  users: dict[int, list[Node]], outputs: set[int]) -> tuple[Value | None, Group]:
    """If `v` is a chain of views (each read only by the next, none a graph output) of a value that split its axes or
    add or drop unit axes, that value and `g` with its loads of `v` re-indexed into it — so the value's producer can
    inline as if read directly: torch's `expand → view` before a bmm, and attention's head split (a Slice of the QKV
    projection, viewed as [b, s, heads, d], transposed): the Slice then joins the Transpose, and both the MatMul
    that reads Q or V in place, instead of a copy kernel each (gpt_decoder: 59 → 47 kernels). Else (None, g)."""
    chain = [v]
    while chain[-1].name in view_of:
        if len(users.get(id(chain[-1]), [])) != 1 or id(chain[-1]) in outputs:
            return None, g
        chain.append(by_name[view_of[chain[-1].name]])
    src = chain[-1]
    if len(chain) == 1 or _view_reindex(tuple(Const(0, "int64") for _ in v.shape), v.shape, src.shape) is None:
        return None, g

    def retarget(ld: Load) -> Expr:
        return Load(src.name, _view_reindex(ld.index, v.shape, src.shape), ld.dtype)  # type: ignore[arg-type]
    last = g.computes[-1]
    moved = Compute(last.out, last.axes, last.extents, _replace_loads(last.body, v.name, retarget), last.store,
                    last.hints)
    if any(_loads_of(c.body, v.name) for c in g.computes[:-1]):
        return None, g
    return src, Group(g.computes[:-1] + [moved], g.temps, g.nodes, g.output)


def build_program(graph: Graph, options: dict[str, bool], dims: DynamicDims | None = None) -> Program:
    """`dims`: the graph's symbolic dims (kernel/dynamic.py): lowering then runs on the graph at its upper bounds
    (the max layouts) and each loop gets its run-time extent."""
    if dims is not None:
        graph = max_graph(graph, dims)
    prog = Program(graph, dims=dims)
    users = graph.consumers()
    outputs = {id(v) for v in graph.outputs}
    group_of: dict[int, Group] = {}   # id(value) → group producing it (not yet emitted as a kernel)
    order: list[Group] = []
    by_name = {v.name: v for v in graph.values()}
    shapes = {name: v.shape for name, v in by_name.items()}
    for n in graph.nodes:
        if n.op in VIEW_OPS and (dims is None or reshape_is_view(dims.shape_of(n.inputs[0]),
                                                                  dims.shape_of(n.outputs[0]))):
            prog.view_of[n.outputs[0].name] = n.inputs[0].name
            continue
        if n.op in VIEW_OPS:  # merges or splits a symbolic dim: not the same storage in the max layouts
            low: Lowered = reshape_copy(n, dims)
        else:
            low = lower_node(n) if dims is None else runtime_extents(n, lower_node(n), dims)
        if "strategy" in n.attrs:  # the schedule of the anchor's reduction builds it this way (kiln/strategy.py)
            for c in low.computes:
                if any(isinstance(x, Reduce) for x in walk(c.body)):
                    c.hints.update(strategy=n.attrs["strategy"], node=n.name, op=n.op)
        g = Group(low.computes, low.temps, [n], n.outputs[0])
        for v in n.inputs:
            p = group_of.get(id(v))
            through = g
            if p is None:  # a view (split or unit axes) of a value only this node reads: read that value, re-indexed
                src, through = _through_view(v, g, by_name, prog.view_of, users, outputs)
                p = group_of.get(id(src)) if src is not None else None
                v = src if src is not None else v
            if (p is not None and p in order and len(users.get(id(v), [])) == 1 and id(v) not in outputs
                    and n.inputs.count(v) <= 1 and can_inline(p, through, n, options, shapes)):
                g = inline(p, through)
                order.remove(p)
        group_of[id(n.outputs[0])] = g
        order.append(g)
    prog.groups = order
    for v in graph.values():
        if v.dtype not in KERNEL_DTYPES:
            p = v.producer
            raise UnsupportedOperator(p.op if p else "<value>", p.name if p else v.name,
                                      detail=f"%{v.name} has element type {v.dtype}; kernels handle "
                                             f"{', '.join(sorted(KERNEL_DTYPES))}")
        prog.buffers.setdefault(v.name, Buffer(v.name, v.dtype, v.shape))
        if v.const is not None:
            prog.consts[v.name] = v.const
    for i, g in enumerate(order):
        for t in g.temps:
            prog.buffers[t.name] = t
        prog.kernels.append(make_kernel(g, prog, f"k{i}_{g.anchor.op.lower()}"))
    return prog


def make_kernel(g: Group, prog: Program, name: str) -> Kernel:
    """Name the kernel's buffers b0..bn (so identical kernels print identically and share code)."""
    used: list[str] = []
    for c in g.computes:
        for x in [c.out] + [e.buf for e in walk(c.body) if isinstance(e, Load)] + \
                [e.buf for s in (c.store or ()) for e in walk(s) if isinstance(e, Load)]:
            if x not in used:
                used.append(x)
    temps = {t.name for t in g.temps}
    args = [x for x in used if x not in temps]
    scratch = [x for x in used if x in temps]
    canon = {x: f"b{i}" for i, x in enumerate(args + scratch)}
    comps = [Compute(canon[c.out], c.axes, c.extents, _final_body(rename_loads(c.body, canon)), c.store, c.hints)
             for c in g.computes]
    k = Kernel(name, [Buffer(canon[x], prog.buffers[x].dtype, prog.buffers[x].shape) for x in args],
               [Buffer(canon[x], prog.buffers[x].dtype, prog.buffers[x].shape) for x in scratch], comps)
    k.flops = _flops(g)
    prog.bindings.append(args + scratch)
    return k


def _final_body(e: Expr) -> Expr:
    """A quantized output's body without the clamps it already satisfies (kernel/simplify.py: the int8 epilogue's
    second clamp); float bodies are left alone — resnet50's Winograd transforms took 0.13 s to walk for nothing."""
    return e if is_float(e.dtype) else drop_satisfied_clamps(e)


def _flops(g: Group) -> float:
    """Multiply-add FLOPs of the group's anchors (what GFLOP/s figures count; 8-bit multiply-adds as operations)."""
    total = 0.0
    for n in g.nodes:
        if n.op in ("MatMul", "PackedMatMul"):
            total += 2.0 * n.outputs[0].type.size * n.inputs[0].shape[-1]
        elif n.op == "Conv":
            total += 2.0 * n.outputs[0].type.size * n.inputs[1].type.size / n.inputs[1].shape[0]
        elif n.op == "PackedConv":  # Wp[⌈Co/NR⌉, Ci, kh, kw, NR]: Ci·kh·kw multiply-adds per output
            x, w = n.inputs[0].shape, n.inputs[1].shape  # bf16 weights are paired (graph/passes/precision.py)
            ci = x[1] * (x[-1] if n.attrs.get("in_block") else 1)
            k = ci * int(np.prod(n.attrs["kernel"])) if n.attrs.get("vnni") else int(np.prod(w[1:-1]))
            total += 2.0 * n.outputs[0].type.size * k
        elif n.op in ("QMatMul", "QPackedMatMul"):  # integer multiply-adds count as FLOPs do (GOP/s)
            total += 2.0 * n.outputs[0].type.size * n.inputs[0].shape[-1]
        elif n.op == "QConv":
            total += 2.0 * n.outputs[0].type.size * n.inputs[1].type.size / n.inputs[1].shape[0]
        elif n.op == "QPackedConv":  # blocked input x[N, C/cb, H, W, cb]
            x = n.inputs[0].shape
            k = x[1] * x[-1] // n.attrs.get("group", 1) * int(np.prod(n.attrs["kernel"]))
            total += 2.0 * n.outputs[0].type.size * k
        elif n.op == "WinogradProduct":  # the multiply-adds really done: 16 GEMMs over the tiles
            total += 2.0 * n.outputs[0].type.size * n.inputs[0].shape[3] * n.inputs[0].shape[5]
        elif n.op == "ConvTranspose":
            total += 2.0 * n.inputs[0].type.size * n.inputs[1].type.size / n.inputs[1].shape[0]
    return total


def copy_compute(src: Value, dst: str) -> Compute:
    ax = axes_for(src.shape)
    return Compute(dst, ax, src.shape, Load(src.name, ax, src.dtype))
