"""Scalable-vector code generation (AArch64 SVE/SVE2, RISC-V RVV 1.0): `vector` loops strip-mined with the
vector-predication (VP) intrinsics.

A `vector` loop of `lanes` (sized by the schedule for the target's *minimum* vector width) over [lo, hi)

    for v in lo..hi vector<lanes>: S(v)

is emitted on a scalable target as

    for (i = lo; i < hi; i += evl) {
      evl = llvm.experimental.get.vector.length(hi − i, N, scalable)   // ≤ vscale·N lanes this strip
      S(i + stepvector) on <vscale x N x T> values: llvm.vp.load / vp.store / vp.gather / vp.scatter with evl
    }

with N = target.scalable_count(lanes) rounded down to a power of two (one register at the minimum width per
`lanes/target.lanes()`; RVV: LMUL from N). The same code runs at every vector length: at VLEN 1024 a strip covers
8× the lanes of VLEN 128. There is no remainder loop: the last strip is shorter. LLVM lowers this to
`vsetvli … vle32.v / vfmacc.vf / vse32.v` on RVV and `whilelo` + predicated `ld1w / fmla / st1w` on SVE (checked
in the assembly: VP with an explicit vector length compiles well for both, so one path serves both ISAs).
Arithmetic runs on whole registers; lanes past evl hold poison that no store reaches (integer loads fill
them with 1, so an integer division never sees a poison divisor).

Register tiles (kiln/schedule/tile.py) are strip-mined the same way: the tile's NR columns are fixed at
compile time (weights are packed in NR-wide panels), so at a vector length above the minimum a tile uses
only NR lanes of each register — correct at every length, sized for the minimum one.

`vector_reduce` loops (`$acc = op($acc, x(r))`) are strip-mined the same way into a scalable partial (lanes
past evl take op's identity through vp.merge) and finished with one `llvm.vector.reduce.*` (sums `reassoc`:
`vfredusum` / `faddv`; max/min propagate NaN like the fixed path).

Fixed-length fallback (counted by `count_vector_loops`): loops whose body uses math LLVM can only scalarize
(libm calls: log, sin, cos, pow, float remainder, and exp/erf/tanh/sigmoid on float64) — LLVM cannot scalarize
a scalable vector and aborts — and loops holding a microkernel Call/Alloc. Those loops use fixed vectors of
`lanes` (128 bits: NEON, or RVV fixed-length code).

On `aarch64-sme`, register tiles that fit are emitted as ZA outer products instead (kiln/codegen/sme.py).

llvmlite's IR layer has no scalable vector type: `ScalableVectorType` prints `<vscale x N x T>`, and while a
scalable loop body is emitted every instruction that consumes a scalable value is retyped scalable as it is
inserted (`_retyping`), so the ordinary vectorizer code (kiln/codegen/exprs.py, mathfn.py) that builds
`ir.VectorType(…, lanes)` results works unchanged."""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from llvmlite import ir

from kiln.codegen.access import I1, I32, I64, MEMORY, PTR, SCALAR
from kiln.codegen.exprs import ExprEmitter, VectorCtx
from kiln.codegen.loops import NestEmitter, emit_loop
from kiln.kernel.analysis import coef
from kiln.kernel.dot import Dot2, Dot4, Mmla, MmlaRow
from kiln.kernel.ir import (
    Assign,
    Bin,
    Expr,
    If,
    Kernel,
    Load,
    Local,
    LocalRef,
    Loop,
    Select,
    Stmt,
    Store,
    Un,
    Var,
    init_value,
    walk,
)

if TYPE_CHECKING:
    from kiln.target import Target


class ScalableVectorType(ir.VectorType):
    """`<vscale x N x T>`. Equal to the fixed `<N x T>` for llvmlite's operand checks (instructions built from
    fixed types are retyped on insertion); constants must be splats (printed `splat (T v)`)."""

    def _to_string(self) -> str:
        return f"<vscale x {self.count} x {self.element}>"

    def __hash__(self) -> int:
        return hash(ScalableVectorType)

    def format_constant(self, value: list[ir.Constant]) -> str:
        values = {v.constant for v in value}
        if len(values) != 1:
            raise ValueError(f"a constant of scalable type {self} must be a splat, got {len(values)} distinct values")
        if values == {0}:  # 0, 0.0 and False (the only null a scalable constant has a literal for)
            return "zeroinitializer"
        return f"splat ({self.element} {value[0].get_reference()})"


