"""Hand-written microkernels, one family per ISA, behind ONE narrow interface (like IREE's mmt4d ukernels):

    void kiln_ukr_<isa>_f32_<MR>x<NR>(ptr A,   /* packed A panel [K][MR] (MR rows, k-major), 64-byte aligned */
                                      ptr B,   /* packed B panel [K][NR] (a weight panel, zero-padded to NR) */
                                      ptr C,   /* the MR×NR C tile, row stride ldc (in floats)                 */
                                      i64 ldc, i64 K, i32 accumulate)
    C[i][j] = (accumulate ? C[i][j] : 0) + Σ_{k<K} A[k·MR + i] · B[k·NR + j]

All of C's MR×NR elements are written (the caller gives it a full tile: kiln/schedule/ukernel.py passes a
private L1-resident tile and applies the epilogue while copying the valid part out). `accumulate` lets the
caller split K into blocks. The compiler packs, tiles and parallelizes around the call.

`ukernel_for(target)` is the registry: the main kernel for a target's ISA (or None where there is none yet:
the AArch64/RISC-V kernels come with the cross-ISA work); `ukernel_for(target, mr)` a kernel of the same family
with fewer rows (small M), `ukernel_for(target, mr, cols)` the narrow edge kernel that computes only the first
`cols` (one vector) columns of the NR-wide panels — named kiln_ukr_<isa>_f32_<MR>x<cols>_b<NR>, same
arguments — for a last panel that is mostly zero padding. `pack_kernel_for(target, mr)` is the family's
A-packing kernel (BLIS's packm). `ir_text` is the LLVM IR definition that codegen links into the module
(Kernel.extern_ir). A new ISA adds a family here with the same signatures.

The low-precision kernels have their own interfaces: kiln/ukernels/dot.py (8-bit and bf16 dot-product kernels per
ISA, a batch-reduce block reading A in place) and kiln/ukernels/amx.py (AMX tile kernels)."""
from __future__ import annotations

import functools
from dataclasses import dataclass

from kiln.target import Target
from kiln.ukernels.aarch64 import NEON_FAMILY, SVE_FAMILY, neon_kernel_ir, sve_kernel_ir
from kiln.ukernels.riscv import RVV_FAMILY, rvv_kernel_ir
from kiln.ukernels.x86 import LATENCY_CHAINS, kernel_name, pack_name, x86_kernel_ir, x86_pack_ir


@dataclass(frozen=True)
class UKernel:
    name: str      # the LLVM symbol
    mr: int        # rows of the C tile (A panel width)
    nr: int        # columns of the C tile (B panel width)
    isa: str       # avx512 | avx2
    ir_text: str   # the LLVM IR definition (plus the intrinsic declarations it uses)
    cols: int      # columns it computes: NR, or one vector for a narrow edge kernel


@dataclass(frozen=True)
class PackKernel:
    """The A-panel packing kernel of a family (BLIS's packm): MR rows of a row-major matrix → [K][MR].

        void kiln_pack_<isa>_f32_<MR>(ptr src, i64 lda, i64 rows, i64 K, ptr dst)
        dst[k·MR + i] = src[min(i, rows − 1)·lda + k]"""
    name: str
    mr: int
    isa: str
    ir_text: str


# per ISA: (vector lanes, main MR, NR); NR = 2 vectors, the width pack_weights gives the B panels
X86_FAMILIES: dict[str, tuple[int, int, int]] = {
    "avx512": (16, 14, 32),   # 28 zmm accumulators + 2 B vectors of 32 registers
    "avx2": (8, 6, 16),       # 12 ymm accumulators + 2 B vectors + 1 broadcast of 16 registers
    "sse": (4, 4, 8),         # 8 xmm accumulators + 2 B vectors + 1 broadcast (MR ≤ 4: the pack's 4-lane transpose)
}
# cross-ISA families (kiln/ukernels/aarch64.py, riscv.py): NR = 8, the panels of a 128-bit minimum vector; no
# packing kernels (the compiler packs A itself). "lanes" = NR for SVE/RVV: they have no narrow edge kernels.
CROSS_FAMILIES: dict[str, tuple[int, int, int]] = {"neon": NEON_FAMILY, "sve": SVE_FAMILY, "rvv": RVV_FAMILY}
FAMILIES: dict[str, tuple[int, int, int]] = {**X86_FAMILIES, **CROSS_FAMILIES}


