"""The whole model as ONE LLVM module with one entry point:

    void kiln_main(ptr inputs[], ptr outputs[], ptr arena, ptr weights, i32 nthreads, ptr profile_hook,
                   ptr kiln_parallel)

It calls the kernels in order with pointers from the static memory plan. Structurally identical kernels
share one function. The host JIT may instead build the kernels as several modules (`build_unit_text`, one per
compile unit, codegen/split.py) beside an entry module that declares them (`build_module_text(..., split=True)`):
then the kernels and the globals the entry point sets are external symbols, which MCJIT links between the objects.
A non-null `profile_hook(i32 k)` is called after kernel k (for `--profile`);
`kiln_parallel` is the process's thread pool (runtime/threadpool.py), passed in so a saved object needs
nothing from the process that compiled it."""
from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator

from llvmlite import ir

from kiln.codegen.access import I32, I64, PTR
from kiln.codegen.bounds import declare_bounds_runtime, set_current_kernel
from kiln.codegen.dims import DIMS_ACCESSOR, DIMS_GLOBAL, declare_dims, dims_value
from kiln.codegen.kernel import NTHREADS_GLOBAL, PARALLEL_GLOBAL, KernelEmitter, declare_runtime
from kiln.codegen.loops import emit_loop
from kiln.kernel.build import Program
from kiln.kernel.ir import Kernel
from kiln.runtime.memory import MemoryPlan
from kiln.target import Target

ENTRY = "kiln_main"


def kernel_key(k: Kernel) -> str:
    """Kernels that print the same (up to their name) compute the same: emit them once."""
    return str(k).replace(k.name, "K", 1)


@contextlib.contextmanager
def opaque_pointers() -> Iterator[None]:
    """llvmlite's IR layer prints allocas as typed pointers (`float*`) unless told otherwise, which LLVM ≥ 17
    rejects; flip its module-level switch only while Kiln prints IR, so other llvmlite users are unaffected."""
    import llvmlite.ir.types as types

    saved = types.ir_layer_typed_pointers_enabled
    types.ir_layer_typed_pointers_enabled = False
    try:
        yield
    finally:
        types.ir_layer_typed_pointers_enabled = saved


def build_module_text(prog: Program, plan: MemoryPlan, target: Target,
                      bounds_check: bool = False, split: bool = False) -> tuple[str, list[str]]:
    """The model's module: its kernels and `kiln_main`; `split`: `kiln_main` alone, calling the kernels of the
    units' modules (`build_unit_text`)."""
    with opaque_pointers():
        m, called = build_module(prog, plan, target, bounds_check, split)
        return (shared_definitions(str(m), prog.kernels) if split else link_extern_ir(str(m), prog.kernels)), called


def build_unit_text(prog: Program, kernels: list[int], target: Target) -> str:
    """A module of some of the model's distinct kernels (indices into prog.kernels), external, for an entry module
    built with split=True."""
    with opaque_pointers():
        m = ir.Module(name=f"{prog.graph.name}.k{kernels[0]}")
        m.triple = target.triple
        declare_runtime(m)
        if prog.dims is not None:
            declare_dims(m)
        for i in kernels:
            k = prog.kernels[i]
            KernelEmitter(m, k, k.name, target=target).emit().linkage = ""  # external: kiln_main is elsewhere
        share_globals(m, define=False)
        return link_extern_ir(str(m), [prog.kernels[i] for i in kernels], shared=False)


def distinct_kernels(prog: Program) -> tuple[list[int], list[str]]:
    """The index of the first kernel of each structure (`kernel_key`) and, per kernel call, the name of the
    function it calls (that first kernel's name)."""
    first: dict[str, int] = {}
    called = []
    for i, k in enumerate(prog.kernels):
        called.append(prog.kernels[first.setdefault(kernel_key(k), i)].name)
    return list(first.values()), called


SHARED_GLOBALS = (NTHREADS_GLOBAL, PARALLEL_GLOBAL, DIMS_GLOBAL)  # set by kiln_main, read by the kernels


def share_globals(m: ir.Module, define: bool) -> None:
    """The globals kiln_main sets as external symbols: defined in the entry module, declared in the units' modules
    (whose copy of the dims accessor is dropped: the entry module exports it)."""
    for name in SHARED_GLOBALS:
        g = m.globals.get(name)
        if g is None:
            continue
        g.linkage = "" if define else "external"
        if not define:
            g.initializer = None
    if not define and DIMS_ACCESSOR in m.globals:
        m.globals[DIMS_ACCESSOR].linkage = "internal"


def link_extern_ir(text: str, kernels: list[Kernel], shared: bool = True) -> str:
    """Replace the declarations of the microkernels the kernels call with their definitions (internal to the
    module). `shared=False`: a compile unit's — the kernels' shared microkernels (Kernel.shared_ir) stay declared,
    the entry module defines them (shared_definitions)."""
    defs: dict[str, str] = {}
    for k in kernels:
        defs.update(k.extern_ir)
        if shared:
            defs.update(k.shared_ir)
    return _define(text, defs)


