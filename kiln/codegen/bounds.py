"""Bounds checks for the debug build (`kiln.compile(model, bounds_check=True)`).

Every load, store, gather and scatter codegen emits goes through one of the hooks below when the kernel
is built with checks; without them codegen never calls this module and its IR is unchanged.

For each access the flat element index of every *active* lane (a lane the loop mask keeps) is tested
against [0, buffer.size) with one unsigned compare. A violating lane is never touched:

  * scalar access:  the pointer is redirected to a private sink (`kiln.bounds.sink`) and a load yields
                    the masked-off fill instead (0.0 for floats, 1 for integers and bools — the value a
                    masked-off vector lane reads, so an integer divide by a skipped load cannot trap);
  * vector access:  the lane is dropped from the access mask (an unmasked vector access becomes a masked
                    one), so it reads the same fill and writes nothing.

A violation also calls `kiln.bounds.report(buffer, index, size)` on a cold path: the first reporter wins
a compare-exchange on the module's record and writes where it happened; every later one only counts.

    record = i64[5]: [kernel call + 1 (0: no violation), buffer position, flat index, buffer size, count]

`kiln_main` stores the index of the kernel call it is in to `kiln.bounds.kernel` before each call
(structurally equal kernels share one function, so the function alone cannot say which call it is), and
`kiln_bounds_record()` returns the record's address to `Executable.run`, which clears it before a run and
raises `kiln.errors.BoundsError` after one that recorded a violation."""
from __future__ import annotations

from typing import TYPE_CHECKING

from llvmlite import ir

if TYPE_CHECKING:
    from kiln.kernel.build import Program

I1, I32, I64, PTR = ir.IntType(1), ir.IntType(32), ir.IntType(64), ir.PointerType()

RECORD_GLOBAL = "kiln.bounds.record"
KERNEL_GLOBAL = "kiln.bounds.kernel"
SINK_GLOBAL = "kiln.bounds.sink"
REPORT_FN = "kiln.bounds.report"
RECORD_ACCESSOR = "kiln_bounds_record"   # exported: `ptr kiln_bounds_record()`
RECORD_LEN = 5                           # the i64 slots of the record (layout in the module docstring)


def declare_bounds_runtime(m: ir.Module) -> None:
    """The record, the kernel-call global, the sink, the report function and the exported accessor."""
    if RECORD_GLOBAL in m.globals:
        return
    rec_t = ir.ArrayType(I64, RECORD_LEN)
    rec = ir.GlobalVariable(m, rec_t, RECORD_GLOBAL)
    rec.initializer = ir.Constant(rec_t, None)
    rec.linkage = "internal"
    rec.align = 64
    cur = ir.GlobalVariable(m, I64, KERNEL_GLOBAL)
    cur.initializer = ir.Constant(I64, 0)
    cur.linkage = "internal"
    sink_t = ir.ArrayType(I64, 8)  # wide enough for any scalar; what a skipped access reads is discarded
    sink = ir.GlobalVariable(m, sink_t, SINK_GLOBAL)
    sink.initializer = ir.Constant(sink_t, None)
    sink.linkage = "internal"
    sink.align = 64

    report = ir.Function(m, ir.FunctionType(ir.VoidType(), [I64, I64, I64]), REPORT_FN)
    report.linkage = "internal"
    report.attributes.add("noinline")
    report.attributes.add("cold")
    pos, index, size = report.args
    b = ir.IRBuilder(report.append_basic_block("entry"))

    def slot(i: int) -> ir.Value:
        return b.gep(rec, [ir.Constant(I32, 0), ir.Constant(I32, i)], inbounds=True)

    kernel = b.load(cur, typ=I64)
    won = b.cmpxchg(slot(0), ir.Constant(I64, 0), b.add(kernel, ir.Constant(I64, 1)), "seq_cst", "seq_cst")
    b.atomic_rmw("add", slot(4), ir.Constant(I64, 1), "seq_cst")
    with b.if_then(b.extract_value(won, 1)):  # first writer wins; later violations are only counted
        for i, v in ((1, pos), (2, index), (3, size)):
            b.store_atomic(v, slot(i), "seq_cst", 8)
    b.ret_void()

    accessor = ir.Function(m, ir.FunctionType(PTR, []), RECORD_ACCESSOR)
    ab = ir.IRBuilder(accessor.append_basic_block("entry"))
    ab.ret(ab.bitcast(rec, PTR))


def set_current_kernel(b: ir.IRBuilder, m: ir.Module, call_index: int) -> None:
    """In kiln_main, before kernel call `call_index`: which call a violation belongs to."""
    b.store(ir.Constant(I64, call_index), m.globals[KERNEL_GLOBAL])


