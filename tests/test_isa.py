"""kiln/isa: instruction classes, the QEMU counting plugin, llvm-mca estimates, and the `kiln bench --isa` section.

Tests that need the cross tools (qemu-user, the cross GCCs, llvm-objdump / llvm-mca from llvm-22) skip with the
reason when they are missing."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections import Counter

import pytest

from kiln.isa import classify as ic
from kiln.isa.analysis import MATRIX, RUNTIME, VECTOR_1D, role_of, summarize
from kiln.isa.counting import ExecutedInsn, Insn, attribute, fma_loop_addresses, parse_objdump
from kiln.isa.mca import _fma_flops, hot_loop, innermost_loops, lanes_of

# (arch, mnemonic, operands, class): the cases each table must get right, including the ambiguous ones
CASES = [
    ("aarch64", "fmla", "v0.4s, v1.4s, v2.s[1]", ic.VEC_FMA),
    ("aarch64", "fmla", "z0.s, p0/m, z1.s, z2.s", ic.VEC_FMA),
    ("aarch64", "fmadd", "s0, s1, s2, s3", ic.SCALAR_FP),
    ("aarch64", "fadd", "z0.s, z1.s, z2.s", ic.VEC_ARITH),
    ("aarch64", "fadd", "s0, s1, s2", ic.SCALAR_FP),
    ("aarch64", "ld1w", "{ z0.s }, p0/z, [x0, x8, lsl #2]", ic.VEC_MEM),
    ("aarch64", "ld1rw", "{ z1.s }, p0/z, [x1]", ic.VEC_MEM),
    ("aarch64", "ldr", "q0, [x0, #16]", ic.VEC_MEM),
    ("aarch64", "ldr", "x0, [sp, #8]", ic.SCALAR_MEM),
    ("aarch64", "ldr", "s0, [x1], #4", ic.SCALAR_MEM),
    ("aarch64", "stp", "q0, q1, [x2]", ic.VEC_MEM),
    ("aarch64", "whilelo", "p0.s, x8, x9", ic.VEC_CONFIG),
    ("aarch64", "ptrue", "p0.s", ic.VEC_CONFIG),
    ("aarch64", "fcmgt", "p1.s, p0/z, z0.s, z1.s", ic.VEC_CONFIG),
    ("aarch64", "incw", "x8", ic.VEC_CONFIG),
    ("aarch64", "fmopa", "za0.s, p0/m, p1/m, z0.s, z1.s", ic.SME_OUTER),
    ("aarch64", "smstart", "sm", ic.VEC_CONFIG),
    ("aarch64", "mov", "z0.s, s1", ic.VEC_ARITH),
    ("aarch64", "mov", "x0, x1", ic.SCALAR_INT),
    ("aarch64", "b.ne", "0x4006e4 <main+0x10>", ic.BRANCH),
    ("aarch64", "cbz", "x0, 0x400700", ic.BRANCH),
    ("aarch64", "subs", "x8, x8, #1", ic.SCALAR_INT),
    ("riscv64", "vsetvli", "a0, a1, e32, m2, ta, ma", ic.VEC_CONFIG),
    ("riscv64", "vsetivli", "zero, 8, e32, m1, ta, ma", ic.VEC_CONFIG),
    ("riscv64", "csrr", "a0, vlenb", ic.VEC_CONFIG),
    ("riscv64", "vfmacc.vf", "v8, fa5, v16", ic.VEC_FMA),
    ("riscv64", "vfmadd.vv", "v8, v9, v10", ic.VEC_FMA),
    ("riscv64", "vmacc.vx", "v8, a0, v9", ic.VEC_FMA),
    ("riscv64", "vmadc.vvm", "v0, v8, v9, v0", ic.VEC_ARITH),
    ("riscv64", "vfsub.vv", "v8, v9, v10", ic.VEC_ARITH),
    ("riscv64", "vle32.v", "v8, (a0)", ic.VEC_MEM),
    ("riscv64", "vlse32.v", "v8, (a0), a1", ic.VEC_MEM),
    ("riscv64", "vse32.v", "v8, (a0), v0.t", ic.VEC_MEM),
    ("riscv64", "vl8re32.v", "v8, (a0)", ic.VEC_MEM),
    ("riscv64", "vsext.vf2", "v8, v9", ic.VEC_ARITH),
    ("riscv64", "vmand.mm", "v0, v1, v2", ic.VEC_CONFIG),
    ("riscv64", "vfredusum.vs", "v8, v9, v10", ic.VEC_ARITH),
    ("riscv64", "flw", "fa5, 0(a1)", ic.SCALAR_MEM),
    ("riscv64", "fmadd.s", "fa0, fa1, fa2, fa3", ic.SCALAR_FP),
    ("riscv64", "c.ld", "a0, 8(sp)", ic.SCALAR_MEM),
    ("riscv64", "bnez", "a0, 0x10640", ic.BRANCH),
    ("riscv64", "addi", "a0, a0, 4", ic.SCALAR_INT),
    ("x86_64", "vfmadd231ps", "(%rax){1to16}, %zmm1, %zmm0", ic.VEC_FMA),
    ("x86_64", "vmovups", "(%rdi), %zmm2", ic.VEC_MEM),
    ("x86_64", "vaddps", "%zmm1, %zmm2, %zmm3", ic.VEC_ARITH),
    ("x86_64", "kmovw", "%eax, %k1", ic.VEC_CONFIG),
    ("x86_64", "movq", "(%rsp), %rax", ic.SCALAR_MEM),
    ("x86_64", "jne", ".LBB0_3", ic.BRANCH),
    ("x86_64", "addq", "$4, %rax", ic.SCALAR_INT),
]


@pytest.mark.parametrize("arch,mnemonic,operands,expected", CASES)
def test_classify(arch: str, mnemonic: str, operands: str, expected: str) -> None:
    assert ic.classify(arch, mnemonic, operands) == expected


def test_classify_rejects_unknown_architecture() -> None:
    with pytest.raises(ValueError, match="no instruction classes"):
        ic.arch_of("mips64-unknown-linux-gnu")
    assert ic.arch_of("riscv64-unknown-linux-gnu") == "riscv64"


def test_parse_objdump_and_attribute() -> None:
    text = ("0000000000400580 <k0_conv>:\n"
            "  400580:      \tfmla\tz0.s, p0/m, z1.s, z2.s\n"
            "  400584:      \tldr\tw1, [sp, #28]\t// 4-byte Folded Reload\n"
            "  400588:      \tb.ne\t0x400580 <k0_conv>\n"
            "000000000040058c <main>:\n"
            "  40058c:      \tret\n")
    dis = parse_objdump(text)
    assert dis[0x400584] == Insn("k0_conv", "ldr", "w1, [sp, #28]")
    prof = attribute([ExecutedInsn(0x400580, 7, b""), ExecutedInsn(0x400588, 7, b""),
                      ExecutedInsn(0x40058c, 1, b""), ExecutedInsn(0x999, 2, b"")], dis, "aarch64")
    assert prof.by_function["k0_conv"] == Counter({ic.VEC_FMA: 7, ic.BRANCH: 7})
    assert prof.by_function["main"] == Counter({ic.BRANCH: 1})
    assert prof.total == 17   # the address outside the disassembly is kept, as "other"


def test_roles_and_summary() -> None:
    assert role_of("k3_conv") == MATRIX and role_of("k3_conv.par0") == MATRIX
    assert role_of("k7_packedmatmul") == MATRIX and role_of("k9_softmax") == VECTOR_1D
    assert role_of("k2_pool") == VECTOR_1D and role_of("kiln_main") == RUNTIME
    counts = {"k0_matmul.par0": Counter({ic.VEC_FMA: 100, ic.VEC_MEM: 20}), "k1_add": Counter({ic.VEC_ARITH: 30,
              ic.SCALAR_INT: 10}), "kiln_main": Counter({ic.BRANCH: 2}), "main": Counter({ic.SCALAR_INT: 99})}
    s = summarize(counts, {"k0_matmul.par0", "k1_add", "kiln_main"}, flops=3200.0)
    assert s["kiln_instructions"] == 162 and s["outside_instructions"] == 99
    assert s["per_flop"][ic.VEC_FMA] == pytest.approx(100 / 3200)
    assert s["share_1d"] == pytest.approx(40 / 162)
    assert s["share_1d_vector"] == pytest.approx(30 / 150)
    assert s["lanes_per_fma"] == pytest.approx(16.0)
    assert list(s["per_kernel"]) == ["k0_matmul", "k1_add", "kiln_main"]


ASM = """\
	.type	k0_matmul,@function
