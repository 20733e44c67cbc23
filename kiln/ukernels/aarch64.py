"""Hand-written AArch64 f32 GEMM microkernels in LLVM IR: NEON (fixed 128-bit) and SVE (scalable, any VL).

Same interface as every Kiln microkernel (kiln/ukernels/__init__.py):

    void kiln_ukr_<isa>_f32_<MR>x<NR>(ptr A,   /* packed [K][MR] */  ptr B,   /* packed [K][NR] weight panel */
                                      ptr C,   /* MR×NR tile, row stride ldc floats */  i64 ldc, i64 K, i32 accumulate)
    C[i][j] = (accumulate ? C[i][j] : 0) + Σ_k A[k][i] · B[k][j]

On AArch64 (and RISC-V) targets pack_weights gives NR = 2 · (minimum vector lanes) = 8 columns per panel.

NEON 12×8 (`kiln_ukr_neon_f32_12x8`), the classic ARM outer-product kernel (BLIS/OpenBLAS Cortex-A style):
  * 12 rows × 2 q-register column vectors = 24 accumulators; per k step 2 B loads (`ldr q`), 3 A loads (one
    q register per 4 rows) and 24 `fmla v.4s, v.4s, v.s[lane]` — the A value is taken by lane index from the
    register it was loaded into, so there is no broadcast instruction. 24 + 2 + 3 = 29 of the 32 v registers.
  * Rows past the last full group of 4 (MR % 4, the small-M family members) load A as scalars (`ld1r`).

SVE 12×8 (`kiln_ukr_sve_f32_12x8`), ONE kernel for every vector length (VL = 128·vscale bits):
  * A: per k step and per 4 rows one `ld1rqw` (load 128 bits, replicate to every 128-bit segment) and
    `fmla z.s, z.s, z.s[lane]` (the indexed FMA picks the lane within each segment) — 3 A loads, no broadcasts.
  * The 8 columns are dispatched on vscale once at entry (`llvm.vscale`):
      - VL = 128 (vscale 1): two full vectors per row, 24 accumulators (like NEON, but scalable registers);
      - VL ≥ 256: ONE vector per row under the predicate `whilelo(0, 8)` (`llvm.get.active.lane.mask`): B and
        C are loaded/stored with predicated `ld1w`/`st1w` (no access past column 8), 12 accumulators. For
        VL > 256 only 8 of VL/32 lanes do useful work (at VL 512 half of each FMA is idle; at 2048, 1/8):
        the panel width is fixed at the minimum VL's 2 vectors because the weights are packed at compile time,
        before the VL is known. A VL-agnostic panel (NR = VL/32 chosen at run time) would need run-time packing.
Both kernels unroll the K loop UNROLL times, then a remainder loop; no software prefetch (the AArch64 cores
Kiln targets have stream prefetchers, and qemu, where these run here, has no caches). Loads and stores of
caller memory use `align 4`.

`emit_kernel_body` (the K-loop skeleton shared with kiln/ukernels/riscv.py) takes the per-ISA vector operations
as a `VectorOps`."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from kiln.ukernels.x86 import kernel_name

UNROLL = 4           # k steps per loop iteration (as the x86 kernels)
NEON_FAMILY = (4, 12, 8)   # (vector lanes, main MR, NR)
SVE_FAMILY = (8, 12, 8)    # "lanes" = NR: the family has no narrow (one-vector) edge kernels

Emit = Callable[[str], None]


@dataclass
class VectorOps:
    """How one ISA does the kernel's vector work; each callable emits IR lines through `emit`."""
    vt: str                                               # the accumulator / B vector type
    col_step: int                                         # floats between a row's column vectors
    load: Callable[[Emit, str, str], None]                # (emit, dst, ptr): a vector of C or B
    store: Callable[[Emit, str, str], None]               # (emit, value, ptr)
    a_operands: Callable[[Emit, str, str, int], list[str]]  # (emit, tag, ptr to A[k][0], MR) → one per row
    fma: Callable[[Emit, str, str, str, str], None]       # (emit, dst, acc, a operand, b): dst = acc + a·b


