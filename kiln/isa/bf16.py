"""The bf16 section of the ISA report: multiply-accumulates (MACs) per instruction for the bf16 dot-product
instructions, and what Kiln's own AMX tile kernel spends per MAC in its K loop.

    python -m kiln.isa.bf16

Rows:
  * AMX tdpbf16ps — Kiln's 2×2 tile kernel (kiln/ukernels/amx.py) compiled for the host CPU; its K loop (the
    innermost loop of the emitted assembly) is counted statically: instructions, tile products, MACs per iteration
    (MT·NT·MR·16·KB = 2·2·16·16·32). Cycles: Intel's documented 16 cycles per tdpbf16ps (llvm-mca's AMX model is
    not usable: it reports ≈ 50 cycles per dependent product).
  * AVX512_BF16 vdpbf16ps (zmm: 16 lanes × a pair) — Kiln's register tile (kiln/schedule/bf16.py) on a 256³ bf16
    GEMM built for an AVX-512 CPU with AVX512_BF16 (on any host: only the object is emitted); the K loop's
    instructions per MAC counted the same way. Cycles: llvm-mca (sapphirerapids) on a stream of independent
    instructions (the reciprocal throughput).
  * the emulation (bf16 loads widened to float32, vfmadd231ps) — the same GEMM on the same CPU with the switch
    `dpbf16` off: what an AVX-512 CPU without AVX512_BF16 or AMX runs.
  * vdpbf16ps in Kiln's bf16 microkernel (strategy ukernel, kiln/ukernels/dot.py), compiled alone, its K loop.
  * AArch64 BFMMLA (a 2×4 · 4×2 block per 128-bit register: 16 MACs): Kiln's BFMMLA microkernel's K loop (strategy
    ukernel) and direct emission's tile with its rows in pairs (schedule/mmla.py); BFDOT (a pair per float32
    lane: 8 MACs), the direct tile with the switch `mmla` off; cycles through llvm-mca (neoverse-v1).
  * FMA fp32 (zmm vfmadd231ps) for scale."""
from __future__ import annotations

from dataclasses import dataclass

from kiln.isa.mca import functions, innermost_loops, run_mca

AMX_CYCLES_PER_PRODUCT = 16   # tdpbf16ps 16×16×32 on Sapphire Rapids (Intel optimization manual)


@dataclass(frozen=True)
class Row:
    instruction: str
    isa: str
    macs_per_instruction: int
    loop_instructions_per_mac: float | None   # Kiln's kernel loop: all its instructions / MACs (None: not emitted)
    cycles_per_instruction: float | None      # reciprocal throughput
    source: str

    @property
    def macs_per_cycle(self) -> float | None:
        return self.macs_per_instruction / self.cycles_per_instruction if self.cycles_per_instruction else None


def amx_loop(dtype: str = "bf16") -> tuple[int, int, int]:
    """(instructions, tile products, MACs) of one iteration of the 2×2 AMX kernel's K loop for `dtype` (bf16:
    tdpbf16ps; u8s8: tdpbusd, the int8 section's row), as compiled here (LLVM may unroll it: an iteration is then
    several K steps of 4 products each)."""
    from kiln.codegen.jit import emit_assembly, optimize
    from kiln.target import resolve
    from kiln.ukernels.amx import DTYPES, amx_kernel

    kern = amx_kernel(dtype, 2, 2, 16)
    op = DTYPES[dtype][2]
    ir = kern.ir_text.replace("define internal", "define")
    asm = emit_assembly(optimize(ir, resolve("avx512")), resolve("avx512"))
    loops = innermost_loops(functions(asm)[kern.name])
    loop = max(loops, key=lambda lp: sum(m == op for m, _ in lp.instructions()))
    insns = loop.instructions()
    products = sum(m == op for m, _ in insns)
    return len(insns), products, products * kern.mr * 16 * kern.kb


