"""Hand-written RISC-V Vector (RVV 1.0) f32 GEMM microkernel in LLVM IR, with VP intrinsics.

Same interface as every Kiln microkernel (kiln/ukernels/__init__.py):

    void kiln_ukr_rvv_f32_<MR>x8(ptr A /* packed [K][MR] */, ptr B /* packed [K][8] panel */,
                                 ptr C /* MR×8 tile, row stride ldc */, i64 ldc, i64 K, i32 accumulate)

Design (`kiln_ukr_rvv_f32_14x8`):
  * One C row = ONE register group at LMUL 2 (`<vscale x 4 x float>`, 2·VLEN/32 lanes ≥ 8 for VLEN ≥ 128),
    used with an explicit vector length evl = NR = 8 on every VP intrinsic (`llvm.vp.load`, `llvm.vp.fma`,
    `llvm.vp.store`, all-true mask): the kernel is correct for every VLEN ≥ 128 and never touches column 8+.
    LLVM emits one `vsetvli` (e32, m2, vl = 8) for the whole kernel.
  * 32 vector registers = 16 LMUL-2 groups: 14 accumulator groups + 1 for the B row + 1 spare. A is read as
    scalars (`flw` into the FP register file, 32 more registers) and used by `vfmacc.vf` — RVV's FMA takes its
    broadcast operand from a scalar register, so there is no broadcast instruction and no A vector register.
    Per k step: 1 `vle32.v` (B), 14 `flw`, 14 `vfmacc.vf`.
  * The K loop is unrolled UNROLL times, then a remainder loop (the skeleton in kiln/ukernels/aarch64.py).
What VLEN > 256 means: the 8 columns use 8 of 2·VLEN/32 lanes of a group (VLEN 512: 8 of 32, a quarter);
an implementation that executes by LMUL, not by vl, pays for the idle lanes. As for SVE, the panel width is
fixed when the weights are packed at compile time, before the VLEN is known."""
from __future__ import annotations

from kiln.ukernels.aarch64 import UNROLL, Emit, VectorOps, emit_kernel_body, signature
from kiln.ukernels.x86 import kernel_name

RVV_FAMILY = (8, 14, 8)   # ("lanes" = NR: no narrow edge kernels, main MR, NR)
VT, MT = "<vscale x 4 x float>", "<vscale x 4 x i1>"
ALL = f"{MT} splat (i1 true)"


def _rvv_ops(nr: int) -> VectorOps:
    def load(emit: Emit, dst: str, ptr: str) -> None:
        emit(f"  {dst} = call {VT} @llvm.vp.load.nxv4f32.p0(ptr align 4 {ptr}, {ALL}, i32 {nr})")

    def store(emit: Emit, val: str, ptr: str) -> None:
        emit(f"  call void @llvm.vp.store.nxv4f32.p0({VT} {val}, ptr align 4 {ptr}, {ALL}, i32 {nr})")

    def a_operands(emit: Emit, t: str, ap: str, mr: int) -> list[str]:
        out = []
        for i in range(mr):   # scalar A values, splatted: the FMA becomes vfmacc.vf with an FP register operand
            emit(f"  %{t}.asp{i} = getelementptr float, ptr {ap}, i64 {i}")
            emit(f"  %{t}.as{i} = load float, ptr %{t}.asp{i}, align 4")
            emit(f"  %{t}.ai{i} = insertelement {VT} poison, float %{t}.as{i}, i64 0")
            emit(f"  %{t}.a{i} = shufflevector {VT} %{t}.ai{i}, {VT} poison, <vscale x 4 x i32> zeroinitializer")
            out.append(f"%{t}.a{i}")
        return out

    def fma(emit: Emit, dst: str, acc: str, a: str, b: str) -> None:
        emit(f"  {dst} = call {VT} @llvm.vp.fma.nxv4f32({VT} {a}, {VT} {b}, {VT} {acc}, {ALL}, i32 {nr})")

    return VectorOps(VT, nr, load, store, a_operands, fma)


def rvv_kernel_ir(mr: int, nr: int = 8, unroll: int = UNROLL) -> str:
    """The LLVM IR of the RVV MR×NR kernel (evl = NR on an LMUL-2 group: NR ≤ 8 fits at VLEN 128)."""
    if mr < 1 or not 0 < nr <= 8:
        raise ValueError(f"bad rvv microkernel shape {mr}x{nr}: MR ≥ 1 and NR ≤ 8 (one LMUL-2 group at VLEN 128)")
    name = kernel_name("rvv", mr, nr, nr)
    out: list[str] = [signature(name) + " {", "entry:", "  %acc.on = icmp ne i32 %accumulate, 0",
                      "  br label %k.entry"]
    emit_kernel_body(out.append, "k.", mr, nr, 1, _rvv_ops(nr), unroll)
    out += ["}",
            f"declare {VT} @llvm.vp.load.nxv4f32.p0(ptr, {MT}, i32)",
            f"declare void @llvm.vp.store.nxv4f32.p0({VT}, ptr, {MT}, i32)",
            f"declare {VT} @llvm.vp.fma.nxv4f32({VT}, {VT}, {VT}, {MT}, i32)"]
    return "\n".join(out) + "\n"
