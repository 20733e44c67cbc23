"""The int8 section of the ISA report: instructions per 8-bit multiply-accumulate in the integer anchors' hot loop,
per ISA, from the compiled assembly (static), with llvm-mca's steady-state MACs per cycle.

    python -m kiln.isa.int8 [--m 64 --k 256 --n 64]

Workload: a QLinearMatMul M×K × K×N (u8/s8 activations, s8 weights). For each target the hot loop is the innermost
loop (kiln/isa/mca.py) with the most dot-product instructions; MACs per iteration count each dot instruction's
8-bit products from its register width:

    x86  vpdpbusd zmm/ymm/xmm           64 / 32 / 16 MACs   (AVX-512 VNNI, AVX-VNNI)
         pmaddwd  zmm/ymm/xmm           32 / 16 / 8         (the no-VNNI fallback: int16 pairs)
    AArch64 sdot v.4s                   16                  (dotprod)
            smmla v.4s                  32                  (i8mm: a 2×2 block of 8-byte dot products)
            smlal/smlal2 v.4s / v.8h    4 / 8               (plain NEON: widening multiply-accumulate)

Each target twice: `direct` (the register tile, schedule/int8.py, codegen/int8.py) and `ukernel` (the hand-written
8-bit microkernel, kiln/ukernels/dot.py, where the target has one), the same hot-loop count on each's assembly;
and AMX's tdpbusd tile kernel (16·16·64 MACs per instruction), counted alone, at Intel's documented 16 cycles.
An SVE target's packed integer GEMMs run the NEON rows above (the tile is a fixed-width loop there). RVV is not in the
table (its MACs per instruction depend on the run-time vl): its integer anchors run the plain integer loops, which LLVM
vectorizes into widening multiply-adds (vwmacc.vx / vwmaccsu.vx: one 8-bit weight times a vector of activations per
instruction), tested exact under qemu (tests/test_ops_quant.py)."""
from __future__ import annotations

import argparse
import re
from dataclasses import dataclass

import numpy as np
import onnx

DOT = [  # (arch, mnemonic regex, MACs by register class or a fixed count)
    ("x86_64", re.compile(r"^vpdpbusds?$"), {"zmm": 64, "ymm": 32, "xmm": 16}),
    ("x86_64", re.compile(r"^v?pmaddwd$"), {"zmm": 32, "ymm": 16, "xmm": 8}),
    ("aarch64", re.compile(r"^[su]dot$"), {"": 16}),
    ("aarch64", re.compile(r"^(s|u|us)mmla$"), {"": 32}),
    ("aarch64", re.compile(r"^[su]mlal2?$"), {".8h": 8, ".4s": 4, ".2d": 2}),
]
# (label, target name, features turned on beside the target's own, or off: "-name"). Each row turns on (or off) the
# dot product it names: an x86 width alone has it or not by the host (an AVX2 host's emit-only avx512 target is
# x86-64-v4, no VNNI; Zen 4 has no AVX-VNNI at 256 bits) — static analysis, nothing of it runs
CONFIGS: list[tuple[str, str, tuple[str, ...]]] = [
    ("x86 AVX-512 VNNI (avx512)", "avx512", ("avx512vnni",)),
    ("x86 AVX-VNNI (avx2)", "avx2", ("avxvnni",)),
    ("x86 AVX2, no VNNI (avx2, as Zen 3)", "avx2", ("-avxvnni", "-avx512vnni")),
    ("x86 SSE, no VNNI (sse)", "sse", ()),
    ("AArch64 NEON + dotprod", "aarch64-neon", ("dotprod",)),
    ("AArch64 NEON + i8mm", "aarch64-neon", ("dotprod", "i8mm")),
    ("AArch64 NEON", "aarch64-neon", ()),
]


def qmatmul_model(m: int, k: int, n: int) -> onnx.ModelProto:
    from onnx import helper, numpy_helper
    r = np.random.default_rng(0)
    consts = {"as": np.array(0.02, np.float32), "az": np.array(3, np.uint8),
              "b": r.integers(-128, 128, (k, n)).astype(np.int8), "bs": np.array(0.01, np.float32),
              "bz": np.array(0, np.int8), "ys": np.array(0.5, np.float32), "yz": np.array(1, np.uint8)}
    node = helper.make_node("QLinearMatMul", ["a", "as", "az", "b", "bs", "bz", "ys", "yz"], ["y"])
    g = helper.make_graph([node], "qmatmul", [helper.make_tensor_value_info("a", onnx.TensorProto.UINT8, [m, k])],
                          [helper.make_tensor_value_info("y", onnx.TensorProto.UINT8, [m, n])],
                          [numpy_helper.from_array(v, name) for name, v in consts.items()])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