def gemm_loop(dpbf16: bool, size: int = 256) -> tuple[int, int]:
    """(instructions, MACs) of one iteration of the hot K loop of Kiln's bf16 GEMM tile, built for an AVX-512 CPU
    with AVX512_BF16 (vdpbf16ps, or the emulation with `dpbf16` off). MACs: 32 per vdpbf16ps, 16 per vfmadd."""
    from kiln.target import resolve, with_features

    t = with_features(resolve("avx512"), "avx512bf16", "avx512vl")
    op, per = ("vdpbf16ps", 32) if dpbf16 else ("vfmadd231ps", 16)
    return _tile_loop(t, {"dpbf16": dpbf16, "amx": False}, op, per, size)


def aarch64_gemm_loop(mmla: bool, size: int = 256) -> tuple[int, int]:
    """The same for AArch64 NEON with BF16: direct emission's block tile (BFMMLA, 16 MACs: schedule/mmla.py), or with
    the switch `mmla` off its pair dot product (BFDOT, 8 MACs)."""
    import dataclasses

    from kiln.target import resolve

    t = dataclasses.replace(resolve("aarch64-neon"), features="+neon,+fp-armv8,+bf16")
    op, per = ("bfmmla", 16) if mmla else ("bfdot", 8)
    return _tile_loop(t, {"mmla": mmla}, op, per, size)