def emit_kernel_body(emit: Emit, p: str, mr: int, nr: int, nv: int, ops: VectorOps, unroll: int = UNROLL) -> None:
    """The blocks `{p}entry` … `{p}store` (ending in `ret void`) of an MR × nv-vector kernel: optional C load,
    the K loop unrolled `unroll` times, the remainder loop, the C store. Expects %A %B %C %ldc %K and the i1
    %acc.on in scope; labels and values are prefixed with `p` so one function can hold several bodies."""
    accs = [(i, v) for i in range(mr) for v in range(nv)]

    def step(k: str, src: dict[tuple[int, int], str], tag: str) -> None:
        """One rank-1 update at k-step %k; the new accumulators are %{p}c.{tag}.{i}.{v}."""
        t = f"{p}{tag}"
        emit(f"  %{t}.ka = mul i64 {k}, {mr}")
        emit(f"  %{t}.kb = mul i64 {k}, {nr}")
        emit(f"  %{t}.ap = getelementptr float, ptr %A, i64 %{t}.ka")
        for v in range(nv):
            emit(f"  %{t}.bo{v} = add i64 %{t}.kb, {v * ops.col_step}")
            emit(f"  %{t}.bp{v} = getelementptr float, ptr %B, i64 %{t}.bo{v}")
            ops.load(emit, f"%{t}.b{v}", f"%{t}.bp{v}")
        a = ops.a_operands(emit, t, f"%{t}.ap", mr)
        for i, v in accs:
            ops.fma(emit, f"%{p}c.{tag}.{i}.{v}", src[(i, v)], a[i], f"%{t}.b{v}")

    def tile_ptrs(kind: str) -> None:
        for i in range(mr):
            emit(f"  %{p}{kind}row.{i} = mul i64 %ldc, {i}")
            for v in range(nv):
                emit(f"  %{p}{kind}o.{i}.{v} = add i64 %{p}{kind}row.{i}, {v * ops.col_step}")
                emit(f"  %{p}{kind}p.{i}.{v} = getelementptr float, ptr %C, i64 %{p}{kind}o.{i}.{v}")

    last = f"u{unroll - 1}"
    emit(f"{p}entry:")
    emit(f"  br i1 %acc.on, label %{p}loadc, label %{p}start")
    emit(f"{p}loadc:")
    tile_ptrs("l")
    for i, v in accs:
        ops.load(emit, f"%{p}l.{i}.{v}", f"%{p}lp.{i}.{v}")
    emit(f"  br label %{p}start")
    emit(f"{p}start:")
    for i, v in accs:
        emit(f"  %{p}s.{i}.{v} = phi {ops.vt} [ zeroinitializer, %{p}entry ], [ %{p}l.{i}.{v}, %{p}loadc ]")
    emit(f"  %{p}kmain = and i64 %K, {-unroll}")
    emit(f"  %{p}has.main = icmp sgt i64 %{p}kmain, 0")
    emit(f"  br i1 %{p}has.main, label %{p}main, label %{p}main.done")
    emit(f"{p}main:")   # UNROLL steps per iteration
    emit(f"  %{p}k = phi i64 [ 0, %{p}start ], [ %{p}k.next, %{p}main ]")
    for i, v in accs:
        emit(f"  %{p}m.{i}.{v} = phi {ops.vt} [ %{p}s.{i}.{v}, %{p}start ], [ %{p}c.{last}.{i}.{v}, %{p}main ]")
    cur = {(i, v): f"%{p}m.{i}.{v}" for i, v in accs}
    for u in range(unroll):
        emit(f"  %{p}k.u{u} = add i64 %{p}k, {u}")
        step(f"%{p}k.u{u}", cur, f"u{u}")
        cur = {(i, v): f"%{p}c.u{u}.{i}.{v}" for i, v in accs}
    emit(f"  %{p}k.next = add i64 %{p}k, {unroll}")
    emit(f"  %{p}more = icmp slt i64 %{p}k.next, %{p}kmain")
    emit(f"  br i1 %{p}more, label %{p}main, label %{p}main.done")
    emit(f"{p}main.done:")
    emit(f"  %{p}kr = phi i64 [ 0, %{p}start ], [ %{p}k.next, %{p}main ]")
    for i, v in accs:
        emit(f"  %{p}r0.{i}.{v} = phi {ops.vt} [ %{p}s.{i}.{v}, %{p}start ], [ %{p}c.{last}.{i}.{v}, %{p}main ]")
    emit(f"  %{p}has.rem = icmp slt i64 %{p}kr, %K")
    emit(f"  br i1 %{p}has.rem, label %{p}rem, label %{p}store")
    emit(f"{p}rem:")    # single steps
    emit(f"  %{p}q = phi i64 [ %{p}kr, %{p}main.done ], [ %{p}q.next, %{p}rem ]")
    for i, v in accs:
        emit(f"  %{p}rq.{i}.{v} = phi {ops.vt} [ %{p}r0.{i}.{v}, %{p}main.done ], [ %{p}c.r.{i}.{v}, %{p}rem ]")
    step(f"%{p}q", {(i, v): f"%{p}rq.{i}.{v}" for i, v in accs}, "r")
    emit(f"  %{p}q.next = add i64 %{p}q, 1")
    emit(f"  %{p}q.more = icmp slt i64 %{p}q.next, %K")
    emit(f"  br i1 %{p}q.more, label %{p}rem, label %{p}store")
    emit(f"{p}store:")
    for i, v in accs:
        emit(f"  %{p}f.{i}.{v} = phi {ops.vt} [ %{p}r0.{i}.{v}, %{p}main.done ], [ %{p}c.r.{i}.{v}, %{p}rem ]")
    tile_ptrs("s")
    for i, v in accs:
        ops.store(emit, f"%{p}f.{i}.{v}", f"%{p}sp.{i}.{v}")
    emit("  ret void")


