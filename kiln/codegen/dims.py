"""The symbolic dims of a dynamic-shape module (kernel/dynamic.py): one i64 array per module, filled by the
Executable before each call through an exported accessor, read by the kernels as loop-invariant loads."""
from __future__ import annotations

from llvmlite import ir

from kiln.codegen.access import I64, PTR
from kiln.kernel.dynamic import MAX_DIMS

DIMS_GLOBAL = "kiln_dims"            # i64[MAX_DIMS]: the symbolic dims' values for the current call
DIMS_ACCESSOR = "kiln_dims_address"  # exported: `ptr kiln_dims_address()`, so the Executable can fill it


def declare_dims(m: ir.Module) -> ir.GlobalVariable:
    """The dims array and its accessor (once per module; only modules with symbolic dims have them)."""
    if DIMS_GLOBAL in m.globals:
        return m.globals[DIMS_GLOBAL]
    t = ir.ArrayType(I64, MAX_DIMS)
    g = ir.GlobalVariable(m, t, DIMS_GLOBAL)
    g.initializer = ir.Constant(t, None)
    g.linkage = "internal"
    g.align = 64
    acc = ir.Function(m, ir.FunctionType(PTR, []), DIMS_ACCESSOR)
    ab = ir.IRBuilder(acc.append_basic_block("entry"))
    ab.ret(ab.bitcast(g, PTR))
    return g


def dims_value(b: ir.IRBuilder, m: ir.Module, index: int) -> ir.Value:
    """Symbolic dim `index` of this call. The array does not change while the model runs (invariant.load), so LLVM
    hoists the read out of the loops."""
    g = declare_dims(m)
    v = b.load(b.gep(g, [ir.Constant(I64, 0), ir.Constant(I64, index)], source_etype=g.value_type), typ=I64)
    v.set_metadata("invariant.load", m.add_metadata([]))
    return v
