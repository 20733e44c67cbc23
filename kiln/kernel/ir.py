"""Kernel (loop) IR: buffers, index and value expressions, and loop nests.

Two layers, as in Halide/TVM:
  * a *compute definition* — `Compute(out, axes, body)` where `body` is an expression over the output
    indices that may contain one `Reduce` (a reduction over extra axes);
  * a *loop nest* — `Loop`/`Store`/`Local`/`Assign` statements that a schedule rewrites and codegen emits.
Expressions are frozen dataclasses: hashable, comparable, printable, and substitutable."""
from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from typing import Any

import numpy as np

_FLOATS = ("float32", "float64", "bfloat16")
# bfloat16 is a storage type: a bf16 load is exact in float32, and arithmetic on it is float32 arithmetic (a value is
# rounded to bf16 only where it is cast or stored as bfloat16)
STORAGE_ONLY = {"bfloat16": "float32"}


class Expr:
    """Base of every expression; arithmetic operators build `Bin` nodes (tinygrad-style density)."""
    dtype: str

    def _bin(self, op: str, other: Any, rev: bool = False) -> Expr:
        o = other if isinstance(other, Expr) else Const(other, self.dtype)
        a, b = (o, self) if rev else (self, o)
        # peepholes that keep index expressions short and affine: x*1, x//1, x+0, x-0, 0+x, 1*x
        if isinstance(b, Const) and not isinstance(b.value, bool) and self.dtype != "bool":
            if (op in ("*", "//") and b.value == 1) or (op in ("+", "-") and b.value == 0):
                return a
            if op == "*" and b.value == 0 and self.dtype.startswith("int"):
                return b
        if isinstance(a, Const) and not isinstance(a.value, bool) and self.dtype != "bool":
            if (op == "*" and a.value == 1) or (op == "+" and a.value == 0):
                return b
            if op == "*" and a.value == 0 and self.dtype.startswith("int"):
                return a
        if isinstance(a, Const) and isinstance(b, Const) and op in _FOLD and (
                a.dtype == "bool" if op in ("and", "or") else a.dtype.startswith("int")):
            # integer / boolean constants fold (an unrolled loop's selects: schedule/winograd.py)
            v = _FOLD[op](a.value, b.value)
            return Const(v, "bool" if isinstance(v, bool) else a.dtype)
        return Bin(op, a, b)

    def __add__(self, o: Any) -> Expr:
        return self._bin("+", o)

    def __radd__(self, o: Any) -> Expr:
        return self._bin("+", o, True)

    def __sub__(self, o: Any) -> Expr:
        return self._bin("-", o)

    def __rsub__(self, o: Any) -> Expr:
        return self._bin("-", o, True)

    def __mul__(self, o: Any) -> Expr:
        return self._bin("*", o)

    def __rmul__(self, o: Any) -> Expr:
        return self._bin("*", o, True)

    def __truediv__(self, o: Any) -> Expr:
        return self._bin("/", o)

    def __rtruediv__(self, o: Any) -> Expr:
        return self._bin("/", o, True)

    def __floordiv__(self, o: Any) -> Expr:
        return self._bin("//", o)

    def __mod__(self, o: Any) -> Expr:
        return self._bin("%", o)

    def __neg__(self) -> Expr:
        return Un("neg", self)


@dataclass(frozen=True, repr=False)
class Const(Expr):
    value: float | int | bool
    dtype: str = "float32"

    def __repr__(self) -> str:
        return repr(self.value) if self.dtype in ("float32", "int64") else f"{self.value}:{self.dtype}"


@dataclass(frozen=True, repr=False)
class Var(Expr):
    """A loop index (always int64)."""
    name: str
    dtype: str = "int64"

    def __repr__(self) -> str:
        return self.name


@dataclass(frozen=True, repr=False)
class Sym(Expr):
    """A symbolic dimension's value at run time (int64): `seq`, `batch`. Buffers are laid out at the symbol's upper
    bound (kernel/dynamic.py); loops over a symbolic dim run to this value. Codegen reads it from the module's dims
    array, which the Executable fills before each call."""
    name: str
    index: int  # its slot in the module's dims array
    hi: int     # its upper bound: the size of the max layout, and what schedule decisions plan for
    dtype: str = "int64"
    lo: int = 1  # its lower bound (the tuner draws the sizes it measures at from [lo, hi]: tune/sizes.py)

    def __repr__(self) -> str:
        return f"${{{self.name}}}"