def scalable(t: ir.Type) -> bool:
    return isinstance(t, ScalableVectorType)


def _as_scalable(t: ir.Type) -> ir.Type:
    return ScalableVectorType(t.element, t.count) if type(t) is ir.VectorType else t


def _retype(instr: ir.Instruction) -> None:
    """An instruction with a scalable operand yields a scalable result; its fixed vector constants become splats."""
    ops = getattr(instr, "operands", [])
    if not any(scalable(getattr(o, "type", None)) for o in ops) and not scalable(getattr(instr, "type", None)):
        return
    instr.type = _as_scalable(instr.type)
    if any(isinstance(o, ir.Constant) and type(o.type) is ir.VectorType for o in ops):
        instr.operands = [ir.Constant(_as_scalable(o.type), o.constant)
                          if isinstance(o, ir.Constant) and type(o.type) is ir.VectorType else o for o in ops]


@contextlib.contextmanager
def _retyping(b: ir.IRBuilder) -> Iterator[None]:
    """Retype every instruction `b` inserts (see `_retype`) for the duration of a scalable loop body."""
    plain, nested = b._insert, "_insert" in vars(b)

    def insert(instr: ir.Instruction) -> None:
        _retype(instr)
        plain(instr)
    b._insert = insert  # an instance attribute: shadows IRBuilder._insert for this builder only
    try:
        yield
    finally:
        if nested:
            b._insert = plain
        else:
            del b._insert


@dataclass
class ScalableCtx(VectorCtx):
    """A strip of a scalable loop: lanes = N of <vscale x N x T>, base = first index, evl = active lanes (i32)."""
    evl: ir.Value | None = None


# -- which loops can be scalable -------------------------------------------------------------------------------------
_SCALABLE_UNARY = {"neg", "abs", "sqrt", "floor", "ceil", "round", "not", "sign"}
_SCALABLE_F32_UNARY = {"exp", "erf", "tanh", "sigmoid"}  # straight-line polynomials (kiln/codegen/mathfn.py)


def loop_is_scalable(body: list[Stmt]) -> bool:
    """Can this vector loop body be emitted on scalable vectors (no op that LLVM would have to scalarize)?"""

    def expr_ok(e: Expr) -> bool:
        for x in walk(e):
            if isinstance(x, (Dot4, Dot2, Mmla, MmlaRow)):  # NEON dot products / blocks: the tile stays 128-bit
                return False
            if isinstance(x, Un) and x.dtype in ("float32", "float64"):
                if x.op not in _SCALABLE_UNARY and not (x.op in _SCALABLE_F32_UNARY and x.dtype == "float32"):
                    return False
            if isinstance(x, Bin) and (x.op == "pow" or (x.op == "%" and x.dtype in ("float32", "float64"))):
                return False
        return True

    def stmts_ok(ss: list[Stmt]) -> bool:
        for s in ss:
            if isinstance(s, Loop):
                if not expr_ok(s.extent) or not stmts_ok(s.body):
                    return False
            elif isinstance(s, Store):
                if not expr_ok(s.value) or not all(expr_ok(i) for i in s.index):
                    return False
            elif isinstance(s, Local):
                if not expr_ok(s.init):
                    return False
            elif isinstance(s, Assign):
                if not expr_ok(s.value):
                    return False
            elif isinstance(s, If):
                if not expr_ok(s.cond) or not stmts_ok(s.body) or not stmts_ok(s.orelse):
                    return False
            else:  # Call / Alloc and anything newer: not inside a scalable loop
                return False
        return True
    return stmts_ok(body)


def reduce_is_scalable(s: Loop) -> bool:
    """A vector_reduce loop `$acc = op($acc, x)` (kernel.py's form) whose x can be scalable."""
    if len(s.body) != 1 or not isinstance(s.body[0], Assign) or not isinstance(s.body[0].value, Bin):
        return False
    upd = s.body[0]
    return (upd.value.op in ("+", "*", "max", "min") and upd.value.a == LocalRef(upd.name, upd.value.dtype)
            and upd.value.dtype in ("float32", "float64", "int64", "int32", "int8", "uint8")
            and loop_is_scalable(s.body))