def macs_of(arch: str, mnemonic: str, operands: str) -> int:
    if mnemonic.startswith("{") and operands:  # an encoding prefix ({vex} vpdpbusd: AVX-VNNI)
        mnemonic, operands = (operands.split(None, 1) + [""])[:2]
    for a, pat, widths in DOT:
        if a == arch and pat.match(mnemonic.strip()):
            return next((v for reg, v in widths.items() if reg in operands), 0)
    return 0


@dataclass
class Int8Row:
    label: str
    strategy: str   # direct | ukernel
    method: str
    loop_instructions: int
    macs: int
    cycles: float | None

    @property
    def instructions_per_mac(self) -> float:
        return self.loop_instructions / self.macs if self.macs else float("nan")


def analyze(label: str, target: str, features: tuple[str, ...], m: int, k: int, n: int,
            strategy: str = "direct") -> Int8Row | None:
    """The row of one target and strategy; None for `ukernel` where the target has no int8 microkernel."""
    from kiln.codegen.int8 import dot_method
    from kiln.codegen.jit import emit_assembly, optimize
    from kiln.compiler import lower
    from kiln.isa.classify import arch_of
    from kiln.isa.mca import MCA_CPU, MCA_MATTR, functions, innermost_loops, run_mca
    from kiln.target import resolve, with_features, without_features

    on, off = [f for f in features if f[0] != "-"], [f[1:] for f in features if f[0] == "-"]
    tgt = with_features(resolve(target), *on) if on else resolve(target)
    tgt = without_features(tgt, *off) if off else tgt
    # AMX off: an AMX host would put both strategies on its tile kernels (amx_row counts those)
    c = lower(qmatmul_model(m, k, n), tgt, 1, {"amx": False}, strategy=strategy, stop_after="llvm")
    built = {how for kern in c.program.kernels for how in kern.strategies.values()}
    if strategy == "ukernel" and built != {"ukernel"}:
        return None
    method = dot_method(tgt) if strategy == "direct" else "microkernel " + next(
        name for kern in c.program.kernels for name in kern.extern_ir if name.startswith("kiln_ukr_"))
    asm = emit_assembly(optimize(c.llvm_ir, tgt), tgt)
    arch = arch_of(tgt.triple)
    best, best_macs = None, 0
    for lines in functions(asm).values():
        for loop in innermost_loops(lines):
            macs = sum(macs_of(arch, mn, ops) for mn, ops in loop.instructions())
            if macs > best_macs:
                best, best_macs = loop, macs
    if best is None:
        return Int8Row(label, strategy, method, 0, 0, None)
    insns = best.instructions()
    cycles = None
    try:
        cpu = "sapphirerapids" if arch == "x86_64" else MCA_CPU[arch]
        body = "\n".join(f"\t{mn}\t{o}" if o else f"\t{mn}" for mn, o in insns)
        res = run_mca(f"{best.label}:\n{body}\n", tgt.triple, cpu, MCA_MATTR.get(arch, ""))
        cycles = res["cycles"] / res["iterations"]
    except Exception:  # noqa: BLE001  (llvm-mca missing or rejecting the block: the static count stands alone)
        cycles = None
    return Int8Row(label, strategy, method, len(insns), best_macs, cycles)


def amx_row() -> Int8Row:
    """Kiln's 2×2 AMX int8 tile kernel (kiln/ukernels/amx.py, what the integer anchors run on an AMX host: schedule/
    amx.py): its K loop counted statically; cycles: Intel's documented 16 per tdpbusd (16×16×64 MACs)."""
    from kiln.isa.bf16 import AMX_CYCLES_PER_PRODUCT, amx_loop
    n, products, macs = amx_loop("u8s8")
    return Int8Row("x86 AMX-INT8 (tile kernel)", "ukernel", "tdpbusd 2×2 tiles (kiln/ukernels/amx.py)", n, macs,
                   products * AMX_CYCLES_PER_PRODUCT)


def report(m: int = 64, k: int = 256, n: int = 64) -> list[Int8Row]:
    rows = [analyze(label, t, f, m, k, n, s) for label, t, f in CONFIGS for s in ("direct", "ukernel")]
    return [r for r in rows if r is not None] + [amx_row()]


def markdown(rows: list[Int8Row]) -> str:
    out = ["| ISA | strategy | 8-bit dot product | hot-loop instructions | MACs / iteration | instructions per MAC | "
           "MACs / cycle (llvm-mca) |", "|---|---|---|---:|---:|---:|---:|"]
    for r in rows:
        mpc = f"{r.macs / r.cycles:.1f}" if r.cycles else "·"
        out.append(f"| {r.label} | {r.strategy} | {r.method} | {r.loop_instructions} | {r.macs} | "
                   f"{r.instructions_per_mac:.3g} | {mpc} |")
    return "\n".join(out)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--m", type=int, default=64)
    p.add_argument("--k", type=int, default=256)
    p.add_argument("--n", type=int, default=64)
    a = p.parse_args()
    print(markdown(report(a.m, a.k, a.n)))


if __name__ == "__main__":
    main()
