"""An ISA described as data: what codegen and schedules need to know about a CPU."""
from __future__ import annotations

import functools
from dataclasses import dataclass


@dataclass(frozen=True)
class Target:
    name: str
    triple: str
    cpu: str
    features: str            # LLVM feature string, e.g. "+avx512f,+fma"
    vector_bits: int         # width of one vector register
    vector_registers: int    # architectural vector registers
    has_fma: bool = True
    scalable: bool = False   # SVE / RVV: vector_bits is the minimum
    l1_bytes: int = 32 * 1024
    l2_bytes: int = 1024 * 1024
    l3_bytes: int = 32 * 1024 * 1024

    def lanes(self, dtype_bits: int = 32) -> int:
        """How many elements of a dtype one vector register holds."""
        return max(1, self.vector_bits // dtype_bits)

    @property
    def key(self) -> str:
        return f"{self.triple}|{self.cpu}|{self.features}|{self.vector_bits}"


@functools.cache
def host() -> Target:
    """The machine we run on; vector width from its widest usable feature (AVX-512 → AVX2 → SSE)."""
    import llvmlite.binding as llvm

    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    feats = llvm.get_host_cpu_features()
    on = {k for k, v in feats.items() if v}
    if "avx512f" in on:
        bits, regs = 512, 32
    elif "avx2" in on or "avx" in on:
        bits, regs = 256, 16
    else:
        bits, regs = 128, 16
    return Target("host", llvm.get_process_triple(), llvm.get_host_cpu_name(), feats.flatten(), bits, regs,
                  has_fma="fma" in on)


def host_with(vector_bits: int) -> Target:
    """The host, but limited to narrower vectors (AVX2 / SSE fallbacks, and for ablations)."""
    h = host()
    if vector_bits >= h.vector_bits:
        return h
    drop = {256: ("avx512",), 128: ("avx512", "avx2", "avx", "fma")}[vector_bits]
    feats = ",".join(("-" + f[1:]) if f[1:].startswith(drop) else f for f in h.features.split(","))
    regs = 16
    return Target(f"host-{vector_bits}", h.triple, h.cpu, feats, vector_bits, regs, has_fma=vector_bits > 128)


def resolve(target: str | Target) -> Target:
    if isinstance(target, Target):
        return target
    named = {"host": host, "avx512": lambda: host_with(512), "avx2": lambda: host_with(256),
             "sse": lambda: host_with(128)}
    if target not in named:
        raise ValueError(f"unknown target {target!r}; known: {', '.join(named)}")
    return named[target]()
