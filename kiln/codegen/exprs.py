"""Emit kernel-IR expressions as LLVM IR, scalar or `lanes`-wide (the vectorizer).

Inside a vector loop over variable v every expression is either *uniform* (does not depend on v:
emitted once as a scalar) or *varying* (a vector of `lanes`). A load whose flat address moves by 1
with v becomes one vector load, a uniform one a scalar load broadcast on use, anything else a gather."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from llvmlite import ir

from kiln.codegen.access import (
    F32,
    F64,
    I1,
    I32,
    I64,
    MEMORY,
    SCALAR,
    MemoryAccess,
)
from kiln.codegen.bf16 import bf16_to_f32, f32_to_bf16, native_rounding
from kiln.codegen.bounds import BoundsChecker
from kiln.codegen.constants import poison, splat_constant, vector_constant
from kiln.codegen.dims import dims_value
from kiln.codegen.hoist import emitting_in, hoistable, value_key
from kiln.codegen.mathfn import VectorMath
from kiln.kernel.dot import Dot2, Dot4, LaneDot4, Mmla, MmlaRow
from kiln.kernel.ir import (
    Addr,
    Bin,
    Cast,
    Const,
    Expr,
    Load,
    LocalRef,
    Reduce,
    Select,
    Sym,
    Un,
    Var,
    children,
    hint,
    is_float,
    substitute,
)
from kiln.target import features_on

# the integer types a rounding convert (ExprEmitter.cast) produces through 32 bits (a clamp before it makes them fit)
_LRINT_TO = ("int32", "int8", "uint8")

_FCMP = {"<": "<", "<=": "<=", "==": "==", "!=": "!=", ">": ">", ">=": ">="}
_LIBM_UNARY = {"exp": "llvm.exp", "log": "llvm.log", "sqrt": "llvm.sqrt", "sin": "llvm.sin", "cos": "llvm.cos",
               "floor": "llvm.floor", "ceil": "llvm.ceil", "round": "llvm.roundeven", "tanh": "llvm.tanh",
               "abs": "llvm.fabs"}


def _const_is(e: Expr, value: float) -> bool:
    return isinstance(e, Const) and float(e.value) == value


@dataclass
class VectorCtx:
    var: Var
    lanes: int
    base: ir.Value               # i64 index of lane 0
    mask: ir.Value | None = None  # <lanes x i1> on a masked remainder iteration
    prefix: int | None = None    # the mask's count of leading true lanes, when known at compile time


class ExprEmitter(MemoryAccess):
    """Emits expressions for one function; `env` maps loop variables to i64 values."""

    def __init__(self, builder: ir.IRBuilder, module: ir.Module,
                 buffers: dict[str, tuple[ir.Value, str, tuple[int, ...]]],
                 locals_: dict[str, tuple[ir.Value, bool]]):
        self.b, self.m, self.buffers, self.locals = builder, module, buffers, locals_
        self.env: dict[str, ir.Value] = {}
        self.vec: VectorCtx | None = None
        self.bounds: BoundsChecker | None = None  # set in a bounds-checked (debug) build
        self.target = None  # the Target (kiln.target), where ISA-specific emission needs it (codegen/int8.py)
        self.preloaded: dict[Load, tuple[ir.Value, bool]] = {}  # loads already read (codegen/transpose.py)
        # pure expressions (no memory access) already emitted in the current block, by the values of their free
        # variables: an unrolled tile re-emits each row's index arithmetic otherwise (resnet18: 240k instructions)
        self._emitted: dict[tuple, tuple[ir.Value, bool]] = {}
        # the block whose values dominate a block's (an If's arms and the block after it: the block it branched
        # from), recorded by the statement emitter: a guarded row store reuses its tile's index arithmetic instead
        # of re-emitting it in a block of its own (a dynamic GEMM's 16 guarded rows per kernel)
        self.dominator: dict[ir.Block, ir.Block] = {}
        self._free: dict[Expr, tuple[str, ...] | None] = {}
        self._split: dict[tuple, tuple[Expr, tuple[tuple[str, int], ...]]] = {}
        self._loads: dict[tuple, tuple[ir.Value, bool]] = {}
        self._flats: dict[tuple, Expr] = {}
        self._hoisted: dict[tuple, tuple[ir.Value, bool]] = {}
        self._bound: dict[str, tuple[ir.Value, int, ir.Block]] = {}  # loop variable → (value, binding no., block)
        self._binds = 0

    # -- helpers -------------------------------------------------------------------------------------------------
    def vtype(self, t: ir.Type) -> ir.Type:
        return ir.VectorType(t, self.vec.lanes) if self.vec else t

    def splat(self, x: ir.Value, lanes: int | None = None) -> ir.Value:
        n = lanes or self.vec.lanes
        if isinstance(x, ir.Constant) and not isinstance(x.constant, (list, tuple)):
            return vector_constant(x.type, (x.constant,) * n)  # a constant vector, not two instructions per use
        # `poison` / `zeroinitializer` spelled as such: llvmlite writes a vector constant out lane by lane, and the
        # IR text (15 MB for resnet50) is what both Kiln's printer and LLVM's parser spend their time on
        undef = poison(ir.VectorType(x.type, n))
        v = self.b.insert_element(undef, x, ir.Constant(I32, 0))
        return self.b.shuffle_vector(v, undef, vector_constant(I32, (0,) * n))

    def both(self, x: tuple[ir.Value, bool], y: tuple[ir.Value, bool]) -> tuple[ir.Value, ir.Value, bool]:
        if x[1] == y[1]:
            return x[0], y[0], x[1]
        return (x[0] if x[1] else self.splat(x[0])), (y[0] if y[1] else self.splat(y[0])), True

    def intrinsic(self, name: str, ty: ir.Type, args: list[ir.Value]) -> ir.Value:
        suffix = f"v{ty.count}{self._tname(ty.element)}" if isinstance(ty, ir.VectorType) else self._tname(ty)
        full = f"{name}.{suffix}"
        fn = self.m.globals.get(full) or ir.Function(self.m, ir.FunctionType(ty, [ty] * len(args)), full)
        return self.b.call(fn, args)

    @staticmethod
    def _tname(t: ir.Type) -> str:
        return "f32" if t == F32 else "f64" if t == F64 else str(t)

    def libcall_scalarized(self, name: str, x: ir.Value, is_vec: bool) -> ir.Value:
        """A libm function with no LLVM intrinsic (erf): call it per lane."""
        elt = x.type.element if is_vec else x.type
        sym = name + ("f" if elt == F32 else "")
        fn = self.m.globals.get(sym) or ir.Function(self.m, ir.FunctionType(elt, [elt]), sym)
        if not is_vec:
            return self.b.call(fn, [x])
        out = ir.Constant(x.type, ir.Undefined)
        for i in range(x.type.count):
            lane = self.b.call(fn, [self.b.extract_element(x, ir.Constant(I32, i))])
            out = self.b.insert_element(out, lane, ir.Constant(I32, i))
        return out

    # -- the evaluator ------------------------------------------------------------------------------------------------
    def free_vars(self, e: Expr) -> tuple[str, ...] | None:
        """The loop variables of a pure expression (no loads, locals or addresses), or None if it is not pure."""
        if e not in self._free:
            kids = children(e)
            if isinstance(e, (Load, LocalRef, Addr, Reduce)):
                self._free[e] = None
            elif isinstance(e, Var):
                self._free[e] = (e.name,)
            else:
                sub = [self.free_vars(k) for k in kids]
                self._free[e] = None if any(x is None for x in sub) else tuple(sorted({v for x in sub for v in x}))
        return self._free[e]

    def forget_loads(self) -> None:
        """A store or a call may have changed memory: loads emitted so far cannot be reused."""
        self._loads.clear()

    def ev(self, e: Expr) -> tuple[ir.Value, bool]:
        if isinstance(e, Load) and self.bounds is None and e not in self.preloaded:
            # a load already emitted in this block at the same address (an unrolled tile reads its B vector once
            # per row otherwise) — until the next store or call (forget_loads)
            sub = [self.free_vars(i) for i in e.index]
            if all(x is not None for x in sub):
                names = {n for x in sub for n in x}
                vec = self.vec
                key = (e, self.b.block, tuple(value_key(self.env.get(n)) for n in sorted(names)),
                       (vec.var, vec.lanes, value_key(vec.base), vec.mask)
                       if vec is not None and vec.var.name in names else None)
                hit = self._loads.get(key)
                if hit is None:
                    hit = self._loads[key] = self._ev(e)
                return hit
        # integer arithmetic of the symbolic dims alone: once per function, in its entry block; a division or
        # modulo of loop variables (a tile index's decode): once, where its variables are bound — not the other
        # arithmetic, whose values would then stay live across the loops below (a tile's row addresses: spills)
        if isinstance(e, Sym) or isinstance(e, (Bin, Un, Cast, Select)) and hoistable(e):
            names = self.free_vars(e)
            if names == () or isinstance(e, Bin) and e.op in ("//", "%") and names is not None \
                    and (self.vec is None or self.vec.var.name not in names):
                home = self.home_block(names)
                if home is not None:
                    return self.hoisted(e, names, home)
        if isinstance(e, (Bin, Un, Cast, Select)):
            names = self.free_vars(e)
            if names is not None:
                vec = self.vec
                lanes = (vec.var, vec.lanes, value_key(vec.base)) if vec is not None and vec.var.name in names else None
                rest = (tuple(value_key(self.env.get(n)) for n in names), lanes)
                hit = self.emitted((e,), rest)
                if hit is None:
                    hit = self._emitted[(e, self.b.block, *rest)] = self._ev(e)
                return hit
        return self._ev(e)

    def emitted(self, head: tuple, rest: tuple) -> Any:
        """The value cached under (*head, block, *rest) for the current block or a block dominating it, or None."""
        block: ir.Block | None = self.b.block
        while block is not None:
            hit = self._emitted.get((*head, block, *rest))
            if hit is not None:
                return hit
            block = self.dominator.get(block)
        return None

    def bind_loop_var(self, name: str, i: ir.Value) -> None:
        """Loop variable `name` is `i` from the current block on (the loop body's first block)."""
        self.env[name] = i
        self._binds += 1  # (inner loops are bound later: the latest binding among live variables is the innermost)
        self._bound[name] = (i, self._binds, self.b.block)

    def home_block(self, names: tuple[str, ...]) -> ir.Block | None:
        """The block where integer arithmetic of `names` is first computable: the body's first block of the
        innermost loop among them (the function's entry if they are all constants — unrolled — or none), or None
        where a variable was bound some other way (a vector lane, a scalable loop)."""
        home, depth = self.b.function.entry_basic_block, -1
        for n in names:
            v = self.env.get(n)
            if isinstance(v, ir.Constant):
                continue
            bound = self._bound.get(n)
            if bound is None or bound[0] is not v:
                return None
            if bound[1] > depth:
                home, depth = bound[2], bound[1]
        return home

    def hoisted(self, e: Expr, names: tuple[str, ...], home: ir.Block) -> tuple[ir.Value, bool]:
        """Integer index arithmetic emitted once, in the block where its variables are all bound, instead of in
        every block that uses it: a run-time-rows tile's guarded row stores each re-emitted the tile's decode (the
        tile index divided by run-time tile counts) in a block of its own. LLVM merged them in the end, after every
        pass had worked through them (one gpt_decoder kernel at symbolic seq: 505 divisions and remainders in its IR,
        49 now; 3841 → 2579 lines)."""
        key = (e, home, tuple(value_key(self.env.get(n)) for n in names))
        hit = self._hoisted.get(key)
        if hit is None:
            if self.b.block is home:
                hit = self._hoisted[key] = self._ev(e)
            else:
                with emitting_in(self.b, home):
                    hit = self._hoisted[key] = self._ev(e)
        return hit

    def _ev(self, e: Expr) -> tuple[ir.Value, bool]:
        if isinstance(e, Const):
            return self.const(e), False
        if isinstance(e, Var):
            if self.vec and e == self.vec.var:
                n = self.vec.lanes
                return self.b.add(self.splat(self.vec.base), vector_constant(I64, tuple(range(n)))), True
            return self.env[e.name], False
        if isinstance(e, Sym):
            return dims_value(self.b, self.m, e.index), False
        if isinstance(e, LocalRef):
            ptr, vec = self.local_slot(e.name, e.slot)
            return self.b.load(ptr, typ=ptr.allocated_type), vec
        if isinstance(e, Load):
            return self.preloaded[e] if e in self.preloaded else self.load(e)
        if isinstance(e, Bin):
            return self.binary(e)
        if isinstance(e, Un):
            return self.unary(e)
        if isinstance(e, Select):
            guarded = self.guarded_load(e)
            if guarded is not None:
                return guarded
            c, cv = self.ev(e.cond)
            a, b, v = self.both(self.ev(e.a), self.ev(e.b))
            if v and not cv:
                return self.b.select(c, a, b), True
            if cv and not v:
                a, b = self.splat(a), self.splat(b)
            return self.b.select(c, a, b), v or cv
        if isinstance(e, Cast):
            return self.cast(e)
        if isinstance(e, Addr):
            assert self.vec is None, "an address is a scalar (a Call argument), not a vector lane"
            ptr, dtype, flat = self.address(e.buf, e.index)
            return self.b.gep(ptr, [self.index(flat)], source_etype=MEMORY[dtype]), False
        if isinstance(e, Dot4):  # 8-bit dot products, per ISA (codegen/int8.py)
            from kiln.codegen.int8 import emit_dot4
            return emit_dot4(self, e)
        if isinstance(e, LaneDot4):  # per-lane 8-bit dot products: an int8 depthwise conv's taps (codegen/int8.py)
            from kiln.codegen.int8 import emit_lane_dot4
            return emit_lane_dot4(self, e)
        if isinstance(e, Dot2) and e.dtype == "int32":  # 8-bit × int16 pairs: pmaddwd (codegen/int8.py)
            from kiln.codegen.int8 import emit_word_dot2
            return emit_word_dot2(self, e)
        if isinstance(e, Dot2):  # bf16 pair dot products: vdpbf16ps (codegen/dpbf16.py)
            from kiln.codegen.dpbf16 import emit_dot2
            return emit_dot2(self, e)
        if isinstance(e, (Mmla, MmlaRow)):  # 2×2-block matrix multiply-accumulates: SMMLA / BFMMLA (codegen/mmla.py)
            from kiln.codegen.mmla import emit_mmla, emit_mmla_row
            return emit_mmla(self, e) if isinstance(e, Mmla) else emit_mmla_row(self, e)
        if isinstance(e, Reduce):
            raise AssertionError("Reduce must be hoisted before codegen")
        raise TypeError(f"cannot emit {type(e).__name__}")

    def local_slot(self, name: str, slot: Expr | None) -> tuple[ir.Value, bool]:
        """The alloca of a local, or of one accumulator of a register tile (slot: constant once unrolled)."""
        ptrs, vec = self.locals[name]
        if slot is None:
            return ptrs[0], vec
        if isinstance(slot, (Var, Const)):
            i = self.ev(slot)[0]
            if isinstance(i, ir.Constant):
                return ptrs[int(i.constant)], vec
        else:  # arithmetic of unrolled loop variables (a split reduction's ru·rows + mi): folded here
            values = {n: self.env.get(n) for n in self.free_vars(slot) or ()}
            if values and all(isinstance(v, ir.Constant) for v in values.values()):
                return ptrs[hint(substitute(slot, {Var(n): Const(int(v.constant), "int64")
                                                   for n, v in values.items()}))], vec
        raise AssertionError(f"register-tile slot of ${name} is not constant: unroll its loop")

    def const(self, e: Const) -> ir.Value:
        t = SCALAR[e.dtype]
        if is_float(e.dtype):
            return ir.Constant(t, float(e.value))
        if e.dtype == "bool":
            return ir.Constant(I1, int(bool(e.value)))
        info = np.iinfo(e.dtype)
        v = int(e.value) if np.isfinite(float(e.value)) else (info.max if e.value > 0 else info.min)
        return ir.Constant(t, v)

    def mul_add(self, prod: Bin, c: Callable[[], tuple[ir.Value, bool]]) -> tuple[ir.Value, bool]:
        """prod.a · prod.b + c() as one fused multiply-add (llvm.fmuladd: FMA where it exists), vector if any is;
        c() is emitted after the product's operands."""
        x, y, v1 = self.both(self.ev(prod.a), self.ev(prod.b))
        _, c_val, vec = self.both((x, v1), c())
        if vec and not v1:
            x, y = self.splat(x), self.splat(y)
        return self.intrinsic("llvm.fmuladd", c_val.type, [x, y, c_val]), vec

    def binary(self, e: Bin) -> tuple[ir.Value, bool]:
        if e.op == "+" and is_float(e.dtype):  # a*b + c → one fused multiply-add
            for prod, other in ((e.a, e.b), (e.b, e.a)):
                if isinstance(prod, Bin) and prod.op == "*":
                    return self.mul_add(prod, lambda other=other: self.ev(other))
        a, b, vec = self.both(self.ev(e.a), self.ev(e.b))
        dt, fl, op = e.a.dtype, is_float(e.a.dtype), e.op
        B = self.b
        if op in _FCMP:
            return (B.fcmp_ordered(op, a, b) if op != "!=" else B.fcmp_unordered(op, a, b)) if fl else \
                self.icmp(op, a, b, dt), vec
        if op in ("max", "min"):
            pick = ">" if op == "max" else "<"
            if fl and isinstance(e.b, Const) and not np.isnan(e.b.value):
                # a constant bound (ReLU, Clip): select(c > a, c, a) is NaN-propagating as it is — a NaN fails
                # the compare and is picked — and one vmaxps/vminps instead of compare, NaN test, or, blend
                return B.select(B.fcmp_ordered(pick, b, a), b, a), vec
            c = B.fcmp_ordered(pick, a, b) if fl else self.icmp(pick, a, b, dt)
            if fl:  # propagate NaN like numpy: if a is NaN pick a
                c = B.or_(c, B.fcmp_unordered("uno", a, a))
            return B.select(c, a, b), vec
        if op == "pow":
            return self.intrinsic("llvm.pow", a.type, [a, b]), vec
        if op in ("and", "or", "xor"):
            return getattr(B, op + ("_" if op in ("and", "or") else ""))(a, b), vec
        table = {"+": ("fadd", "add"), "-": ("fsub", "sub"), "*": ("fmul", "mul"), "/": ("fdiv", "sdiv"),
                 "//": ("fdiv", "sdiv"), "%": ("frem", "srem")}
        fop, iop = table[op]
        if not fl and dt == "uint8":
            iop = {"sdiv": "udiv", "srem": "urem"}.get(iop, iop)
        r = getattr(B, fop if fl else iop)(a, b)
        if fl and op == "//":
            r = self.intrinsic("llvm.floor", r.type, [r])
        return r, vec

    def unary(self, e: Un) -> tuple[ir.Value, bool]:
        x, vec = self.ev(e.a)
        B, op = self.b, e.op
        if not is_float(e.a.dtype):
            if op == "neg":
                return B.neg(x), vec
            if op == "not":
                return B.not_(x), vec
            if op == "abs":
                return B.select(B.icmp_signed("<", x, ir.Constant(x.type, None)), B.neg(x), x), vec
            if op in ("floor", "ceil", "round"):
                return x, vec
            raise TypeError(f"{op} on {e.a.dtype}")
        if op == "neg":
            return B.fneg(x), vec
        if vec and x.type.element == F32 and op in ("exp", "log", "erf", "tanh", "sigmoid"):
            scalef = self.target is not None and "avx512f" in features_on(self.target.features)
            return getattr(VectorMath(B, self.intrinsic, self._decl, scalef), op)(x), vec
        if op == "sigmoid":
            one = self._fconst(x.type, 1.0)
            return B.fdiv(one, B.fadd(one, self.intrinsic("llvm.exp", x.type, [B.fneg(x)]))), vec
        if op == "erf":
            return self.libcall_scalarized("erf", x, vec), vec
        return self.intrinsic(_LIBM_UNARY[op], x.type, [x]), vec

    def icmp(self, op: str, a: ir.Value, b: ir.Value, dtype: str) -> ir.Value:
        """Integer compare: bool (i1) and uint8 unsigned — signed i1 would order True (−1) below False."""
        if dtype in ("bool", "uint8"):
            return self.b.icmp_unsigned(op, a, b)
        return self.b.icmp_signed(op, a, b)

    def combine(self, op: str, a: ir.Value, b: ir.Value, dtype: str) -> ir.Value:
        """One reduction step on same-shaped values (the semantics of kiln.schedule.primitives.combine)."""
        B, fl = self.b, is_float(dtype)
        if op == "sum":
            return B.fadd(a, b) if fl else B.add(a, b)
        if op == "prod":
            return B.fmul(a, b) if fl else B.mul(a, b)
        pick = ">" if op == "max" else "<"
        c = B.fcmp_ordered(pick, a, b) if fl else self.icmp(pick, a, b, dtype)
        if fl:
            c = B.or_(c, B.fcmp_unordered("uno", a, a))
        return B.select(c, a, b)

    def horizontal(self, op: str, v: ir.Value, dtype: str) -> ir.Value:
        """Reduce a vector's lanes to a scalar (pairwise halving: log2(lanes) vector steps)."""
        n = v.type.count
        while n > 1:
            h = n // 2
            lo = self.b.shuffle_vector(v, v, ir.Constant(ir.VectorType(I32, h), list(range(h))))
            hi = self.b.shuffle_vector(v, v, ir.Constant(ir.VectorType(I32, h), list(range(h, n))))
            v, n = self.combine(op, lo, hi, dtype), h
        return self.b.extract_element(v, ir.Constant(I32, 0))

    def _fconst(self, t: ir.Type, v: float) -> ir.Value:
        if isinstance(t, ir.VectorType):
            return splat_constant(t, v)
        return ir.Constant(t, v)

    def _rounding_convert(self, e: Cast) -> bool:
        """int(round(x)) of float32 on x86: one cvtps2dq (llvm.lrint, round-half-even in the default rounding
        mode) instead of vrndscaleps + vcvttps2dq — one of the eight operations per vector of an int8 epilogue."""
        a = e.a
        return isinstance(a, Un) and a.op == "round" and a.a.dtype == "float32" and e.dtype in _LRINT_TO and \
            getattr(self.target, "arch", None) == "x86_64"

    def _saturating_u8(self, e: Cast) -> tuple[Expr, int] | None:
        """A requantizing epilogue's uint8(clamp(round(y) + zp, 0, 255)) — or uint8(round(clamp(y, 0, 255))), `/ 1.0`
        after the clamp — on AVX-512: (y, zp) for `cast` to emit as lrint(max(y, −zp)) + zp (cvtps2dq: past
        int32's range 0x80000000, above 255 unsigned as the value it stands for) and a truncation with unsigned
        saturation (vpmovusdb): five operations per vector where the float clamp took seven (a round, an add and a
        min fewer). A NaN (a NaN scale) becomes 255 here, 0 through the float clamp. None where the form does not
        hold."""
        if e.dtype != "uint8" or self.target is None or self.target.arch != "x86_64" or \
                "avx512f" not in features_on(self.target.features):
            return None
        x, rounded = e.a, False
        if isinstance(x, Un) and x.op == "round" and x.a.dtype == "float32":
            x, rounded = x.a, True
            if isinstance(x, Bin) and x.op == "/" and isinstance(x.b, Const) and x.b.value == 1.0:
                x = x.a
        if not (isinstance(x, Bin) and x.op == "min" and _const_is(x.b, 255.0) and isinstance(x.a, Bin) and
                x.a.op == "max" and _const_is(x.a.b, 0.0) and x.a.dtype == "float32"):
            return None
        y, zp = x.a.a, 0
        if rounded:
            return y, 0
        if isinstance(y, Bin) and y.op == "+" and isinstance(y.b, Const) and float(y.b.value).is_integer() and \
                0 <= y.b.value <= 255:
            y, zp = y.a, int(y.b.value)
        return (y.a, zp) if isinstance(y, Un) and y.op == "round" and y.a.dtype == "float32" else None

    def _lrint(self, x: ir.Value, vec: bool) -> ir.Value:
        """float32 → int32 rounding half to even in the default mode: `llvm.lrint`, one cvtps2dq on x86."""
        i32 = ir.VectorType(ir.IntType(32), x.type.count) if vec else ir.IntType(32)
        lanes = f"v{x.type.count}" if vec else ""
        name = f"llvm.lrint.{lanes}i32.{lanes}f32"
        fn = self.m.globals.get(name) or ir.Function(self.m, ir.FunctionType(i32, [x.type]), name)
        return self.b.call(fn, [x])

    def cast(self, e: Cast) -> tuple[ir.Value, bool]:
        saturating = self._saturating_u8(e)
        if saturating is not None:
            y, zp = saturating
            x, vec = self.ev(Bin("max", y, Const(float(-zp))))
            r = self._lrint(x, vec)

            def const(v: int) -> ir.Constant:
                return splat_constant(r.type, v) if vec else ir.Constant(r.type, v)

            if zp:
                r = self.b.add(r, const(zp))
            top = const(255)
            r = self.b.select(self.b.icmp_unsigned("<", r, top), r, top)
            u8 = ir.IntType(8)
            return self.b.trunc(r, ir.VectorType(u8, x.type.count) if vec else u8), vec
        if self._rounding_convert(e):
            x, vec = self.ev(e.a.a)  # type: ignore[attr-defined]  (e.a is the round: _rounding_convert)
            r = self._lrint(x, vec)
            to = SCALAR[e.dtype]
            return (r if to.width == 32 else self.b.trunc(r, ir.VectorType(to, x.type.count) if vec else to)), vec
        x, vec = self.ev(e.a)
        src, dst = e.a.dtype, e.dtype
        st, dt = SCALAR[src], SCALAR[dst]
        to = ir.VectorType(dt, x.type.count) if vec else dt
        B = self.b
        if src == dst or (src == "bfloat16" and dst == "float32"):  # a bf16 value is already exact in float32
            return x, vec
        if dst == "bfloat16":  # round to bf16 (the value stays a float32 in registers)
            x = B.fptrunc(x, ir.VectorType(F32, x.type.count) if vec else F32) if src == "float64" else \
                x if is_float(src) else self.cast(Cast("float32", e.a))[0]
            return bf16_to_f32(B, f32_to_bf16(B, x, native_rounding(self.target))), vec
        if is_float(src) and is_float(dst):
            return (B.fpext(x, to) if dst == "float64" else B.fptrunc(x, to)), vec
        if is_float(src):
            if dst == "bool":
                return B.fcmp_unordered("!=", x, self._fconst(x.type, 0.0)), vec
            target = getattr(self, "target", None)
            if dt.width < 32 and vec and target is not None and target.arch == "riscv64":
                # at 32 bits, then narrowed as integers: qemu 7.2 (the cross tests' emulator) asserts in its decoder
                # on RVV's narrowing float→int converts (vfncvt.rtz…w, qemu issue #1441); same cost on hardware
                return B.trunc(B.fptosi(x, ir.VectorType(ir.IntType(32), x.type.count)), to), vec
            return (B.fptoui(x, to) if dst == "uint8" else B.fptosi(x, to)), vec
        if is_float(dst):
            return (B.uitofp(x, to) if src in ("bool", "uint8") else B.sitofp(x, to)), vec
        if dst == "bool":
            return B.icmp_signed("!=", x, ir.Constant(x.type, None)), vec
        if dt.width > st.width:
            return (B.zext(x, to) if src in ("bool", "uint8") else B.sext(x, to)), vec
        if dt.width < st.width:
            return B.trunc(x, to), vec
        return x, vec
