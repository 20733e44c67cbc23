"""Instruction classes as data: (mnemonic pattern, operand pattern) → class, first match wins.

Classifying by the disassembler's mnemonic (llvm-objdump with the target's vector extensions enabled) rather
than by raw encoding bits keeps the tables short and readable, in the way tinygrad keeps its instruction
tables as data. Operands matter only where the mnemonic alone is ambiguous: on AArch64 `fmla v0.4s` (vector)
vs `fmadd s0, ...` (scalar) are told apart by the mnemonic, but `ldr q0` (vector) vs `ldr x0` (scalar) and
`fadd z0.s` vs `fadd s0` only by their register operands.

The classes are the ones the ISA report counts per FLOP (CLASSES, in report order).
"""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass

VEC_FMA = "vector FMA"
VEC_ARITH = "vector arith"
VEC_MEM = "vector load/store"
VEC_CONFIG = "vector config/predicate"
SME_OUTER = "SME outer product"
SCALAR_INT = "scalar int"
SCALAR_FP = "scalar float"
SCALAR_MEM = "scalar load/store"
BRANCH = "branch"
OTHER = "other"

CLASSES: tuple[str, ...] = (VEC_FMA, VEC_ARITH, VEC_MEM, VEC_CONFIG, SME_OUTER, SCALAR_INT, SCALAR_FP, SCALAR_MEM,
                            BRANCH, OTHER)
VECTOR_CLASSES = frozenset({VEC_FMA, VEC_ARITH, VEC_MEM, VEC_CONFIG, SME_OUTER})

# (mnemonic regex, operand regex or None, class): the first rule whose patterns both match (re.search on the
# operands, re.fullmatch on the mnemonic) decides. Anything unmatched is scalar integer work.
Rule = tuple[str, str | None, str]

_A64_VREG = r"(\b[vz]\d+\.|\{\s*[vz]\d+|\bq\d+\b|\bz\d+\b|\bza)"   # NEON/SVE/SME vector operands
AARCH64_RULES: tuple[Rule, ...] = (
    (r"(bf|f|s|u|su|us)mop[as]", None, SME_OUTER),                      # SME outer products into ZA
    (r"smstart|smstop|zero", None, VEC_CONFIG),                          # streaming mode on/off, zero {za}
    (r"ptrues?|pfalse|while(lo|ls|lt|le|hi|hs|gt|ge|rw|wr)|ptest|pfirst|pnext|brk[ab]s?|brkn|brkpas?|brkpbs?"
     r"|cntp|incp|decp|sqincp|uqincp|sqdecp|uqdecp|rdvl|addvl|addpl|addsvl|rdsvl|cnt[bhwd]|inc[bhwd]|dec[bhwd]"
     r"|[su]q(inc|dec)[bhwd]|setffr|rdffrs?|wrffr", None, VEC_CONFIG),  # predicates and vector-length reads
    (r"[a-z]+", r"^\s*pn?\d+\.?[bhsdq]?\b", VEC_CONFIG),                  # anything writing a predicate register
    (r"f?n?ml[as]|fmad|fmsb|fnmad|fnmsb|bf?mmla|fmmla|[su]mmla|usmmla|bfdot|fdot|[su]dot|usdot|sudot"
     r"|bfmlal[bt]|fmlal[bt]?2?|fmlsl[bt]?2?|[su]ml[as]l[bt]?2?|mla|mls|mad|msb", _A64_VREG, VEC_FMA),
    (r"ld[1-4][a-z]*|st[1-4][a-z]*|ldnt1[a-z]*|stnt1[a-z]*|ld[fn]f1[a-z]*|ld1r[a-z]*|prf[bhwd]", None, VEC_MEM),
    (r"ldr|str|ldp|stp|ldur|stur|ldnp|stnp", _A64_VREG + r"|^\s*p\d+\b", VEC_MEM),
    (r"[a-z0-9.]+", _A64_VREG, VEC_ARITH),                                # any other op on vector registers
    (r"b|bl|br|blr|ret|cbn?z|tbn?z|b\.[a-z]+|bc\.[a-z]+|braa|blraa|retaa", None, BRANCH),
    (r"ld[a-z0-9]*|st[a-z0-9]*|prfm|prfum|swp[a-z]*|cas[a-z0-9]*", None, SCALAR_MEM),
    (r"f[a-z0-9]*|[su]cvtf", None, SCALAR_FP),
    (r"svc|brk|hlt|udf|hint|nop|yield|dmb|dsb|isb|mrs|msr|sys|sysl|wfe|wfi|sev|sevl|clrex|bti|paci[a-z]*|auti[a-z]*"
     r"|xpaclri", None, OTHER),
)