@dataclass(frozen=True, repr=False)
class Load(Expr):
    buf: str
    index: tuple[Expr, ...]
    dtype: str = "float32"

    def __repr__(self) -> str:
        return f"{self.buf}[{', '.join(map(repr, self.index))}]"


_CMP = ("<", "<=", "==", "!=", ">", ">=")
_FOLD = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b,
         "<": lambda a, b: a < b, "<=": lambda a, b: a <= b, "==": lambda a, b: a == b, "!=": lambda a, b: a != b,
         ">": lambda a, b: a > b, ">=": lambda a, b: a >= b,
         "and": lambda a, b: bool(a and b), "or": lambda a, b: bool(a or b)}
_LOGIC = ("and", "or", "xor")


@dataclass(frozen=True, repr=False)
class Bin(Expr):
    """+ - * / // % max min pow, comparisons (→ bool), and/or/xor."""
    op: str
    a: Expr
    b: Expr
    dtype: str = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "dtype", "bool" if self.op in _CMP else STORAGE_ONLY.get(self.a.dtype, self.a.dtype))

    def __repr__(self) -> str:
        if self.op in ("max", "min", "pow"):
            return f"{self.op}({self.a!r}, {self.b!r})"
        return f"({self.a!r} {self.op} {self.b!r})"


@dataclass(frozen=True, repr=False)
class Un(Expr):
    """neg exp log sqrt tanh erf abs floor ceil round sin cos sigmoid not sign."""
    op: str
    a: Expr
    dtype: str = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "dtype", STORAGE_ONLY.get(self.a.dtype, self.a.dtype))

    def __repr__(self) -> str:
        return f"{self.op}({self.a!r})"


@dataclass(frozen=True, repr=False)
class Select(Expr):
    cond: Expr
    a: Expr
    b: Expr
    dtype: str = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "dtype", self.a.dtype)

    def __repr__(self) -> str:
        return f"select({self.cond!r}, {self.a!r}, {self.b!r})"


@dataclass(frozen=True, repr=False)
class Cast(Expr):
    dtype: str
    a: Expr

    def __repr__(self) -> str:
        return f"{self.dtype}({self.a!r})"


@dataclass(frozen=True, repr=False)
class LocalRef(Expr):
    """Reads a mutable local (an accumulator) declared by `Local`; `slot` picks one of an array of
    accumulators (a register tile) and must be a constant once unrolled."""
    name: str
    dtype: str = "float32"
    slot: Expr | None = None

    def __repr__(self) -> str:
        return f"${self.name}" + (f"[{self.slot!r}]" if self.slot is not None else "")


@dataclass(frozen=True, repr=False)
class Reduce(Expr):
    """op over `axes` (Var, extent) of `body`; only inside a Compute body, hoisted by lowering."""
    op: str  # sum | max | min | prod
    axes: tuple[tuple[Var, int], ...]
    body: Expr
    dtype: str = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "dtype", self.body.dtype)

    def __repr__(self) -> str:
        ax = ", ".join(f"{v.name}<{n}" for v, n in self.axes)
        return f"{self.op}[{ax}]({self.body!r})"


@dataclass(frozen=True, repr=False)
class Addr(Expr):
    """The address of buf[index] (a pointer), for passing a tile of a buffer to a `Call`."""
    buf: str
    index: tuple[Expr, ...]
    dtype: str = "ptr"

    def __repr__(self) -> str:
        return f"&{self.buf}[{', '.join(map(repr, self.index))}]"


_MEMOS = ("_hash", "_repr", "_atoms", "_kids")  # what a node memoizes about itself (cache_hash, atoms, children)


def cache_hash(cls: type) -> None:
    """Memoize a frozen dataclass's hash and text: expressions are trees hashed over and over (dict keys in
    substitute, walk, the codegen's caches), and printed whole (a kernel's text is its identity: codegen/module.py
    kernel_key) — with shared subtrees, a run-time extent's decode in every index of a dynamic kernel. The generated
    __hash__ and the __repr__s recompute the whole tree each time."""
    def memo(slot: str, compute: Callable[[Any], Any]) -> Callable[[Any], Any]:
        def memoized(self: Any) -> Any:
            v = self.__dict__.get(slot)
            if v is None:
                v = compute(self)
                object.__setattr__(self, slot, v)
            return v
        return memoized
    cls.__hash__, cls.__repr__ = memo("_hash", cls.__hash__), memo("_repr", cls.__repr__)
    # the hash memo is a str hash, salted per process: a pickled expression (sent to a tuning worker) drops it
    cls.__getstate__ = lambda self: {k: v for k, v in self.__dict__.items() if k not in _MEMOS}