k0_matmul:
	vsetvli	a4, zero, e32, m2, ta, ma
.LBB0_1:
	addi	a0, a0, 1
.LBB0_2:
	vle32.v	v8, (a1)
	vfmacc.vf	v4, fa5, v8
	vfmacc.vf	v6, fa4, v8
	bne	a2, a3, .LBB0_2
	bne	a0, a5, .LBB0_1
.LBB0_3:
	vsetivli	zero, 4, e32, m1, ta, ma
	vfadd.vv	v8, v8, v9
	bnez	a2, .LBB0_3
	ret
"""


def test_innermost_and_hot_loop() -> None:
    from kiln.isa.mca import functions
    lines = functions(ASM)["k0_matmul"]
    loops = innermost_loops(lines)
    assert [lp.label for lp in loops] == [".LBB0_2", ".LBB0_3"]      # .LBB0_1 encloses .LBB0_2: not innermost
    hot = hot_loop(lines, "riscv64")
    assert hot is not None and hot.label == ".LBB0_2"
    # vl: the hoisted `vsetvli a4, zero, e32, m2` = VLMAX = 512/32·2 lanes at VLEN 512
    assert _fma_flops("riscv64", hot.instructions(), 512, ("e32", "m2", None)) == 2 * 2 * 32
    assert lanes_of("riscv64", "vfmacc.vf", "", 256, ("e32", "m1", 4)) == 4          # vsetivli AVL 4
    assert lanes_of("aarch64", "fmla", "v0.4s, v1.4s, v2.4s", 256, None) == 4        # NEON: from the arrangement
    assert lanes_of("aarch64", "fmla", "z0.s, p0/m, z1.s, z2.s", 256, None) == 8     # SVE at VL 256
    assert lanes_of("x86_64", "vfmadd231ps", "%zmm1, %zmm2, %zmm3", 512, None) == 16


def _need(*tools: str) -> None:
    missing = [t for t in tools if shutil.which(t) is None]
    if missing:
        pytest.skip(f"needs {', '.join(missing)} (apt-get install qemu-user gcc-aarch64-linux-gnu "
                    "gcc-riscv64-linux-gnu llvm-22)")


def test_mca_znver4_fma_block() -> None:
    """Eight independent 512-bit FMAs: 256 FLOP per iteration; Zen 4 issues one 512-bit FMA per cycle, so
    llvm-mca's znver4 model must put the block at ≥ 8 cycles (and not wildly above)."""
    from kiln.isa.counting import ToolMissing
    from kiln.isa.mca import estimate, mca_tool
    try:
        mca_tool()
    except ToolMissing as exc:
        pytest.skip(str(exc))
    body = "".join(f"\tvfmadd231ps\t%zmm{30}, %zmm{31}, %zmm{i}\n" for i in range(8))
    asm = f"\t.type\tf,@function\nf:\n.LBB0_1:\n{body}\tdecq\t%rax\n\tjne\t.LBB0_1\n\tretq\n"
    est = estimate(asm, "f", "x86_64-unknown-linux-gnu", "znver4")
    assert est is not None and est.fmas == 8 and est.flops_per_iteration == 256
    assert 8.0 <= est.cycles_per_iteration <= 12.0
    assert est.flops_per_cycle <= 32.0 + 1e-9          # Zen 4's f32 FMA peak per core


