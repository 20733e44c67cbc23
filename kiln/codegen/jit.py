"""LLVM IR text → optimized object code → callable machine code (MCJIT, object loaded from bytes,
so a cached or saved object runs without recompiling). Objects and assembly for other ISAs (AArch64, RISC-V)
come from the same functions with the target's triple: every target LLVM was built with is initialized.
Cross targets must pass `kiln.target.validate_target` first (`resolve` does): LLVM aborts on some bad ones."""
from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import threading

import llvmlite.binding as llvm

from kiln.target import Target

_LOCK = threading.Lock()  # LLVM's global state is not thread-safe


@functools.cache
def init_llvm() -> None:
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    llvm.initialize_native_asmparser()
    llvm.initialize_all_targets()  # cross targets: AArch64 and RISC-V objects and assembly
    llvm.initialize_all_asmprinters()
    for lib in (ctypes.util.find_library("m") or "libm.so.6",):
        llvm.load_library_permanently(lib)


def code_model(target: Target) -> str:
    """x86-64 objects use the large code model: MCJIT maps an object's code and data sections with separate mmaps,
    and after a few thousand models in one process they land more than 2 GiB apart — a small-model 32-bit
    PC-relative reference between them then overflows (LLVM asserts; a release build writes a truncated offset
    and the kernel segfaults). Large-model addresses are 64-bit immediates, hoisted out of the loops."""
    return "large" if target.arch == "x86_64" else "default"


def target_machine(target: Target, opt: int = 3, reloc: str = "pic") -> llvm.TargetMachine:
    """`reloc="static"` for objects MCJIT links with each other (codegen/split.py): absolute 64-bit addresses, no
    GOT — RuntimeDyld resolves a GOT-relative reference (R_X86_64_GOTOFF64) wrongly in an object without GOT
    entries (the kernels then read and write at wild addresses)."""
    init_llvm()
    t = llvm.Target.from_triple(target.triple)
    return t.create_target_machine(cpu=target.cpu, features=target.features, opt=opt, reloc=reloc,
                                   codemodel=code_model(target))


def opt_level(dynamic: bool) -> int:
    """-O3, and -O2 for a model with symbolic dims: O3's non-trivial loop unswitching versions a loop nest for each
    run-time condition it finds invariant in it (is the vector main loop empty? is there a remainder?) — 2 to 4 copies
    of every nest over run-time extents. gpt_decoder's dynamic build at -O2: 9% less LLVM time, the same speed from 1
    to 4×512 tokens (A/B). A static build's conditions are constants: resnet18/50, mobilenetv2, bert_base, gemm_1024
    and conv_r50_3x3 ran the same at either level, and compiled no faster at -O2."""
    return 2 if dynamic else 3


def optimize(ir_text: str, target: Target, opt: int = 3) -> llvm.ModuleRef:
    with _LOCK:
        tm = target_machine(target, opt)
        mod = llvm.parse_assembly(ir_text)
        mod.verify()
        mod.triple = target.triple
        mod.data_layout = str(tm.target_data)
        pto = llvm.create_pipeline_tuning_options(speed_level=opt)
        # Kiln's schedules vectorize and unroll the loops themselves (schedule/, codegen/kernel.py): LLVM's loop
        # vectorizer, interleaver and unroller found nothing to add (resnet50, mobilenetv2, bert_base, gemm_1024:
        # bit-identical outputs, same speed) and cost a fifth of the -O3 time (resnet50: 3.3 → 2.6 CPU-s). Off, an
        # ablation with vectorize=False also measures scalar code, not what LLVM's vectorizer made of it.
        pto.loop_vectorization = pto.loop_interleaving = pto.loop_unrolling = False
        pb = llvm.create_pass_builder(tm, pto)
        pb.getModulePassManager().run(mod, pb)
        return mod


def emit_object(mod: llvm.ModuleRef, target: Target, reloc: str = "pic") -> bytes:
    with _LOCK:
        return target_machine(target, reloc=reloc).emit_object(mod)


def emit_assembly(mod: llvm.ModuleRef, target: Target) -> str:
    with _LOCK:
        return target_machine(target).emit_assembly(mod)


def fork() -> int:
    """os.fork() while holding the LLVM lock, so no other thread of this process is inside LLVM at the fork; the
    child gets a fresh lock (its copy of this one stays held). And llvmlite's own lock (every binding call takes it):
    another thread can be in llvmlite outside ours — a garbage-collected module or engine disposed of on whatever
    thread the collector ran — and a child forked then inherited it held and hung in its first LLVM call (seen in
    CI: a compile unit stuck in Target.from_triple). Taken here after ours, the order every binding call under ours
    takes them; the forking thread's copy in the child is released on the way out."""
    global _LOCK
    with _LOCK, llvm.ffi.lib._lock:
        pid = os.fork()
    if pid == 0:
        _LOCK = threading.Lock()
    return pid


class LoadedObject:
    """Object files mapped into this process, linked with each other (a model split into compile units: the entry
    module's object calls the kernels of the others, codegen/split.py); keeps the engine alive as long as the
    functions."""

    def __init__(self, objs: bytes | list[bytes], target: Target):
        with _LOCK:
            self.engine = llvm.create_mcjit_compiler(llvm.parse_assembly(""), target_machine(target))
            for obj in [objs] if isinstance(objs, bytes) else objs:
                self.engine.add_object_file(llvm.ObjectFileRef.from_data(obj))
            self.engine.finalize_object()

    def address(self, name: str) -> int:
        addr = self.engine.get_function_address(name)
        if not addr:
            raise RuntimeError(f"symbol {name} not found in the compiled object")
        return addr