def count_vector_loops(kernels: list[Kernel], scalable_target: bool = True,
                       sme_tile: Callable[[Loop, Callable[[str], tuple[int, ...]]], object] | None = None
                       ) -> dict[str, int]:
    """How the kernels' vector loops are emitted: {"scalable": n, "fixed": n} (on a scalable target, fixed =
    the fixed-length fallback; on a fixed-width target every vector loop is fixed); with `sme_tile` (an SME target:
    sme.match_sme_tile), also "sme": how many of the scalable ones are ZA outer-product tiles (kiln/codegen/sme.py)."""
    counts = {"scalable": 0, "fixed": 0, **({"sme": 0} if sme_tile is not None else {})}

    def go(k: Kernel, ss: list[Stmt], in_vec: bool) -> None:
        for s in ss:
            if isinstance(s, Loop):
                vec = not in_vec and ((s.kind == "vector" and s.lanes > 1) or s.kind == "vector_reduce")
                if vec:
                    ok = scalable_target and (loop_is_scalable(s.body) if s.kind == "vector"
                                              else reduce_is_scalable(s))
                    counts["scalable" if ok else "fixed"] += 1
                    if sme_tile is not None and ok and sme_tile(s, lambda buf, k=k: k.buffer(buf).shape) is not None:
                        counts["sme"] += 1
                go(k, s.body, in_vec or vec)
            else:
                for attr in ("body", "orelse"):
                    go(k, getattr(s, attr, None) or [], in_vec)
    for k in kernels:
        go(k, k.body, False)
    return counts


# -- emission ----------------------------------------------------------------------------------------------------------
def _pow2_floor(n: int) -> int:
    p = 1
    while p * 2 <= n:
        p *= 2
    return p


def emit_vector_loop(ke: NestEmitter, b: ir.IRBuilder, em: ScalableExprEmitter, s: Loop, lo: ir.Value,
                     hi: ir.Value, target: Target) -> None:
    """The strip-mined loop described in the module docstring (on an SME target, kernel.py first gives the tiles
    that fit to sme.py)."""
    n = _pow2_floor(target.scalable_count(s.lanes))

    def strip(i: ir.Value, evl: ir.Value) -> None:
        with _retyping(b):
            em.vec = ScalableCtx(s.var, n, i, evl=evl)
            try:
                ke.stmts(b, em, s.body)
            finally:
                em.vec = None
    strip_mined(b, em, lo, hi, n, strip)


def strip_mined(b: ir.IRBuilder, em: ScalableExprEmitter, lo: ir.Value, hi: ir.Value, n: int,
                body: Callable[[ir.Value, ir.Value], None]) -> None:
    """for (i = lo; i < hi; i += evl) { evl = get.vector.length(hi − i, n); body(i, evl) } — the last strip is
    simply shorter (no remainder loop)."""
    gvl = em._decl("llvm.experimental.get.vector.length.i64", I32, [I64, I32, I1])

    def strip(i: ir.Value) -> ir.Value:
        evl = b.call(gvl, [b.sub(hi, i), ir.Constant(I32, n), ir.Constant(I1, 1)])
        body(i, evl)
        return b.zext(evl, I64)
    emit_loop(b, lo, hi, strip, ("shead", "sbody", "sdone"))


def emit_vector_reduce(ke: NestEmitter, b: ir.IRBuilder, em: ScalableExprEmitter, s: Loop, lo: ir.Value,
                       hi: ir.Value, target: Target) -> None:
    """A `vector_reduce` loop `$acc = op($acc, x(r))` strip-mined like a vector loop into a scalable partial
    (lanes past evl take op's identity through vp.merge), then one `llvm.vector.reduce.*` into $acc:

        part = splat(identity)
        for (i = lo; i < hi; i += evl) { evl = get.vector.length(hi − i); part = op(part, merge(x(i + step), id)) }
        $acc = op($acc, reduce(part))"""
    (upd,) = s.body
    op = {"+": "sum", "*": "prod", "max": "max", "min": "min"}[upd.value.op]
    x, dtype = upd.value.b, upd.value.dtype
    n = _pow2_floor(target.scalable_count(s.lanes))
    vt = ScalableVectorType(SCALAR[dtype], n)
    ident = em.const(init_value(op, dtype))
    idents = ir.Constant(vt, [ident] * n)
    part = ke.entry_alloca(b, vt)
    b.store(idents, part)

    def strip(i: ir.Value, evl: ir.Value) -> None:
        with _retyping(b):
            em.vec = ScalableCtx(s.var, n, i, evl=evl)
            try:
                xv, is_vec = em.ev(x)
                xv = xv if is_vec else em.splat(xv)
                merge = em._decl(f"llvm.vp.merge.{em._vsuffix(SCALAR[dtype])}", vt, [em.svt(I1), vt, vt, I32])
                xv = b.call(merge, [em.all_true(), xv, idents, evl])
                b.store(em.combine(op, b.load(part, typ=vt), xv, dtype), part)
            finally:
                em.vec = None
    strip_mined(b, em, lo, hi, n, strip)
    with _retyping(b):
        total = _reduce_lanes(em, op, b.load(part, typ=vt), dtype, ident)
    ptr, _ = em.local_slot(upd.name, upd.slot)
    b.store(em.combine(op, b.load(ptr, typ=ptr.allocated_type), total, dtype), ptr)