def isa_of(target: Target) -> str | None:
    """The microkernel family a target can run, or None (no kernels for that ISA yet)."""
    feats = {f[1:] for f in target.features.split(",") if f.startswith("+")}
    # the cross families are written for NR = 8 panels, i.e. a 128-bit (minimum) vector; SVE2 / SME targets run
    # the SVE kernels too. A RISC-V CPU with a larger fixed minimum VLEN (riscv64-rvv:sifive-x280) gets wider
    # panels and no microkernel (direct).
    if target.arch == "aarch64" and target.vector_bits == 128:
        if target.scalable:
            return "sve" if "sve" in feats else None
        return "neon" if "neon" in feats else None
    if target.arch == "riscv64" and target.scalable and "v" in feats and target.vector_bits == 128:
        return "rvv"
    if target.arch != "x86_64" or target.scalable:
        return None
    if target.vector_bits == 128:
        return "sse"
    if not target.has_fma:
        return None
    if target.vector_bits == 512 and target.vector_registers >= 32 and "avx512f" in feats:
        return "avx512"
    if target.vector_bits == 256 and "avx2" in feats and "fma" in feats:
        return "avx2"
    return None


@functools.cache
def _kernel(isa: str, mr: int, cols: int, panel: int | None = None) -> UKernel:
    width, _, nr = FAMILIES[isa]
    nr = panel or nr
    text = {"neon": lambda: neon_kernel_ir(mr, nr, cols), "sve": lambda: sve_kernel_ir(mr, nr),
            "rvv": lambda: rvv_kernel_ir(mr, nr)}.get(isa, lambda: x86_kernel_ir(isa, mr, nr, width, cols=cols))()
    return UKernel(kernel_name(isa, mr, nr, cols), mr, nr, isa, text, cols)


@functools.cache
def _rows_kernel(isa: str, mr: int, prefetch_steps: int) -> UKernel:
    width, _, nr = X86_FAMILIES[isa]
    name = kernel_name(isa, mr, nr, rows_a=True) + f"_p{prefetch_steps}"
    # unrolled only as far as its partial tiles need to hide the FMA latency (3 rows: 2 sets; 4 and 6 rows: none):
    # these tails' loops ran as fast with 1 step per iteration as with 4, at half the compile time
    unroll = max(1, -(-LATENCY_CHAINS // (mr * (nr // width))))
    text = x86_kernel_ir(isa, mr, nr, width, unroll=unroll, prefetch_steps=prefetch_steps, rows_a=True, name=name)
    return UKernel(name, mr, nr, isa, text, nr)


def rows_ukernel_for(target: Target, mr: int, panel: int, prefetch_steps: int) -> UKernel | None:
    """The family's `mr`-row kernel reading A in place (kiln/ukernels/x86.py, `rows_a`: two more arguments,
    `i64 lda, i64 rows`) for B panels `panel` columns wide, prefetching B `prefetch_steps` k-steps ahead (0: none),
    named kiln_ukr_<isa>_f32_<MR>x<NR>_ra_p<steps>; None but for x86 families, their own panel width and rows."""
    isa = isa_of(target)
    if isa not in X86_FAMILIES:
        return None
    _, main_mr, nr = X86_FAMILIES[isa]
    return _rows_kernel(isa, mr, prefetch_steps) if panel == nr and 1 <= mr <= main_mr else None


@functools.cache
def _pack(isa: str, mr: int) -> PackKernel:
    width = X86_FAMILIES[isa][0]
    return PackKernel(pack_name(isa, mr), mr, isa, x86_pack_ir(isa, mr, width))


def pack_kernel_for(target: Target, mr: int) -> PackKernel | None:
    """The packing kernel for `mr`-row A panels on `target` (None: no kernels for its ISA)."""
    uk = ukernel_for(target, mr)
    return None if uk is None or uk.isa not in X86_FAMILIES else _pack(uk.isa, mr)


def narrow_cols(target: Target) -> int | None:
    """Columns of the family's narrow edge kernels (one vector), or None."""
    isa = isa_of(target)
    return None if isa is None else FAMILIES[isa][0]


def ukernel_for(target: Target, mr: int | None = None, cols: int | None = None,
                panel: int | None = None) -> UKernel | None:
    """The main microkernel for `target` (mr=None) or the family's kernel with `mr` rows (1 ≤ mr ≤ main MR);
    `cols` (a multiple of the vector width < NR) picks the narrow edge kernel for a last, mostly empty panel.
    `panel` = one vector (x86): the kernel of one-vector-wide B panels (a blocked layout whose channel block is one
    vector: 24 channels on AVX2, 20 on SSE). None when Kiln has no microkernels for the target's ISA."""
    isa = isa_of(target)
    if isa is None:
        return None
    main_mr = FAMILIES[isa][1]
    if mr is None:
        mr = main_mr
    if not 1 <= mr <= main_mr:
        raise ValueError(f"{isa} microkernels have 1..{main_mr} rows, not {mr}")
    width, _, nr = FAMILIES[isa]
    if panel is not None and panel != nr:
        if panel != width or isa not in X86_FAMILIES or cols not in (None, width):
            raise ValueError(f"{isa} microkernels take B panels of {nr} or (x86) {width} columns, not {panel}")
        return _kernel(isa, mr, width, width)
    if cols is None:
        cols = nr
    if cols % width or not 0 < cols <= nr:
        raise ValueError(f"{isa} microkernels compute a multiple of {width} columns up to {nr}, not {cols}")
    return _kernel(isa, mr, cols)