class BoundsChecker:
    """The checks for one emitted function. `buffers` is the emitter's live table (name → (pointer, dtype,
    shape)), so buffers a kernel allocates itself are checked too; `positions` numbers the kernel's own
    buffers (arguments, then scratch) the way `Executable` names them — any other buffer reports −1."""

    def __init__(self, builder: ir.IRBuilder, module: ir.Module,
                 buffers: dict[str, tuple[ir.Value, str, tuple[int, ...]]], positions: dict[str, int]):
        declare_bounds_runtime(module)
        self.b, self.m, self.buffers, self.positions = builder, module, buffers, positions

    def _buffer(self, ptr: ir.Value) -> tuple[int, int]:
        """(position, size in elements) of the buffer whose base pointer is `ptr`."""
        for name, (p, _, shape) in self.buffers.items():
            if p is ptr:
                size = 1
                for d in shape:
                    size *= int(d)
                return self.positions.get(name, -1), size
        raise AssertionError(f"bounds check: {ptr} is not the base pointer of a buffer")

    # -- scalar accesses ------------------------------------------------------------------------------------
    def _scalar_ptr(self, ptr: ir.Value, idx: ir.Value, mt: ir.Type) -> tuple[ir.Value, ir.Value]:
        """(the pointer to access — the sink when idx is out of bounds, the in-bounds flag)."""
        pos, size = self._buffer(ptr)
        b = self.b
        ok = b.icmp_unsigned("<", idx, ir.Constant(I64, size))
        with b.if_then(b.not_(ok), likely=False):
            b.call(self.m.globals[REPORT_FN], [ir.Constant(I64, pos), idx, ir.Constant(I64, size)])
        p = b.gep(ptr, [idx], source_etype=mt)
        return b.select(ok, p, self.m.globals[SINK_GLOBAL]), ok

    def scalar_load(self, ptr: ir.Value, idx: ir.Value, mt: ir.Type, align: int) -> ir.Value:
        p, ok = self._scalar_ptr(ptr, idx, mt)
        val = self.b.load(p, typ=mt, align=align)
        return self.b.select(ok, val, fill(mt))

    def scalar_store(self, val: ir.Value, ptr: ir.Value, idx: ir.Value, mt: ir.Type, align: int) -> None:
        p, _ = self._scalar_ptr(ptr, idx, mt)
        self.b.store(val, p, align=align)

    # -- vector accesses ------------------------------------------------------------------------------------
    def progression(self, first: ir.Value, stride: int, n: int) -> ir.Value:
        """<n x i64> first + stride·j: the lane indices of a contiguous (1) or strided access."""
        undef = ir.Constant(ir.VectorType(I64, n), ir.Undefined)
        v = self.b.insert_element(undef, first, ir.Constant(I32, 0))
        splat = self.b.shuffle_vector(v, undef, ir.Constant(ir.VectorType(I32, n), [0] * n))
        return self.b.add(splat, ir.Constant(ir.VectorType(I64, n), [stride * j for j in range(n)]))

    def lanes(self, ptr: ir.Value, idx: ir.Value, mask: ir.Value | None) -> ir.Value:
        """The access mask with every out-of-bounds lane removed (idx: <n x i64> lane indices; mask: the
        active lanes, None for all). Reports the first active out-of-bounds lane, if any."""
        pos, size = self._buffer(ptr)
        b, n = self.b, idx.type.count
        inb = b.icmp_unsigned("<", idx, ir.Constant(ir.VectorType(I64, n), [size] * n))
        bad = b.not_(inb) if mask is None else b.and_(mask, b.not_(inb))
        bits = b.bitcast(bad, ir.IntType(n))
        with b.if_then(b.icmp_unsigned("!=", bits, ir.Constant(ir.IntType(n), 0)), likely=False):
            cttz = self._decl(f"llvm.cttz.i{n}", ir.IntType(n), [ir.IntType(n), I1])
            lane = b.call(cttz, [bits, ir.Constant(I1, 1)])
            lane32 = b.trunc(lane, I32) if n > 32 else (b.zext(lane, I32) if n < 32 else lane)
            first_bad = b.extract_element(idx, lane32)
            b.call(self.m.globals[REPORT_FN], [ir.Constant(I64, pos), first_bad, ir.Constant(I64, size)])
        return inb if mask is None else b.and_(mask, inb)

    def _decl(self, name: str, ret: ir.Type, args: list[ir.Type]) -> ir.Function:
        return self.m.globals.get(name) or ir.Function(self.m, ir.FunctionType(ret, args), name)


def fill(t: ir.Type) -> ir.Constant:
    """What a skipped (or masked-off) element reads: 0.0 for floats, 1 for integers and bools."""
    return ir.Constant(t, 1 if isinstance(t, ir.IntType) else 0.0)


def buffer_names(prog: Program) -> list[list[list[str]]]:
    """Per kernel call, per buffer position: [name in the kernel, name of the graph buffer bound to it] —
    what `Executable` needs to name the buffer of a recorded violation."""
    return [[[buf.name, bound] for buf, bound in zip(list(k.args) + list(k.scratch), names)]
            for k, names in zip(prog.kernels, prog.bindings)]