def _reduce_lanes(em: ScalableExprEmitter, op: str, v: ir.Value, dtype: str, ident: ir.Value) -> ir.Value:
    """All lanes of a scalable vector to one scalar (sums in any order: `reassoc`; max/min propagate NaN)."""
    b, t = em.b, v.type.element
    sfx = f"nxv{v.type.count}{em._tname(t)}"
    if dtype in ("float32", "float64"):
        if op in ("sum", "prod"):
            fn = em._decl(f"llvm.vector.reduce.{'fadd' if op == 'sum' else 'fmul'}.{sfx}", t, [t, v.type])
            return b.call(fn, [ident, v], fastmath=("reassoc",))
        r = b.call(em._decl(f"llvm.vector.reduce.f{op}.{sfx}", t, [v.type]), [v])
        nan_lanes = b.fcmp_unordered("uno", v, v)
        m1 = ScalableVectorType(I1, v.type.count)
        any_nan = b.call(em._decl(f"llvm.vector.reduce.or.nxv{v.type.count}i1", I1, [m1]), [nan_lanes])
        return b.select(any_nan, ir.Constant(t, float("nan")), r)
    name = {"sum": "add", "prod": "mul", "max": "smax", "min": "smin"}[op]
    if dtype in ("uint8", "bool") and op in ("max", "min"):
        name = "u" + op
    return b.call(em._decl(f"llvm.vector.reduce.{name}.{sfx}", t, [v.type]), [v])