for _cls in (Const, Var, Sym, Load, Bin, Un, Select, Cast, LocalRef, Reduce, Addr):
    cache_hash(_cls)


def is_float(dtype: str) -> bool:
    return dtype in _FLOATS


def fn(op: str, a: Expr) -> Expr:
    return Un(op, a)


def maximum(a: Expr, b: Any) -> Expr:
    return a._bin("max", b)


def minimum(a: Expr, b: Any) -> Expr:
    return a._bin("min", b)


def cmp(op: str, a: Expr, b: Any) -> Expr:
    return a._bin(op, b)


def const_like(value: float | int, e: Expr) -> Const:
    if e.dtype.startswith(("int", "uint")):
        return Const(int(value), e.dtype)
    return Const(bool(value) if e.dtype == "bool" else float(value),
                 e.dtype)


def init_value(op: str, dtype: str) -> Const:
    if dtype in _FLOATS:
        v: float | int = {"sum": 0.0, "prod": 1.0, "max": -np.inf, "min": np.inf}[op]
    else:
        info = np.iinfo(dtype) if dtype != "bool" else None
        v = {"sum": 0, "prod": 1, "max": info.min if info else 0, "min": info.max if info else 1}[op]
    return Const(v, dtype)


# -- generic traversal ---------------------------------------------------------------------------------------------
# the fields that may hold a sub-expression, per class: `dataclasses.fields` on every node visited was a tenth of
# resnet50's scheduling and lowering (78k calls)
_KID_FIELDS: dict[type, tuple[str, ...]] = {}


def _kid_fields(cls: type) -> tuple[str, ...]:
    names = _KID_FIELDS.get(cls)
    if names is None:
        names = _KID_FIELDS[cls] = tuple(f.name for f in fields(cls) if f.name not in ("op", "dtype", "name", "buf"))
    return names


def children(e: Expr) -> tuple[Expr, ...]:
    """The sub-expressions of `e`, memoized on the node (walks and substitutions visit the same trees many times)."""
    got = e.__dict__.get("_kids")
    if got is None:
        if isinstance(e, (Load, Addr)):
            got = e.index
        elif isinstance(e, Reduce):
            got = (e.body,)
        else:
            got = tuple(v for n in _kid_fields(type(e)) if isinstance(v := getattr(e, n), Expr))
        object.__setattr__(e, "_kids", got)
    return got


def rebuild(e: Expr, kids: list[Expr]) -> Expr:
    if isinstance(e, (Load, Addr)):
        return replace(e, index=tuple(kids))
    if isinstance(e, Reduce):
        return Reduce(e.op, e.axes, kids[0])
    if isinstance(e, Bin):
        return kids[0]._bin(e.op, kids[1])  # re-apply the peepholes after substitution
    if isinstance(e, Un):
        return Un(e.op, kids[0])
    if isinstance(e, Select):
        if isinstance(kids[0], Const):  # a folded condition picks its arm
            return kids[1] if kids[0].value else kids[2]
        return Select(*kids)
    names = [n for n in _kid_fields(type(e)) if isinstance(getattr(e, n), Expr)]
    return replace(e, **dict(zip(names, kids)))


_ATOMS = (Var, Sym, LocalRef)
_NO_ATOMS: frozenset[Expr] = frozenset()
_LEAF_ATOMS: dict[Expr, frozenset[Expr]] = {}  # Var / Sym → {itself}: as many as there are distinct names


def atoms(e: Expr) -> frozenset[Expr]:
    """The Vars, Syms and LocalRefs under `e` (itself included), memoized on the node: a subtree without any of a
    substitution's variables is returned as it is instead of being rebuilt (schedules substitute whole bodies per
    unrolled point: Winograd's 16 input-transform stores)."""
    if isinstance(e, _ATOMS):  # not memoized on the node: a set holding its own node would be a reference cycle
        kids = children(e)
        if kids:  # a LocalRef's slot
            return frozenset((e,)).union(*map(atoms, kids))
        got = _LEAF_ATOMS.get(e)
        if got is None:
            got = _LEAF_ATOMS[e] = frozenset((e,))
        return got
    got = e.__dict__.get("_atoms")
    if got is None:
        kids = children(e)
        got = _NO_ATOMS if not kids else atoms(kids[0]) if len(kids) == 1 else frozenset().union(*map(atoms, kids))
        object.__setattr__(e, "_atoms", got)
    return got


