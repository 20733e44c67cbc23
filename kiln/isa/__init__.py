"""Instruction-level analysis of Kiln's generated code (`kiln bench --isa`).

  * plugin.c / counting.py — dynamic instruction counts per address under QEMU (a TCG plugin Kiln builds),
    mapped onto the binary's disassembly per function;
  * classify.py — instruction classes as data tables (AArch64 incl. SVE/SME, RISC-V incl. RVV, x86-64);
  * mca.py — llvm-mca throughput estimates of a kernel's hot loop;
  * analysis.py — one workload × target × strategy: counts per FLOP, 1-D vector vs matrix work, llvm-mca;
  * report.py — the ISA section of the bench report (Markdown, HTML).
"""