class ScalableExprEmitter(ExprEmitter):
    """ExprEmitter whose vector context may be a scalable strip (ScalableCtx); fixed contexts work as before."""

    @property
    def strip(self) -> ScalableCtx | None:
        return self.vec if isinstance(self.vec, ScalableCtx) else None

    def svt(self, t: ir.Type) -> ScalableVectorType:
        return ScalableVectorType(t, self.vec.lanes)

    def all_true(self) -> ir.Constant:
        n = self.vec.lanes
        return ir.Constant(ScalableVectorType(I1, n), [1] * n)

    def vtype(self, t: ir.Type) -> ir.Type:
        return self.svt(t) if self.strip else super().vtype(t)

    def splat(self, x: ir.Value, lanes: int | None = None) -> ir.Value:
        if not self.strip or (lanes is not None and lanes != self.vec.lanes):
            return super().splat(x, lanes)
        n = self.vec.lanes
        v = self.b.insert_element(ir.Constant(ScalableVectorType(x.type, n), ir.Undefined), x, ir.Constant(I32, 0))
        return self.b.shuffle_vector(v, ir.Constant(v.type, ir.Undefined),
                                     ir.Constant(ScalableVectorType(I32, n), [0] * n))

    def intrinsic(self, name: str, ty: ir.Type, args: list[ir.Value]) -> ir.Value:
        if not scalable(ty):
            return super().intrinsic(name, ty, args)
        full = f"{name}.nxv{ty.count}{self._tname(ty.element)}"
        return self.b.call(self._decl(full, ty, [ty] * len(args)), args)

    def _vsuffix(self, t: ir.Type) -> str:
        return f"nxv{self.vec.lanes}{self._tname(t)}"

    def ev(self, e: Expr) -> tuple[ir.Value, bool]:
        st = self.strip
        if st is not None and isinstance(e, Var) and e == st.var:
            vt = self.svt(I64)
            step = self.b.call(self._decl(f"llvm.stepvector.{self._vsuffix(I64)}", vt, []), [])
            return self.b.add(self.splat(st.base), step), True
        return super().ev(e)

    def libcall_scalarized(self, name: str, x: ir.Value, is_vec: bool) -> ir.Value:
        assert not (is_vec and scalable(x.type)), f"{name} on scalable vectors: loop_is_scalable must reject it"
        return super().libcall_scalarized(name, x, is_vec)

    # -- memory ------------------------------------------------------------------------------------------------------
    def _vp_load(self, p: ir.Value, mt: ir.Type, mask: ir.Value) -> ir.Value:
        vt = self.svt(mt)
        fn = self._decl(f"llvm.vp.load.{self._vsuffix(mt)}.p0", vt, [PTR, self.svt(I1), I32])
        return self.b.call(fn, [p, mask, self.strip.evl])

    def _fill_ints(self, val: ir.Value, mt: ir.Type, mask: ir.Value) -> ir.Value:
        """Integer lanes outside (mask, evl) read 1 (not poison): an integer divide by them must stay defined."""
        if not isinstance(mt, ir.IntType):
            return val
        one = ir.Constant(self.svt(mt), [1] * self.vec.lanes)
        fn = self._decl(f"llvm.vp.merge.{self._vsuffix(mt)}", val.type, [self.svt(I1), val.type, val.type, I32])
        return self.b.call(fn, [mask, val, one, self.strip.evl])

    def load(self, e: Load) -> tuple[ir.Value, bool]:
        st = self.strip
        if st is None:
            return super().load(e)
        assert self.bounds is None, "bounds-checked builds are host-only"
        ptr, dtype, flat = self.address(e.buf, e.index)
        c = coef(flat, st.var)
        if c == 0:
            return super().load(e)  # uniform: one scalar load, broadcast where used
        mt = MEMORY[dtype]
        if c == 1:
            p = self.element_ptr(ptr, flat, mt)
            val = self._fill_ints(self._vp_load(p, mt, self.all_true()), mt, self.all_true())
            return self._from_memory(val, dtype), True
        return self._from_memory(self._gather(ptr, flat, mt, self.all_true()), dtype), True

    def _gather(self, ptr: ir.Value, flat: Expr, mt: ir.Type, mask: ir.Value) -> ir.Value:
        """Strided (stride-2 convolutions, pooling) and irregular loads: one vp.gather."""
        idx, _ = self.ev(flat)
        ptrs = self.lane_pointers(ptr, idx, mt)
        vt = self.svt(mt)
        fn = self._decl(f"llvm.vp.gather.{self._vsuffix(mt)}.nxv{self.vec.lanes}p0", vt,
                        [self.svt(PTR), self.svt(I1), I32])
        val = self.b.call(fn, [ptrs, mask, self.strip.evl])
        return self._fill_ints(val, mt, mask)

    def guarded_load(self, e: Select) -> tuple[ir.Value, bool] | None:
        """The padding pattern (see ExprEmitter.guarded_load) as one vp.load under the condition's mask."""
        if self.strip is None:
            return super().guarded_load(e)
        access = self.guarded_access(e)
        if access is None:
            return None
        ptr, dtype, flat, mask = access
        mt = MEMORY[dtype]
        p = self.element_ptr(ptr, flat, mt)
        val = self._from_memory(self._vp_load(p, mt, mask), dtype)
        fill = self.splat(self.const(type(e.b)(e.b.value, dtype)))
        return self.b.select(mask, val, fill), True

    def store_vector(self, s_buf: str, index: tuple[Expr, ...], val: ir.Value, is_vec: bool) -> None:
        """A vector store (of a value already in memory form) inside a scalable strip: vp.store (unit stride)
        or vp.scatter."""
        ptr, dtype, shape = self.buffers[s_buf]
        flat = self.flat(index, shape)
        if not is_vec:
            val = self.splat(val)
        mt = MEMORY[dtype]
        c = coef(flat, self.vec.var)
        if c == 0:
            raise AssertionError("vectorized store to a uniform address: bad schedule")
        if c == 1:
            p = self.element_ptr(ptr, flat, mt)
            fn = self._decl(f"llvm.vp.store.{self._vsuffix(mt)}.p0", ir.VoidType(), [val.type, PTR, self.svt(I1), I32])
            self.b.call(fn, [val, p, self.all_true(), self.strip.evl])
            return
        idx, _ = self.ev(flat)
        ptrs = self.lane_pointers(ptr, idx, mt)
        fn = self._decl(f"llvm.vp.scatter.{self._vsuffix(mt)}.nxv{self.vec.lanes}p0", ir.VoidType(),
                        [val.type, self.svt(PTR), self.svt(I1), I32])
        self.b.call(fn, [val, ptrs, self.all_true(), self.strip.evl])