def substitute(e: Expr, mapping: dict[Expr, Expr]) -> Expr:
    """Replace sub-expressions (typically Vars) structurally, bottom-up, memoized. A key occurs only in subtrees
    holding all its atoms, so subtrees sharing none with the keys are skipped (unless a key has none: a constant)."""
    key_atoms: frozenset[Expr] | None = frozenset().union(*map(atoms, mapping)) if mapping else _NO_ATOMS
    if any(not atoms(k) for k in mapping):
        key_atoms = None
    return _substitute(e, mapping, key_atoms, {})


def _substitute(x: Expr, mapping: dict[Expr, Expr], key_atoms: frozenset[Expr] | None, memo: dict[Expr, Expr]) -> Expr:
    if x in mapping:
        return mapping[x]
    if key_atoms is not None and key_atoms.isdisjoint(atoms(x)):
        return x
    out = memo.get(x)
    if out is None:
        kids = children(x)
        out = memo[x] = rebuild(x, [_substitute(k, mapping, key_atoms, memo) for k in kids]) if kids else x
    return out


def rewrite(e: Expr, post: Callable[[Expr, Expr], Expr] | None = None, pre: Callable[[Expr], Expr | None] | None = None,
            memo: dict[Expr, Expr] | None = None) -> Expr:
    """`e` rebuilt bottom-up, each distinct sub-expression once (`memo` may be shared by calls over expressions with
    common parts): `pre(x)`, when not None, replaces x whole (its subtree is not visited); otherwise x is rebuilt
    from its rewritten children and `post(x, rebuilt)` is the result.

    Module-level recursion, here and in `_substitute`, rather than a nested function calling itself: such a closure
    is a reference cycle that keeps its memo — every expression it built — until the cycle collector runs (a resnet18
    compile left 156k objects to it)."""
    return _rewrite(e, pre, post, {} if memo is None else memo)


def _rewrite(x: Expr, pre: Callable[[Expr], Expr | None] | None, post: Callable[[Expr, Expr], Expr] | None,
             memo: dict[Expr, Expr]) -> Expr:
    out = memo.get(x)
    if out is None:
        out = pre(x) if pre is not None else None
        if out is None:
            kids = children(x)
            out = rebuild(x, [_rewrite(k, pre, post, memo) for k in kids]) if kids else x
            if post is not None:
                out = post(x, out)
        memo[x] = out
    return out


def walk(e: Expr) -> list[Expr]:
    out, stack, seen = [], [e], set()
    while stack:
        x = stack.pop()
        if x in seen:
            continue
        seen.add(x)
        out.append(x)
        stack.extend(children(x))
    return out


def walk_stmts(stmts: list[Stmt]) -> list[Stmt]:
    """Every statement of a loop nest in order, nested ones included (loop bodies, both sides of an If)."""
    out: list[Stmt] = []
    for s in stmts:
        out.append(s)
        if isinstance(s, Loop):
            out += walk_stmts(s.body)
        elif isinstance(s, If):
            out += walk_stmts(s.body) + walk_stmts(s.orelse)
    return out


def uses_var(e: Expr, v: Var) -> bool:
    return v in atoms(e) if isinstance(v, _ATOMS) else any(x == v for x in walk(e))


_INT_OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b, "//": lambda a, b: a // b,
            "%": lambda a, b: a % b, "max": max, "min": min}


def hint(e: Expr | int) -> int:
    """An extent's value for schedule decisions: itself when constant, its value at the upper bounds when it holds
    symbolic dims (`Sym`) — tiles, vector widths and parallel splits are planned for the largest size."""
    v = _evaluate(e, {}, _INT_OPS)
    if v is None:
        raise ValueError(f"extent {e!r} is not an integer expression of constants and symbolic dims")
    return v


_CMP_OPS = {"<": lambda a, b: a < b, "<=": lambda a, b: a <= b, ">": lambda a, b: a > b, ">=": lambda a, b: a >= b,
            "==": lambda a, b: a == b, "!=": lambda a, b: a != b, "and": lambda a, b: a and b,
            "or": lambda a, b: a or b}
_VALUE_OPS = {**_INT_OPS, **_CMP_OPS}


def value_at(e: Expr | int, env: dict[str, int]) -> int | None:
    """An integer expression of constants and symbolic dims at the sizes `env` (symbol → value; a symbol not in it
    at its upper bound), comparisons as 0/1; None where it holds anything else (a loop variable, a load)."""
    return _evaluate(e, env, _VALUE_OPS)


