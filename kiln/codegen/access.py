"""Memory access for the expression emitter (codegen/exprs.py): the element types in registers and in memory, and
how a load is emitted inside a vector loop over v, by the coefficient c of v in its flat address —

    c = 0   uniform: one scalar load (broadcast where a vector meets it)
    c = 1   one vector load, masked on a remainder iteration or when the bounds-checked build drops lanes
    c = 2…4 one masked contiguous load of c·(n−1)+1 elements and a shuffle keeping every c-th (strided_load)
    else    a masked gather over per-lane pointers
    select(in range, X[clamp(i)], pad)  →  one masked load at the unclamped index (guarded_load)

Addresses are split into a base emitted once per block and a constant offset from the unrolled loop variables
(index_parts, element_ptr): an unrolled tile's rows are one gep each."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from llvmlite import ir

from kiln.codegen.bf16 import bf16_bits_const, bf16_to_f32, f32_to_bf16, native_rounding
from kiln.codegen.constants import vector_constant
from kiln.codegen.hoist import value_key
from kiln.kernel.analysis import coef, flat_index, unclamped_index
from kiln.kernel.ir import Const, Expr, Load, Select, Var, substitute

I1, I8, I16, I32, I64 = ir.IntType(1), ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.IntType(64)
F32, F64 = ir.FloatType(), ir.DoubleType()
PTR = ir.PointerType()

SCALAR: dict[str, ir.Type] = {"float32": F32, "float64": F64, "int64": I64, "int32": I32, "int16": I16, "int8": I8,
                              "uint8": I8,
                              "bool": I1, "bfloat16": F32}
# bool is one byte in memory, as in numpy; bfloat16 is the upper half of a float32 (values are float32 in registers:
# widened exactly on load, rounded to nearest even on store — codegen/bf16.py)
MEMORY: dict[str, ir.Type] = {**SCALAR, "bool": I8, "bfloat16": I16}


def elem_bytes(mt: ir.Type) -> int:
    """Bytes of one element in memory (also the alignment Kiln assumes: numpy buffers are not vector-aligned)."""
    return max(1, mt.width // 8) if isinstance(mt, ir.IntType) else (4 if mt == F32 else 8)


def fill_value(vt: ir.VectorType, dtype: str) -> ir.Constant:
    """What masked-off lanes of a load read: 1 for integers (an integer divide by them must not trap), else 0."""
    return ir.Constant(vt, [1] * vt.count) if dtype not in ("float32", "float64", "bfloat16") \
        and isinstance(vt.element, ir.IntType) else ir.Constant(vt, None)



class MemoryAccess:
    """Loads, addresses and memory forms of values; mixed into ExprEmitter, which provides the builder `b`, the
    module `m`, `buffers`, `env`, `vec`, `bounds`, `target`, and `ev`, `splat`, `const`, `emitted`, `free_vars`,
    `_tname` and the caches `_flats`, `_split`, `_emitted`."""

    def address(self, buf: str, index: tuple[Expr, ...]) -> tuple[ir.Value, str, Expr]:
        ptr, dtype, shape = self.buffers[buf]
        return ptr, dtype, self.flat(index, shape)

    def flat(self, index: tuple[Expr, ...], shape: tuple[int, ...]) -> Expr:
        """flat_index, one expression object per distinct access: an unrolled tile linearizes the same index
        once per row otherwise, and each fresh tree is hashed in full by the caches it is looked up in."""
        key = (index, shape)
        hit = self._flats.get(key)
        if hit is None:
            hit = self._flats[key] = flat_index(index, shape)
        return hit

    def load(self, e: Load) -> tuple[ir.Value, bool]:
        ptr, dtype, flat = self.address(e.buf, e.index)
        mt = MEMORY[dtype]
        align = elem_bytes(mt)
        c = coef(flat, self.vec.var) if self.vec else 0
        if c == 0:
            if self.bounds:  # uniform: a scalar even inside a vector loop
                val = self.bounds.scalar_load(ptr, self.index(flat), mt, align)
            else:
                val = self.b.load(self.element_ptr(ptr, flat, mt), typ=mt, align=align)
            return self._from_memory(val, dtype), False
        n = self.vec.lanes
        vt = ir.VectorType(mt, n)
        mask = self.vec.mask
        fill = fill_value(vt, dtype)
        if c == 1:
            p = self.element_ptr(ptr, flat, mt)
            if self.bounds:  # drop out-of-bounds lanes: the load becomes a masked one
                mask = self.bounds.lanes(ptr, self.bounds.progression(self._at_base(flat), 1, n), mask)
            if mask is None:
                val = self.b.load(p, typ=vt, align=align)
            else:
                fn = self._decl(f"llvm.masked.load.v{n}{self._tname(mt)}.p0", vt, [PTR, I32, ir.VectorType(I1, n), vt])
                val = self.b.call(fn, [p, ir.Constant(I32, align), mask, fill])
            return self._from_memory(val, dtype), True
        if c in (2, 3, 4) and n * c <= 64:
            return self._from_memory(self.strided_load(ptr, flat, c, mt, align, dtype), dtype), True
        idx, _ = self.ev(flat)
        ptrs = self.lane_pointers(ptr, idx, mt)
        if self.bounds:
            mask = self.bounds.lanes(ptr, idx, mask)
        fn = self._decl(f"llvm.masked.gather.v{n}{self._tname(mt)}.v{n}p0", vt,
                        [ir.VectorType(PTR, n), I32, ir.VectorType(I1, n), vt])
        all_on = vector_constant(I1, (1,) * n)
        val = self.b.call(fn, [ptrs, ir.Constant(I32, align), mask if mask is not None else all_on, fill])
        return self._from_memory(val, dtype), True

    def strided_load(self, ptr: ir.Value, flat: Expr, c: int, mt: ir.Type, align: int,
                     dtype: str = "float32") -> ir.Value:
        """Lanes c elements apart (stride-2 convolutions and pooling): one masked contiguous load of
        c·(n−1)+1 elements and a shuffle that keeps every c-th, instead of a gather."""
        n, B = self.vec.lanes, self.b
        wide = ir.VectorType(mt, n * c)
        mw = ir.VectorType(I1, n * c)
        need = [1 if j <= c * (n - 1) else 0 for j in range(n * c)]  # never touch past the last lane's element
        mask: ir.Value = ir.Constant(mw, need)
        if self.vec.mask is not None:
            # wide lane j is live if narrow lane ⌈j/c⌉ is: lane j//c's own element (j % c == 0), or one between
            # two live lanes — never one past the last live lane, which can be past the buffer's end
            # (a masked stride-2 tail on the last row; found by the bounds-checked build)
            spread = B.shuffle_vector(self.vec.mask, self.vec.mask,
                                      ir.Constant(ir.VectorType(I32, n * c),
                                                  [min(-(-j // c), n - 1) for j in range(n * c)]))
            mask = B.and_(mask, spread)
        fill = fill_value(wide, dtype)
        p = self.element_ptr(ptr, flat, mt)
        if self.bounds:  # every element the wide load touches, not only the kept ones
            mask = self.bounds.lanes(ptr, self.bounds.progression(self._at_base(flat), 1, n * c), mask)
        fn = self._decl(f"llvm.masked.load.v{n * c}{self._tname(mt)}.p0", wide, [PTR, I32, mw, wide])
        val = B.call(fn, [p, ir.Constant(I32, align), mask, fill])
        return B.shuffle_vector(val, val, ir.Constant(ir.VectorType(I32, n), [j * c for j in range(n)]))

    def guarded_load(self, e: Select) -> tuple[ir.Value, bool] | None:
        """select(lo ≤ i ≤ hi ∧ …, X[…, clamp(i, lo, hi), …], c) — how padding reads its source — as one
        masked load of X at the unclamped, affine index, with c in the masked-off lanes.

        Valid because the condition holds exactly where the clamp is the identity (checked syntactically:
        every clamp's two bounds tests must be conjuncts of the condition)."""
        access = self.guarded_access(e)
        if access is None:
            return None
        ptr, dtype, flat, mask = access
        n = self.vec.lanes
        if self.vec.mask is not None:
            mask = self.b.and_(mask, self.vec.mask)
        mt = MEMORY[dtype]
        vt = ir.VectorType(mt, n)
        p = self.element_ptr(ptr, flat, mt)
        fn = self._decl(f"llvm.masked.load.v{n}{self._tname(mt)}.p0", vt, [PTR, I32, ir.VectorType(I1, n), vt])
        fill = self.splat(self.const(Const(e.b.value, dtype)))
        if dtype == "bfloat16":  # the fill in memory form; the loaded lanes widened after
            fill = self.splat(bf16_bits_const(float(e.b.value)))
        if self.bounds:
            mask = self.bounds.lanes(ptr, self.bounds.progression(self._at_base(flat), 1, n), mask)
        align = elem_bytes(mt)
        return self._from_memory(self.b.call(fn, [p, ir.Constant(I32, align), mask, fill]), dtype), True

    def guarded_access(self, e: Select) -> tuple[ir.Value, str, Expr, ir.Value] | None:
        """(buffer pointer, dtype, flat index, lane mask) when `e` is the padding pattern of guarded_load with a
        unit-stride (non-bool) source inside a vector loop, else None; the mask is the condition, per lane."""
        index = unclamped_index(e) if self.vec is not None else None
        if index is None:
            return None
        ptr, dtype, flat = self.address(e.a.buf, index)
        if coef(flat, self.vec.var) != 1 or dtype == "bool":
            return None
        cond, cv = self.ev(e.cond)
        return ptr, dtype, flat, cond if cv else self.splat(cond)

    def _decl(self, name: str, ret: ir.Type, args: list[ir.Type]) -> ir.Function:
        return self.m.globals.get(name) or ir.Function(self.m, ir.FunctionType(ret, args), name)

    def lane_pointers(self, ptr: ir.Value, idx: ir.Value, mt: ir.Type) -> ir.Value:
        """<n x ptr> = ptr + idx * sizeof(elem) (llvmlite's gep cannot type a vector-of-pointers result)."""
        n = idx.type.count
        size = elem_bytes(mt)
        base = self.splat(self.b.ptrtoint(ptr, I64))
        addr = self.b.add(base, self.b.mul(idx, vector_constant(I64, (size,) * n)))
        return self.b.inttoptr(addr, ir.VectorType(PTR, n))

    def _uniform(self, e: Expr) -> tuple[ir.Value, bool]:
        v, is_vec = self.ev(e)
        assert not is_vec
        return v, False

    def _at_base(self, flat: Expr) -> ir.Value:
        """The scalar value of `flat` at lane 0."""
        return self._lane0(self.index, flat)

    def _lane0(self, f: Callable[[Expr], Any], flat: Expr) -> Any:
        """f(flat) with the vector loop's variable bound to its lane-0 value."""
        if self.vec is None:
            return f(flat)
        saved, self.vec = self.vec, None
        self.env[saved.var.name] = saved.base
        try:
            return f(flat)
        finally:
            del self.env[saved.var.name]
            self.vec = saved

    def index_parts(self, flat: Expr) -> tuple[ir.Value, int]:
        """A flat index as (base value, constant offset): its part affine in unrolled loop variables (bound to
        constants) is the offset, the base is emitted once per block — a 14-row tile's row r reads base + r·32,
        not its own copy of the whole index arithmetic (resnet50: 27k adds in the IR before this)."""
        base, coefs = self.affine_split(flat)
        return self.ev(base)[0], sum(c * self.env[name].constant for name, c in coefs)

    def index(self, flat: Expr) -> ir.Value:
        """The scalar i64 value of a flat index (lane 0's inside a vector loop: `_at_base`)."""
        v, off = self.index_parts(flat)
        return self.b.add(v, ir.Constant(I64, off)) if off else v

    def element_ptr(self, ptr: ir.Value, flat: Expr, mt: ir.Type) -> ir.Value:
        """&ptr[flat] (lane 0's element inside a vector loop) as a constant-offset gep on a row pointer emitted once
        per block: one instruction per access of an unrolled tile, not an add and a gep (resnet50: 15k adds)."""
        v, off = self._lane0(self.index_parts, flat)
        row = self.emitted(("row", ptr, value_key(v), mt), ())
        if row is None:
            row = self._emitted[("row", ptr, value_key(v), mt, self.b.block)] = self.b.gep(ptr, [v], source_etype=mt)
        return self.b.gep(row, [ir.Constant(I64, off)], source_etype=mt) if off else row

    def affine_split(self, flat: Expr) -> tuple[Expr, tuple[tuple[str, int], ...]]:
        """flat = base + Σ coef·v over the loop variables v bound to constants in which flat is affine."""
        names = self.free_vars(flat)
        if not names:
            return flat, ()
        fixed = tuple(n for n in names if isinstance(self.env.get(n), ir.Constant))
        if not fixed:
            return flat, ()
        key = (flat, fixed)
        hit = self._split.get(key)
        if hit is None:
            coefs = tuple((n, c) for n in fixed if (c := coef(flat, Var(n))) is not None)
            base = substitute(flat, {Var(n): Const(0, "int64") for n, _ in coefs}) if coefs else flat
            hit = self._split[key] = (base, coefs)
        return hit

    def _from_memory(self, val: ir.Value, dtype: str) -> ir.Value:
        if dtype == "bool":
            return self.b.icmp_unsigned("!=", val, ir.Constant(val.type, None))
        if dtype == "bfloat16":
            return bf16_to_f32(self.b, val)
        return val

    def to_memory(self, val: ir.Value, dtype: str) -> ir.Value:
        if dtype == "bool":
            t = ir.VectorType(I8, val.type.count) if isinstance(val.type, ir.VectorType) else I8
            return self.b.zext(val, t)
        if dtype == "bfloat16":
            return f32_to_bf16(self.b, val, native_rounding(self.target))
        return val


def prefix_store(b: ir.IRBuilder, val: ir.Value, p: ir.Value, count: int, mt: ir.Type, align: int) -> None:
    """Store the first `count` lanes of `val` at `p` as plain stores of power-of-two pieces (6 of 8 lanes: 4 +
    2): a masked store with a constant mask is a vmaskmov, which Zen 3 retires about one per 12 cycles — the
    ukernel strategy's A pack of 6-row tiles ran at ≈ 18 cycles per step on it."""
    at = 0
    while at < count:
        piece = 1 << ((count - at).bit_length() - 1)
        part = val if piece == val.type.count else \
            b.shuffle_vector(val, ir.Constant(val.type, None), ir.Constant(ir.VectorType(I32, piece),
                                                                              list(range(at, at + piece))))
        dst = b.gep(p, [ir.Constant(I64, at)], source_etype=mt) if at else p
        b.store(part if piece > 1 else b.extract_element(part, ir.Constant(I32, 0)), dst, align=align)
        at += piece