def signature(name: str) -> str:
    return (f"define internal void @{name}(ptr noalias nocapture readonly %A, ptr noalias nocapture readonly %B, "
            f"ptr noalias nocapture %C, i64 %ldc, i64 %K, i32 %accumulate) nounwind noinline")


def _check(isa: str, mr: int, nr: int, width: int, cols: int) -> None:
    if nr % width or cols % width or not 0 < cols <= nr or mr < 1:
        raise ValueError(f"bad {isa} microkernel shape {mr}x{cols} of {nr} ({width}-lane vectors)")


# ---- NEON ----------------------------------------------------------------------------------------------------

def _neon_ops() -> VectorOps:
    vt = "<4 x float>"

    def load(emit: Emit, dst: str, ptr: str) -> None:
        emit(f"  {dst} = load {vt}, ptr {ptr}, align 4")

    def store(emit: Emit, val: str, ptr: str) -> None:
        emit(f"  store {vt} {val}, ptr {ptr}, align 4")

    def a_operands(emit: Emit, t: str, ap: str, mr: int) -> list[str]:
        out = []
        for g in range(mr // 4):   # full groups of 4 rows: one q load, lanes taken by index (fmla by element)
            emit(f"  %{t}.agp{g} = getelementptr float, ptr {ap}, i64 {4 * g}")
            emit(f"  %{t}.ag{g} = load {vt}, ptr %{t}.agp{g}, align 4")
            for lane in range(4):
                emit(f"  %{t}.a{4 * g + lane} = shufflevector {vt} %{t}.ag{g}, {vt} poison, "
                     f"<4 x i32> <i32 {lane}, i32 {lane}, i32 {lane}, i32 {lane}>")
                out.append(f"%{t}.a{4 * g + lane}")
        for i in range(mr // 4 * 4, mr):   # the MR % 4 last rows: scalar loads (never read past the panel)
            emit(f"  %{t}.asp{i} = getelementptr float, ptr {ap}, i64 {i}")
            emit(f"  %{t}.as{i} = load float, ptr %{t}.asp{i}, align 4")
            emit(f"  %{t}.ai{i} = insertelement {vt} poison, float %{t}.as{i}, i64 0")
            emit(f"  %{t}.a{i} = shufflevector {vt} %{t}.ai{i}, {vt} poison, <4 x i32> zeroinitializer")
            out.append(f"%{t}.a{i}")
        return out

    def fma(emit: Emit, dst: str, acc: str, a: str, b: str) -> None:
        emit(f"  {dst} = call {vt} @llvm.fma.v4f32({vt} {a}, {vt} {b}, {vt} {acc})")

    return VectorOps(vt, 4, load, store, a_operands, fma)


def neon_kernel_ir(mr: int, nr: int = 8, cols: int | None = None, unroll: int = UNROLL) -> str:
    """The LLVM IR of the NEON MR×cols kernel on NR-wide panels (cols < NR: the narrow edge kernel)."""
    cols = nr if cols is None else cols
    _check("neon", mr, nr, 4, cols)
    name = kernel_name("neon", mr, nr, cols)
    out: list[str] = [signature(name) + " {", "entry:", "  %acc.on = icmp ne i32 %accumulate, 0",
                      "  br label %k.entry"]
    emit_kernel_body(out.append, "k.", mr, nr, cols // 4, _neon_ops(), unroll)
    out += ["}", "declare <4 x float> @llvm.fma.v4f32(<4 x float>, <4 x float>, <4 x float>)"]
    return "\n".join(out) + "\n"


# ---- SVE -----------------------------------------------------------------------------------------------------

SVT, SMT = "<vscale x 4 x float>", "<vscale x 4 x i1>"
# A by ld1rqw + indexed fmla (True) or by one ld1rw broadcast per row + plain fmla (False). Measured (ISA report,
# aarch64-sve at VL 256): indexed 0.101 / 0.143 instructions per FLOP on gemm_odd / conv_r50_3x3 and 30 / 32
# FLOP/cycle (llvm-mca, neoverse-v1), broadcasts 0.183 / 0.183 and 20 / 21 (load-bound). The indexed form reads
# its A operand from z0–z7 only, and for some MR (5, 6, 9, 10; 7 once inlined into a model) LLVM's register
# allocator then spills one A register per k step — still the better of the two.
SVE_INDEXED_FMA = True


def _sve_ops(mask: str) -> VectorOps:
    """B and C accesses predicated by `mask`: all lanes on the VL = 128 path (a plain `load` of a scalable
    vector with align 4 would become byte loads, `ld1b`), the first NR lanes for VL ≥ 256."""
    def load(emit: Emit, dst: str, ptr: str) -> None:
        emit(f"  {dst} = call {SVT} @llvm.masked.load.nxv4f32.p0(ptr {ptr}, i32 4, {SMT} {mask}, "
             f"{SVT} zeroinitializer)")

    def store(emit: Emit, val: str, ptr: str) -> None:
        emit(f"  call void @llvm.masked.store.nxv4f32.p0({SVT} {val}, ptr {ptr}, i32 4, {SMT} {mask})")

    def a_operands(emit: Emit, t: str, ap: str, mr: int) -> list[str]:
        out = []
        if not SVE_INDEXED_FMA:   # one broadcast load (ld1rw) per row, plain fmla
            for i in range(mr):
                emit(f"  %{t}.asp{i} = getelementptr float, ptr {ap}, i64 {i}")
                emit(f"  %{t}.as{i} = load float, ptr %{t}.asp{i}, align 4")
                emit(f"  %{t}.ai{i} = insertelement {SVT} poison, float %{t}.as{i}, i64 0")
                emit(f"  %{t}.a{i} = shufflevector {SVT} %{t}.ai{i}, {SVT} poison, "
                     "<vscale x 4 x i32> zeroinitializer")
                out.append(f"%{t}.a{i}")
            return out
        for g in range(-(-mr // 4)):   # ld1rqw: 4 rows (fewer for the last group, predicated) in every segment
            rows = min(4, mr - 4 * g)
            emit(f"  %{t}.agp{g} = getelementptr float, ptr {ap}, i64 {4 * g}")
            emit(f"  %{t}.ag{g} = call {SVT} @llvm.aarch64.sve.ld1rq.nxv4f32({SMT} %rows.pg{rows}, "
                 f"ptr %{t}.agp{g})")
            out += [f"%{t}.ag{g}|{lane}" for lane in range(rows)]
        return out

    def fma(emit: Emit, dst: str, acc: str, a: str, b: str) -> None:
        if "|" not in a:
            emit(f"  {dst} = call {SVT} @llvm.fma.nxv4f32({SVT} {a}, {SVT} {b}, {SVT} {acc})")
            return
        rep, lane = a.split("|")
        emit(f"  {dst} = call {SVT} @llvm.aarch64.sve.fmla.lane.nxv4f32({SVT} {acc}, {SVT} {b}, {SVT} {rep}, "
             f"i32 {lane})")

    return VectorOps(SVT, 4, load, store, a_operands, fma)


def sve_kernel_ir(mr: int, nr: int = 8, unroll: int = UNROLL) -> str:
    """The LLVM IR of the SVE MR×NR kernel: correct at every VL (see the module docstring)."""
    _check("sve", mr, nr, nr, nr)
    if nr != 8:
        raise ValueError(f"SVE microkernels are written for 8-column panels (2 vectors at VL 128), not {nr}")
    name = kernel_name("sve", mr, nr, nr)
    out: list[str] = [signature(name) + " {", "entry:", "  %acc.on = icmp ne i32 %accumulate, 0"]
    for rows in sorted({min(4, mr - 4 * g) for g in range(-(-mr // 4))}):
        out.append(f"  %rows.pg{rows} = call {SMT} @llvm.get.active.lane.mask.nxv4i1.i64(i64 0, i64 {rows})")
    out += [f"  %cols.pg = call {SMT} @llvm.get.active.lane.mask.nxv4i1.i64(i64 0, i64 {nr})",
            "  %vscale = call i64 @llvm.vscale.i64()",
            "  %one.vector = icmp uge i64 %vscale, 2",     # VL ≥ 256: the 8 columns fit one vector
            "  br i1 %one.vector, label %w.entry, label %n.entry"]
    emit_kernel_body(out.append, "w.", mr, nr, 1, _sve_ops("%cols.pg"), unroll)
    emit_kernel_body(out.append, "n.", mr, nr, 2, _sve_ops("splat (i1 true)"), unroll)
    out += ["}",
            f"declare {SMT} @llvm.get.active.lane.mask.nxv4i1.i64(i64, i64)",
            "declare i64 @llvm.vscale.i64()",
            f"declare {SVT} @llvm.masked.load.nxv4f32.p0(ptr, i32 immarg, {SMT}, {SVT})",
            f"declare void @llvm.masked.store.nxv4f32.p0({SVT}, ptr, i32 immarg, {SMT})",
            f"declare {SVT} @llvm.aarch64.sve.ld1rq.nxv4f32({SMT}, ptr)",
            f"declare {SVT} @llvm.aarch64.sve.fmla.lane.nxv4f32({SVT}, {SVT}, {SVT}, i32 immarg)",
            f"declare {SVT} @llvm.fma.nxv4f32({SVT}, {SVT}, {SVT})"]
    return "\n".join(out) + "\n"