def _tile_loop(t, options: dict[str, bool], op: str, per: int, size: int) -> tuple[int, int]:  # noqa: ANN001
    """(instructions, MACs) of the innermost loop with the most `op` of a size³ bf16 GEMM built for target t."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    from kiln.codegen.jit import emit_assembly, optimize
    from kiln.compiler import lower

    w = numpy_helper.from_array(np.ones((size, size), np.float32), "w")
    g = helper.make_graph([helper.make_node("MatMul", ["a", "w"], ["y"])], "gemm",
                          [helper.make_tensor_value_info("a", TensorProto.FLOAT, [size, size])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [size, size])], [w])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    low = lower(model, t, 1, options, precision="bf16", stop_after="llvm")
    asm = emit_assembly(optimize(low.llvm_ir, t), t)
    loops = [lp for lines in functions(asm).values() for lp in innermost_loops(lines)]
    loop = max(loops, key=lambda lp: sum(m == op for m, _ in lp.instructions()))
    insns = loop.instructions()
    return len(insns), per * sum(m == op for m, _ in insns)


def ukernel_loop(method: str, target: str, features: str, op: str) -> tuple[int, int]:
    """(instructions, `op` instructions) of one iteration of the K loop of Kiln's bf16 microkernel `method`
    (kiln/ukernels/dot.py: a whole tile, its main MR and two-vector NR) compiled alone for `target` + `features`."""
    import dataclasses

    from kiln.codegen.jit import emit_assembly, optimize
    from kiln.target import resolve
    from kiln.ukernels.dot import METHODS, dot_ukernel

    lanes, mr = METHODS[method]
    kern = dot_ukernel(method, "bf16", mr, 2 * lanes)
    t = resolve(target)
    t = dataclasses.replace(t, features=t.features + "," + features)
    asm = emit_assembly(optimize(kern.ir_text.replace("define internal", "define"), t), t)
    loops = innermost_loops(functions(asm)[kern.name + ".whole"])
    loop = max(loops, key=lambda lp: sum(m == op for m, _ in lp.instructions()))
    insns = loop.instructions()
    return len(insns), sum(m == op for m, _ in insns)


def _mca(line: str, triple: str, cpu: str, mattr: str = "") -> float | None:
    """Reciprocal throughput of one instruction: a block of 8 independent copies (distinct accumulators)."""
    try:
        out = run_mca("\n".join(line.format(i=i) for i in range(8)), triple, cpu, mattr)
    except Exception:  # llvm-mca missing or not modelling the instruction: the row says so (None)
        return None
    cycles = out.get("rthroughput")
    return cycles / 8 if cycles else None


def table() -> list[Row]:
    n, products, macs = amx_loop()
    dp, emu = gemm_loop(True), gemm_loop(False)
    uk_dp = ukernel_loop("dpbf16_512", "avx512", "+avx512bf16,+avx512vl", "vdpbf16ps")
    uk_mm = ukernel_loop("bfmmla", "aarch64-neon", "+bf16", "bfmmla")
    a_mm, a_dot = aarch64_gemm_loop(True), aarch64_gemm_loop(False)
    x86, a64 = "x86_64-unknown-linux-gnu", "aarch64-unknown-linux-gnu"
    return [
        Row("tdpbf16ps", "AMX-BF16", 16 * 16 * 32, n / macs, AMX_CYCLES_PER_PRODUCT,
            f"Kiln's kernel K loop (as unrolled): {n} instructions, {products} tile products; 16 cycles documented"),
        Row("vdpbf16ps zmm", "AVX512_BF16", 16 * 2, dp[0] / dp[1],
            _mca("vdpbf16ps %zmm30, %zmm31, %zmm{i}", x86, "sapphirerapids"),
            f"Kiln's register tile K loop: {dp[0]} instructions, {dp[1] // 32} vdpbf16ps; llvm-mca sapphirerapids"),
        Row("vfmadd231ps zmm (bf16 emulated)", "AVX-512", 16, emu[0] / emu[1],
            _mca("vfmadd231ps %zmm30, %zmm31, %zmm{i}", x86, "sapphirerapids"),
            f"Kiln's emulated tile K loop (dpbf16 off): {emu[0]} instructions, {emu[1] // 16} FMAs"),
        Row("vdpbf16ps zmm (microkernel)", "AVX512_BF16", 16 * 2, uk_dp[0] / (32 * uk_dp[1]),
            _mca("vdpbf16ps %zmm30, %zmm31, %zmm{i}", x86, "sapphirerapids"),
            f"Kiln's microkernel (strategy ukernel) K loop: {uk_dp[0]} instructions, {uk_dp[1]} vdpbf16ps"),
        Row("bfmmla", "AArch64 BF16", 2 * 2 * 4, uk_mm[0] / (16 * uk_mm[1]),
            _mca("bfmmla v{i}.4s, v30.8h, v31.8h", a64, "neoverse-v1", "+bf16"),
            f"Kiln's BFMMLA microkernel (strategy ukernel) K loop: {uk_mm[0]} instructions, {uk_mm[1]} bfmmla; "
            "llvm-mca neoverse-v1"),
        Row("bfmmla (direct)", "AArch64 BF16", 2 * 2 * 4, a_mm[0] / a_mm[1],
            _mca("bfmmla v{i}.4s, v30.8h, v31.8h", a64, "neoverse-v1", "+bf16"),
            f"Kiln's register tile, rows in pairs (direct emission) K loop: {a_mm[0]} instructions, "
            f"{a_mm[1] // 16} bfmmla"),
        Row("bfdot (direct, mmla off)", "AArch64 BF16", 4 * 2, a_dot[0] / a_dot[1],
            _mca("bfdot v{i}.4s, v30.8h, v31.8h", a64, "neoverse-v1", "+bf16"),
            f"Kiln's register tile with the switch mmla off: {a_dot[0]} instructions, {a_dot[1] // 8} bfdot"),
        Row("vfmadd231ps zmm", "AVX-512 fp32", 16, None,
            _mca("vfmadd231ps %zmm30, %zmm31, %zmm{i}", x86, "sapphirerapids"), "llvm-mca sapphirerapids"),
    ]


def format_table(rows: list[Row]) -> str:
    out = ["| instruction | ISA | MACs / instruction | Kiln loop instructions / MAC | cycles / instruction | "
           "MACs / cycle | source |", "|---|---|---:|---:|---:|---:|---|"]
    for r in rows:
        ipm = f"{r.loop_instructions_per_mac:.2e}" if r.loop_instructions_per_mac else "not emitted"
        cpi = f"{r.cycles_per_instruction:g}" if r.cycles_per_instruction else "·"
        mpc = f"{r.macs_per_cycle:g}" if r.macs_per_cycle else "·"
        out.append(f"| {r.instruction} | {r.isa} | {r.macs_per_instruction} | {ipm} | {cpi} | {mpc} | {r.source} |")
    return "\n".join(out)


if __name__ == "__main__":
    print(format_table(table()))