RISCV_RULES: tuple[Rule, ...] = (
    (r"vsetvli|vsetivli|vsetvl", None, VEC_CONFIG),
    (r"csrr[sw]?|csrr[sc]i?|csrw", r"\b(vl|vtype|vlenb|vstart|vxrm|vxsat|vcsr)\b", VEC_CONFIG),
    (r"vm(and|nand|andn|andnot|or|nor|orn|ornot|xor|xnor|set|clr|not|mv|sbf|sif|sof)\.m+|vcpop\.m|vpopc\.m"
     r"|vfirst\.m", None, VEC_CONFIG),                                    # mask-register work
    (r"vf?w?n?m(acc|sac|add|sub)(u|su|us)?\.(vv|vf|vx)|vfw?n?m(acc|sac|add|sub)\.(vv|vf)|vf?wmaccu?s?u?\.(vv|vf|vx)"
     r"|vfwmaccbf16\.(vv|vf)|vqmacc[a-z]*\.[a-z.]+", None, VEC_FMA),
    (r"v[ls](\d+re?\d*|e\d+(ff)?|se\d+|[uo]xei\d+|seg\d+[a-z0-9]*|sseg\d+[a-z0-9]*|[uo]xseg\d+[a-z0-9]*|m)\.v",
     None, VEC_MEM),
    (r"v[a-z0-9.]+", None, VEC_ARITH),
    (r"beqz?|bnez?|bltz?|bgez?|bltu|bgeu|blez|bgtz|bgtu?|bleu?|j|jal|jr|jalr|ret|call|tail", None, BRANCH),
    (r"lb|lh|lw|ld|lbu|lhu|lwu|sb|sh|sw|sd|flh|flw|fld|fsh|fsw|fsd|lr\.[wd][a-z.]*|sc\.[wd][a-z.]*"
     r"|amo[a-z]+\.[wd][a-z.]*", None, SCALAR_MEM),
    (r"f[a-z0-9.]*", None, SCALAR_FP),
    (r"ecall|ebreak|fence(\.i|\.tso)?|nop|unimp|csr[a-z]*|wfi|pause|prefetch\.[irw]", None, OTHER),
)

_X86_VREG = r"%[xyz]mm\d+|%k[0-7]\b"
X86_RULES: tuple[Rule, ...] = (
    (r"k[a-z]+[bwdq]?", None, VEC_CONFIG),                                # AVX-512 mask registers
    (r"v?f[n]?m(add|sub|addsub|subadd)(132|213|231)[ps][sd]|vp?dp[a-z0-9]+|vpmadd[a-z0-9]*", _X86_VREG, VEC_FMA),
    (r"v[a-z0-9]+", r"\(", VEC_MEM),                                     # any vector op with a memory operand
    (r"v[a-z0-9]+|[a-z0-9]+(ps|pd)", _X86_VREG, VEC_ARITH),
    (r"j[a-z]+|call[a-z]*|ret[a-z]*|loop[a-z]*", None, BRANCH),
    (r"(add|sub|mul|div|min|max|sqrt|cvt[a-z0-9]*|ucomi|comi|mov)s[sd]|cvt[a-z0-9]+", None, SCALAR_FP),
    (r"[a-z0-9]+", r"\(", SCALAR_MEM),
    (r"nop[a-z]*|pause|syscall|cpuid|rdtsc|ud2|int3|hlt|mfence|lfence|sfence|endbr64|lock|xgetbv|rdpid"
     r"|prefetch[a-z0-9]*", None, OTHER),
)

RULES: dict[str, tuple[Rule, ...]] = {"aarch64": AARCH64_RULES, "riscv64": RISCV_RULES, "x86_64": X86_RULES}


def arch_of(triple: str) -> str:
    """The rule-table key for an LLVM target triple."""
    head = triple.split("-", 1)[0]
    if head in ("aarch64", "arm64"):
        return "aarch64"
    if head.startswith("riscv64"):
        return "riscv64"
    if head in ("x86_64", "amd64"):
        return "x86_64"
    raise ValueError(f"no instruction classes for triple {triple!r}; known: {', '.join(RULES)}")


@dataclass(frozen=True)
class _Compiled:
    mnemonic: re.Pattern[str]
    operands: re.Pattern[str] | None
    cls: str


@functools.cache
def _compiled(arch: str) -> tuple[_Compiled, ...]:
    if arch not in RULES:
        raise ValueError(f"no instruction classes for architecture {arch!r}; known: {', '.join(RULES)}")
    return tuple(_Compiled(re.compile(m), re.compile(o) if o else None, c) for m, o, c in RULES[arch])


@functools.lru_cache(maxsize=65536)
def classify(arch: str, mnemonic: str, operands: str = "") -> str:
    """The class of one instruction, e.g. classify("riscv64", "vfmacc.vf", "v8, fa5, v16") → "vector FMA"."""
    m = mnemonic.strip().lower()
    if arch == "riscv64" and m.startswith("c."):
        m = m[2:]                                  # compressed forms count as their full instruction
    ops = operands.lower()
    for rule in _compiled(arch):
        if rule.mnemonic.fullmatch(m) and (rule.operands is None or rule.operands.search(ops)):
            return rule.cls
    return SCALAR_INT