# a loop of N vector FMAs, for each ISA: (cross gcc, -march, qemu, cpu, the FMA and the one-time setup)
PROGRAMS = {
    "aarch64": ("aarch64-linux-gnu-gcc", "armv8.2-a+sve", "qemu-aarch64", "max,sve-default-vector-length=32",
                "fmla z0.s, p0/m, z1.s, z2.s", "ptrue p0.s"),
    "riscv64": ("riscv64-linux-gnu-gcc", "rv64gcv", "qemu-riscv64", "rv64,v=true,vlen=256,elen=64,vext_spec=v1.0",
                "vfmacc.vv v0, v1, v2", "vsetvli t0, zero, e32, m1, ta, ma"),
}


@pytest.mark.parametrize("arch", sorted(PROGRAMS))
def test_plugin_counts_exactly(arch: str, tmp_path, monkeypatch) -> None:
    from kiln.isa.counting import disassemble, run_counted
    gcc, march, qemu, cpu, fma, setup = PROGRAMS[arch]
    _need(gcc, qemu, "gcc")
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "cache"))
    n = 1234
    src = tmp_path / "fma.c"
    src.write_text(f'int main(void) {{\n  __asm__ volatile("{setup}");\n'
                   f'  for (int i = 0; i < {n}; i++) __asm__ volatile("{fma}");\n  return 0;\n}}\n')
    exe = str(tmp_path / "fma")
    subprocess.run([gcc, "-O1", f"-march={march}", "-static", str(src), "-o", exe], check=True)
    try:
        disasm = disassemble(exe, arch)
    except RuntimeError as exc:
        pytest.skip(str(exc))
    executed = run_counted([qemu, "-cpu", cpu, exe], str(tmp_path))
    prof = attribute(executed, disasm, arch)
    main = prof.by_function["main"]
    assert main[ic.VEC_FMA] == n                 # exact: one inline counter per executed instruction
    assert main[ic.VEC_CONFIG] == 1
    assert main[ic.BRANCH] == n + 1              # the loop's back edge n times, and the return
    assert prof.classes()[ic.VEC_FMA] == n       # libc runs no vector FMA
    loop = fma_loop_addresses(disasm, arch, {"main"})
    assert sum(e.count for e in executed if e.address in loop) == 3 * n   # FMA, counter update, back edge