def _evaluate(e: Expr | int, env: dict[str, int], ops: dict) -> int | None:
    if isinstance(e, (int, np.integer)):
        return int(e)
    if isinstance(e, Const):
        return int(e.value) if isinstance(e.value, (int, bool, np.integer)) else None
    if isinstance(e, Sym):
        return int(env.get(e.name, e.hi))
    if isinstance(e, Bin) and e.op in ops:
        a, b = _evaluate(e.a, env, ops), _evaluate(e.b, env, ops)
        if a is None or b is None or (e.op in ("//", "%") and b == 0):
            return None
        return int(ops[e.op](a, b))
    return None


def as_extent(n: Expr | int) -> Expr:
    """A loop extent: an int becomes an int64 Const, a run-time extent (over `Sym`s) stays as it is."""
    return n if isinstance(n, Expr) else Const(int(n), "int64")


def is_symbolic(n: Expr | int) -> bool:
    return isinstance(n, Expr) and not isinstance(n, Const)


# -- compute definitions and loop nests ----------------------------------------------------------------------
@dataclass(frozen=True)
class Buffer:
    name: str
    dtype: str
    shape: tuple[int, ...]

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))


@dataclass
class Compute:
    """for axes in extents: out[store or axes] = body  (body may contain one Reduce over extra axes).

    `store` (default: the axes themselves) lets a compute write a region of its output, as Concat does."""
    out: str
    axes: tuple[Var, ...]
    extents: tuple[int, ...]
    body: Expr
    store: tuple[Expr, ...] | None = None
    hints: dict = field(default_factory=dict)  # schedule hints from lowering, e.g. {"nr": 32} for packed panels

    @property
    def store_index(self) -> tuple[Expr, ...]:
        return self.store if self.store is not None else self.axes

    def __str__(self) -> str:
        dom = ", ".join(f"{v.name}<{n}" for v, n in zip(self.axes, self.extents))
        return f"{self.out}[{', '.join(map(repr, self.store_index))}] = {self.body!r}   for {dom}"


PARALLEL_MIN_WORK = 1 << 15  # below this many inner iterations a fork/join costs more than it saves


@dataclass
class Loop:
    """for var in [0, extent): body. kind: serial | parallel | vector | unroll.

    `vector` loops are emitted as `lanes`-wide vectors with a scalar remainder, or, when `masked`, with
    one masked vector iteration for the remainder (AVX-512 k-masks; no scalar code). A `parallel` loop's
    `chunks` is how many chunks per thread the pool hands out (0: codegen's rule by the kernel's work)."""
    var: Var
    extent: Expr
    body: list[Stmt]
    kind: str = "serial"
    lanes: int = 1
    masked: bool = False
    chunks: int = 0
    # a parallel loop over run-time extents (symbolic dims): its work (iterations of the whole nest) as a run-time
    # expression; below PARALLEL_MIN_WORK it runs on the calling thread (the fork/join costs more than the work)
    work: Expr | None = None


@dataclass
class Store:
    buf: str
    index: tuple[Expr, ...]
    value: Expr


@dataclass
class Local:
    """Declare a mutable accumulator (or `count` of them: a register tile) and initialize it."""
    name: str
    dtype: str
    init: Expr
    count: int = 1


@dataclass
class Assign:
    name: str
    value: Expr
    slot: Expr | None = None


@dataclass
class If:
    cond: Expr
    body: list[Stmt]
    orelse: list[Stmt] = field(default_factory=list)
    # where `cond` reads loop variables (a tail tile: schedule/tile.py): (iterations taking `orelse`, iterations
    # reaching the If), integer expressions of the symbolic dims — the cost model weighs the two sides by it
    share: tuple[Expr, Expr] | None = None


@dataclass
class Alloc:
    """A private buffer of the enclosing function (stack memory: one per thread inside a parallel loop), e.g.
    the packed A block or the C tile a microkernel works on. Loads/Stores/Addr address it by `name`."""
    name: str
    dtype: str
    shape: tuple[int, ...]


@dataclass
class Call:
    """Call a function the loop nest does not describe: a hand-written microkernel linked into the module
    (kiln/ukernels) or a library routine resolved when the object is loaded (kiln/library). Arguments are
    `Addr`s (pointers) and scalar expressions (their dtype gives the C type: int64, int32, float32)."""
    fn: str
    args: tuple[Expr, ...]


