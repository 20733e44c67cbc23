"""The bf16 section of the ISA report: multiply-accumulates (MACs) per instruction for the bf16 dot-product
instructions, and what Kiln's own AMX tile kernel spends per MAC in its K loop.

    python -m kiln.isa.bf16

Rows:
  * AMX tdpbf16ps — Kiln's 2×2 tile kernel (kiln/ukernels/amx.py) compiled for the host CPU; its K loop (the
    innermost loop of the emitted assembly) is counted statically: instructions, tile products, MACs per iteration
    (MT·NT·MR·16·KB = 2·2·16·16·32). Cycles: Intel's documented 16 cycles per tdpbf16ps (llvm-mca's AMX model is
    not usable: it reports ≈ 50 cycles per dependent product).
  * AVX512_BF16 vdpbf16ps (zmm: 16 lanes × a pair) and AArch64 BFMMLA (a 2×4 · 4×2 block per 128-bit register:
    16 MACs) — a stream of independent instructions through llvm-mca (sapphirerapids / neoverse-v1) gives the
    reciprocal throughput. Kiln does not emit these two yet (its non-AMX bf16 path is the emulation: bf16 loads
    widened to float32 and float32 FMAs), so they are the instruction's capacity, not a Kiln kernel's.
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


def amx_loop() -> tuple[int, int, int]:
    """(instructions, tdpbf16ps, MACs) of one iteration of the 2×2 bf16 AMX kernel's K loop, as compiled here
    (LLVM may unroll it: an iteration is then several K steps of 4 products each)."""
    from kiln.codegen.jit import emit_assembly, optimize
    from kiln.target import resolve
    from kiln.ukernels.amx import amx_kernel

    kern = amx_kernel("bf16", 2, 2, 16)
    ir = kern.ir_text.replace("define internal", "define")
    asm = emit_assembly(optimize(ir, resolve("avx512")), resolve("avx512"))
    loops = innermost_loops(functions(asm)[kern.name])
    loop = max(loops, key=lambda lp: sum(m == "tdpbf16ps" for m, _ in lp.instructions()))
    insns = loop.instructions()
    products = sum(m == "tdpbf16ps" for m, _ in insns)
    return len(insns), products, products * kern.mr * 16 * kern.kb


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
    x86, a64 = "x86_64-unknown-linux-gnu", "aarch64-unknown-linux-gnu"
    return [
        Row("tdpbf16ps", "AMX-BF16", 16 * 16 * 32, n / macs, AMX_CYCLES_PER_PRODUCT,
            f"Kiln's kernel K loop (as unrolled): {n} instructions, {products} tile products; 16 cycles documented"),
        Row("vdpbf16ps zmm", "AVX512_BF16", 16 * 2, None,
            _mca("vdpbf16ps %zmm30, %zmm31, %zmm{i}", x86, "sapphirerapids"), "llvm-mca sapphirerapids"),
        Row("bfmmla", "AArch64 BF16", 2 * 2 * 4, None,
            _mca("bfmmla v{i}.4s, v30.8h, v31.8h", a64, "neoverse-v1", "+bf16"), "llvm-mca neoverse-v1"),
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