def test_bench_isa_section(tmp_path, monkeypatch) -> None:
    """`kiln bench --isa-only` on one small workload and one cross target: the section is in every report
    format, the emulated run's outputs were right, and the counts are consistent with the FLOPs."""
    _need("qemu-riscv64", "riscv64-linux-gnu-gcc", "gcc")
    from kiln.bench.cli import main
    from kiln.isa.counting import find_tool
    if find_tool("llvm-objdump-22", "llvm-objdump") is None or find_tool("llvm-mca-22", "llvm-mca") is None:
        pytest.skip("needs llvm-objdump and llvm-mca (apt-get install llvm-22)")
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "cache"))
    out = {ext: str(tmp_path / f"r.{ext}") for ext in ("json", "md", "html")}
    rc = main(["--isa-only", "--workloads", "gemm_odd", "--isa-targets", "riscv64-rvv", "--isa-strategies",
               "direct", "--isa-vlen", "256", "--quiet", "--json", out["json"], "--md", out["md"],
               "--html", out["html"]])
    assert rc == 0
    isa = json.loads(open(out["json"]).read())["info"]["isa"]
    rec = next(r for r in isa["records"] if r["target"] == "riscv64-rvv")
    assert rec["status"] == "ok", rec.get("reason")
    assert rec["max_rel_err"] <= 1e-3
    # every MAC is an f32 lane of some vector FMA: FLOPs = 2 × lanes × FMAs, 1 ≤ lanes ≤ VLEN/32
    assert 1.0 <= rec["lanes_per_fma"] <= 256 / 32
    assert rec["share_1d"] == 0.0                # one MatMul: no 1-D kernel
    assert 0.0 < rec["share_matrix_outside_fma_loops"] < 0.5   # most of a GEMM's instructions are its FMA loops
    assert rec["mca"] and rec["mca"][0]["role"] == MATRIX and rec["mca"][0]["cycles_per_iteration"] > 0
    host = next(r for r in isa["records"] if r["target"] == "host")
    from kiln.target import host as host_target
    assert host["status"] == "static" and host["mca"][0]["instructions"] > 0
    # (an SSE-only host has no FMA: its GEMM's hot loop multiplies and adds apart)
    assert host["mca"][0]["fmas"] > 0 or not host_target().has_fma
    md = open(out["md"]).read()
    assert "## ISA analysis" in md and "| riscv64-rvv | direct | ok |" in md
    assert "ISA analysis" in open(out["html"]).read()
    assert os.path.getsize(out["html"]) > 0