@dataclass
class Prefetch:
    """A software prefetch of the cache line holding buf[index] (llvm.prefetch: a hint — it never faults, so an
    index past the buffer's end is harmless, and it changes no value). `index` is uniform (no vector lane).
    Emitted by the schedule primitive schedule/prefetch.py."""
    buf: str
    index: tuple[Expr, ...]
    write: bool = False
    locality: int = 3   # 3: keep in every cache level (prefetcht0) … 0: no temporal locality


Stmt = Loop | Store | Local | Assign | If | Alloc | Call | Prefetch


@dataclass
class Kernel:
    """One fused group: its buffers (arguments, in order, then scratch), computes and loop nest."""
    name: str
    args: list[Buffer]                 # bound by the caller, in this order
    scratch: list[Buffer] = field(default_factory=list)  # kernel-private temporaries (allocated on the arena)
    computes: list[Compute] = field(default_factory=list)
    body: list[Stmt] = field(default_factory=list)
    flops: float = 0.0
    extern_ir: dict[str, str] = field(default_factory=dict)  # microkernel name → its LLVM IR definition
    # microkernels shared by the model's kernels (a dynamic GEMM's tails: schedule/tail_calls.py): a split build
    # defines them once, in the entry module, and the compile units only declare them (codegen/module.py)
    shared_ir: dict[str, str] = field(default_factory=dict)
    symbols: list[str] = field(default_factory=list)         # library symbols resolved at load (kiln/library)
    strategies: dict[str, str] = field(default_factory=dict)  # anchor node → how it was actually built
    decisions: Any = None  # the schedule's knob values and domains (schedule/config.py: Decisions)
    precision: dict[str, str] = field(default_factory=dict)   # bf16 anchor node → amx | avx512bf16 | emulated
    # run-time extents (symbolic dims): the specialized schedules this kernel ran without, and why
    fallbacks: list[str] = field(default_factory=list)

    def buffer(self, name: str) -> Buffer:
        for b in itertools.chain(self.args, self.scratch):
            if b.name == name:
                return b
        raise KeyError(name)

    def __str__(self) -> str:
        head = f"kernel {self.name}(" + ", ".join(f"{b.name}: {b.dtype}{list(b.shape)}" for b in self.args) + ")"
        lines = [head + " {"]
        lines += [f"  scratch {b.name}: {b.dtype}{list(b.shape)}" for b in self.scratch]
        if self.body:
            lines += format_stmts(self.body, 1)
        else:
            lines += ["  " + str(c) for c in self.computes]
        return "\n".join(lines + ["}"])


def format_stmts(stmts: list[Stmt], depth: int) -> list[str]:
    pad = "  " * depth
    out = []
    for s in stmts:
        if isinstance(s, Loop):
            tag = "" if s.kind == "serial" else f" {s.kind}" + (f"<{s.lanes}>" if s.kind == "vector" else "") + \
                (" masked" if s.masked else "") + (f" chunks={s.chunks}" if s.chunks else "") + \
                (f" work={s.work!r}" if s.work is not None else "")
            out.append(f"{pad}for {s.var.name} in 0..{s.extent!r}{tag}:")
            out += format_stmts(s.body, depth + 1)
        elif isinstance(s, Store):
            out.append(f"{pad}{s.buf}[{', '.join(map(repr, s.index))}] = {s.value!r}")
        elif isinstance(s, Local):
            arr = f"[{s.count}]" if s.count > 1 else ""
            out.append(f"{pad}local ${s.name}{arr}: {s.dtype} = {s.init!r}")
        elif isinstance(s, Assign):
            slot = f"[{s.slot!r}]" if s.slot is not None else ""
            out.append(f"{pad}${s.name}{slot} = {s.value!r}")
        elif isinstance(s, Alloc):
            out.append(f"{pad}alloc {s.name}: {s.dtype}{list(s.shape)}")
        elif isinstance(s, Call):
            out.append(f"{pad}call {s.fn}({', '.join(map(repr, s.args))})")
        elif isinstance(s, Prefetch):
            out.append(f"{pad}prefetch{'w' if s.write else ''} {s.buf}[{', '.join(map(repr, s.index))}] "
                       f"locality={s.locality}")
        elif isinstance(s, If):
            out.append(f"{pad}if {s.cond!r}:")
            out += format_stmts(s.body, depth + 1)
            if s.orelse:
                out.append(f"{pad}else:")
                out += format_stmts(s.orelse, depth + 1)
    return out