def shared_definitions(text: str, kernels: list[Kernel]) -> str:
    """The entry module of a split build with the kernels' shared microkernels defined once, external: every
    compile unit calling one links to this definition (codegen/split.py) — instead of compiling its own copy."""
    defs = {name: re.sub(r"^define internal ", "define ", body, flags=re.M)
            for k in kernels for name, body in k.shared_ir.items()}
    return _define(text, defs)


def _define(text: str, defs: dict[str, str]) -> str:
    for name, body in defs.items():
        text = re.sub(rf'^declare [^\n]*@"?{re.escape(name)}"?\([^\n]*\n', "", text, flags=re.M)
        # a definition's own intrinsic declarations (llvm.fma.*) may already be in the module: declare once
        lines = [ln for ln in body.strip().splitlines()
                 if not (ln.startswith("declare ") and _declared(text, ln))]
        text += "\n" + "\n".join(lines) + "\n"
    return text


def _declared(text: str, declaration: str) -> bool:
    """Is the function a `declare ...` line names already declared or defined in `text`?"""
    m = re.search(r'@"?([\w.$]+)"?\(', declaration)
    return m is not None and re.search(rf'^(declare|define)\b[^\n]*@"?{re.escape(m.group(1))}"?\(', text,
                                       flags=re.M) is not None


def build_module(prog: Program, plan: MemoryPlan, target: Target,
                 bounds_check: bool = False, split: bool = False) -> tuple[ir.Module, list[str]]:
    """Returns the module and, per kernel call, the name of the function it calls. `bounds_check`: the debug
    build, every memory access checked (codegen/bounds.py). `split`: the kernels only declared (external)."""
    m = ir.Module(name=prog.graph.name)
    m.triple = target.triple
    declare_runtime(m)
    if prog.dims is not None:  # the symbolic dims' values, filled by the Executable before each call
        declare_dims(m)
    if bounds_check:
        declare_bounds_runtime(m)
    distinct, called = distinct_kernels(prog)
    for i in distinct:
        k = prog.kernels[i]
        if split:
            ir.Function(m, ir.FunctionType(ir.VoidType(), [PTR] * (len(k.args) + len(k.scratch))), k.name)
        else:
            KernelEmitter(m, k, k.name, bounds_check, target=target).emit()
    if split:
        share_globals(m, define=True)

    hook_ty = ir.PointerType(ir.FunctionType(ir.VoidType(), [I32]))  # typed, so llvmlite knows the callee type
    entry = ir.Function(m, ir.FunctionType(ir.VoidType(), [PTR, PTR, PTR, PTR, I32, hook_ty, PTR]), ENTRY)
    ins, outs, arena, weights, nthreads, hook, pool = entry.args
    b = ir.IRBuilder(entry.append_basic_block("entry"))
    b.store(nthreads, m.globals[NTHREADS_GLOBAL])
    b.store(b.ptrtoint(pool, I64), m.globals[PARALLEL_GLOBAL])
    has_hook = b.icmp_unsigned("!=", hook, ir.Constant(hook_ty, None))

    def calls(sample: ir.Value | None) -> None:
        for idx, names in enumerate(prog.bindings):
            ptrs = []
            for name in names:
                p = plan.place(prog, name)
                if p.kind in ("input", "output"):
                    arr = ins if p.kind == "input" else outs
                    ptr = b.load(b.gep(arr, [ir.Constant(I64, p.index)], source_etype=PTR), typ=PTR)
                    v = _io_value(prog, p)
                    if sample is not None and v.name in prog.dims.sampled:  # the model is lowered for one sample
                        sym, step = prog.dims.sample_step(v)
                        off = b.mul(sample, ir.Constant(I64, step))
                        if sym is not None:  # samples packed back to back: [seq, ...] each
                            off = b.mul(off, dims_value(b, m, prog.dims.slots[sym]))
                        ptr = b.gep(ptr, [off], source_etype=ir.IntType(8))
                    ptrs.append(ptr)
                else:
                    base = arena if p.kind == "arena" else weights
                    ptrs.append(b.gep(base, [ir.Constant(I64, p.index)], source_etype=ir.IntType(8)))
            if bounds_check:
                set_current_kernel(b, m, idx)
            b.call(m.globals[called[idx]], ptrs)
            with b.if_then(has_hook, likely=False):
                b.call(hook, [ir.Constant(I32, idx)])

    if prog.dims is not None and prog.dims.split is not None:  # one sample at a time (kernel/dynamic.py)
        samples = dims_value(b, m, prog.dims.slots[prog.dims.split])
        emit_loop(b, ir.Constant(I64, 0), samples, lambda i: (calls(i), ir.Constant(I64, 1))[1],
                  ("samples", "sample", "samples_done"))
    else:
        calls(None)
    b.ret_void()
    return m, called


def _io_value(prog: Program, p):  # noqa: ANN001, ANN202 - a Place of kind input/output → its graph Value
    g = prog.graph
    return (g.inputs if p.kind == "input" else g.outputs)[p.index]