def test_isa_report_renders_strategies_side_by_side() -> None:
    from kiln.isa.report import HEADER, to_html, to_markdown
    counted = {"workload": "w", "target": "riscv64-rvv", "strategy": "direct", "flops": 2e6, "status": "ok",
               "vlen": 256, "instructions_per_flop": 0.25, "per_flop": {ic.VEC_FMA: 0.0625}, "lanes_per_fma": 8.0,
               "share_1d": 0.1, "share_1d_vector": 0.2, "outside_instructions": 1000,
               "mca": [{"role": MATRIX, "kernel": "k0_matmul", "function": "k0_matmul", "cpu": "sifive-x280",
                        "cycles_per_iteration": 4.0, "instructions": 9, "fmas": 4, "flops_per_cycle": 16.0}]}
    missing = {"workload": "w", "target": "riscv64-rvv", "strategy": "ukernel", "flops": 2e6,
               "status": "unavailable", "reason": "no RVV microkernel"}
    isa = {"records": [missing, counted]}
    md = "\n".join(to_markdown(isa))
    rows = [line for line in md.splitlines() if line.startswith("| riscv64-rvv")]
    assert [r.split(" | ")[1] for r in rows] == ["direct", "ukernel"]            # direct first, then ukernel
    assert all(r.count("|") == len(HEADER) + 1 for r in rows)                   # every row has every column
    assert "| 0.0625 |" in rows[0] and "10.0%" in rows[0] and "16.0 FLOP/cyc" in rows[0]
    assert "riscv64-rvv / ukernel: unavailable — no RVV microkernel" in md
    assert "no RVV microkernel" in to_html(isa)


def test_isa_report_low_precision_sections() -> None:
    """`kiln bench --isa --precision int8,bf16`: the int8 section (direct and microkernel per ISA) and the bf16 one,
    in the Markdown and the HTML report."""
    from kiln.bench.cli import low_precision_tables
    from kiln.isa.report import to_html, to_markdown

    isa = {"records": [], **low_precision_tables(["fp32", "int8", "bf16"])}
    assert set(isa) == {"records", "int8", "bf16"}
    md = "\n".join(to_markdown(isa))
    assert "### int8: instructions per 8-bit multiply-accumulate" in md and "### bf16:" in md
    assert "| AArch64 NEON + i8mm | ukernel | microkernel kiln_ukr_i8mm_s8s8_" in md
    page = to_html(isa)
    assert "<td>microkernel kiln_ukr_vnni512_u8s8_" in page and "<td>tdpbf16ps</td>" in page
    assert low_precision_tables(["fp32"]) == {}
