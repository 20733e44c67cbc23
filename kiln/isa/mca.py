"""Static throughput estimates with llvm-mca on the hot loop of each compiled kernel.

From a kernel function's assembly (LLVM's `.s` for the target) the innermost loops are found as ranges
`label … backward branch to label` that contain no other such range; the hot loop is the one with the most
vector FMAs (then the most vector instructions) — for a register-tiled MatMul/Conv that is the microkernel's
K loop, for a 1-D kernel its vectorized body. That block goes to `llvm-mca -mcpu=<model>`, which reports cycles
per iteration (its steady state over 100 iterations); FLOP per iteration are counted from the FMAs in the block
and their lane counts, so FLOP/cycle = the block's FMA throughput on that core model.

Caveats, stated in the report: llvm-mca assumes every load hits L1 and every branch is predicted; RVV blocks
need the vector type: when the loop has no `vsetvli` of its own (hoisted out of the loop) the last one before it
is passed as `# LLVM-MCA-RISCV-LMUL` / `# LLVM-MCA-RISCV-SEW` comments; no llvm-mca model schedules SME.
"""
from __future__ import annotations

import functools
import re
import subprocess
from dataclasses import dataclass

from kiln.isa.classify import VEC_FMA, VECTOR_CLASSES, arch_of, classify
from kiln.isa.counting import ToolMissing, find_tool

# the llvm-mca CPU model per architecture, and the vector length (bits) that core implements
MCA_CPU: dict[str, str] = {"x86_64": "znver4", "aarch64": "neoverse-v1", "riscv64": "sifive-x280"}
CPU_VECTOR_BITS: dict[str, int] = {"znver4": 512, "neoverse-v1": 256, "neoverse-v2": 128, "neoverse-v3": 128,
                                   "neoverse-n2": 128, "a64fx": 512, "sifive-x280": 512, "sifive-x390": 1024,
                                   "sifive-p670": 128, "spacemit-x60": 256}
MCA_MATTR: dict[str, str] = {"aarch64": "+sve,+sve2", "riscv64": "+v", "x86_64": ""}

_LABEL = re.compile(r"^([.\w$]+):")
_FUNC_TYPE = re.compile(r"^\s*\.type\s+([\w.$]+),\s*[@%]function")


MIN_MCA_VERSION = 17  # -skip-unsupported-instructions, and the znver4 / neoverse-v2 / spacemit-x60 models


@functools.cache
def mca_tool() -> str:
    tool = find_tool("llvm-mca-22", "llvm-mca")
    if tool is None:
        raise ToolMissing("llvm-mca not found (apt-get install llvm-22)")
    out = subprocess.run([tool, "--version"], capture_output=True, text=True).stdout
    m = re.search(r"LLVM version (\d+)", out)
    if m is None or int(m.group(1)) < MIN_MCA_VERSION:
        raise ToolMissing(f"{tool} is LLVM {m.group(1) if m else '?'}; the ISA analysis needs llvm-mca "
                          f"≥ {MIN_MCA_VERSION} (apt-get install llvm-22)")
    return tool


def split_instruction(line: str) -> tuple[str, str] | None:
    """(mnemonic, operands) of an assembly line, or None for labels, directives, comments and blanks."""
    s = re.split(r"\s(//|#)|^\s*(//|#)", line, maxsplit=1)[0].strip()
    if not s or s.startswith(".") or _LABEL.match(s):
        return None
    parts = s.split(None, 1)
    return parts[0], (parts[1] if len(parts) > 1 else "")


def functions(asm: str) -> dict[str, list[str]]:
    """Function name → its assembly lines (from its label to the next function)."""
    out: dict[str, list[str]] = {}
    names = {m.group(1) for m in map(_FUNC_TYPE.match, asm.splitlines()) if m}
    current: list[str] | None = None
    for line in asm.splitlines():
        m = _LABEL.match(line)
        if m and m.group(1) in names:
            current = out.setdefault(m.group(1), [])
            continue
        if current is not None:
            current.append(line)
    return out


@dataclass(frozen=True)
class Loop:
    label: str
    lines: list[str]        # the label line through the backward branch

    def instructions(self) -> list[tuple[str, str]]:
        return [x for x in map(split_instruction, self.lines) if x]


def innermost_loops(lines: list[str]) -> list[Loop]:
    """Ranges `label … branch back to label` that enclose no other such range."""
    where: dict[str, int] = {}
    for i, line in enumerate(lines):
        m = _LABEL.match(line)
        if m:
            where[m.group(1)] = i
    ranges = []
    for j, line in enumerate(lines):
        insn = split_instruction(line)
        if not insn:
            continue
        target = insn[1].replace(",", " ").split()[-1] if insn[1] else ""
        i = where.get(target)
        if i is not None and i <= j:
            ranges.append((i, j))
    inner = [r for r in ranges if not any(o != r and r[0] <= o[0] and o[1] <= r[1] for o in ranges)]
    return [Loop(lines[i].split(":")[0], lines[i:j + 1]) for i, j in sorted(set(inner))]


def hot_loop(lines: list[str], arch: str) -> Loop | None:
    """The innermost loop with the most vector FMAs, then the most vector instructions."""
    def score(loop: Loop) -> tuple[int, int]:
        classes = [classify(arch, m, o) for m, o in loop.instructions()]
        return sum(c == VEC_FMA for c in classes), sum(c in VECTOR_CLASSES for c in classes)
    loops = innermost_loops(lines)
    return max(loops, key=score) if loops else None


RvvType = tuple[str, str, int | None]   # (SEW, LMUL, immediate AVL of vsetivli or None)


def _rvv_type(mnemonic: str, operands: str) -> RvvType | None:
    """The vector type a vsetvli / vsetivli sets, e.g. `a0, a1, e32, m2, ta, ma` → ("e32", "m2", None)."""
    if mnemonic not in ("vsetvli", "vsetivli"):
        return None
    ops = [o.strip() for o in operands.split(",")]
    sew = next((o for o in ops if re.fullmatch(r"e\d+", o)), None)
    lmul = next((o for o in ops if re.fullmatch(r"mf?\d", o)), None)
    avl = int(ops[1]) if mnemonic == "vsetivli" and len(ops) > 1 and ops[1].isdigit() else None
    return (sew, lmul, avl) if sew and lmul else None


def _rvv_type_before(lines: list[str], loop: Loop) -> RvvType | None:
    """The type set by the last vsetvli before the loop in the function."""
    start = lines.index(loop.lines[0])
    for line in reversed(lines[:start]):
        insn = split_instruction(line)
        t = _rvv_type(*insn) if insn else None
        if t:
            return t
    return None


def lanes_of(arch: str, mnemonic: str, operands: str, vector_bits: int, rvv_type: RvvType | None) -> int:
    """Elements one vector instruction processes (f32 unless the operands say otherwise)."""
    ops = operands.lower()
    if arch == "x86_64":
        width = 512 if "%zmm" in ops else 256 if "%ymm" in ops else 128
        return 1 if mnemonic.endswith(("ss", "sd")) else width // (64 if mnemonic.endswith("pd") else 32)
    if arch == "aarch64":
        m = re.search(r"\bv\d+\.(\d+)([bhsd])", ops)
        if m:
            return int(m.group(1))
        m = re.search(r"\bz\d+\.([bhsd])", ops)
        bits = {"b": 8, "h": 16, "s": 32, "d": 64}[m.group(1)] if m else 32
        return vector_bits // bits
    sew, lmul, avl = rvv_type or ("e32", "m1", None)
    frac = lmul.startswith("mf")
    mult = int(lmul[2:] if frac else lmul[1:])
    vlmax = max(1, (vector_bits // int(sew[1:])) // mult if frac else (vector_bits // int(sew[1:])) * mult)
    return min(avl, vlmax) if avl is not None else vlmax


def _fma_flops(arch: str, insns: list[tuple[str, str]], bits: int, entry: RvvType | None) -> float:
    """2 × lanes summed over the FMAs of a loop body; on RVV the lanes follow the vsetvli in force at each FMA
    (at the loop's top: the last one in the body, which the back edge carries, else the one before the loop)."""
    vtype = next((t for t in (_rvv_type(m, o) for m, o in reversed(insns)) if t), None) or entry
    flops = 0.0
    for m, o in insns:
        vtype = _rvv_type(m, o) or vtype
        if classify(arch, m, o) == VEC_FMA:
            flops += 2.0 * lanes_of(arch, m, o, bits, vtype)
    return flops


@dataclass
class McaEstimate:
    function: str
    cpu: str
    instructions: int            # in the loop block
    fmas: int                    # vector (or scalar) FMA instructions in the block
    flops_per_iteration: float   # 2 × lanes per FMA
    cycles_per_iteration: float
    block_rthroughput: float
    ipc: float
    note: str = ""

    @property
    def flops_per_cycle(self) -> float:
        return self.flops_per_iteration / self.cycles_per_iteration if self.cycles_per_iteration else 0.0

    def to_dict(self) -> dict[str, object]:
        return {**self.__dict__, "flops_per_cycle": self.flops_per_cycle}


def parse_mca(text: str) -> dict[str, float]:
    out = {}
    for key, pat in (("iterations", r"Iterations:\s+(\d+)"), ("cycles", r"Total Cycles:\s+(\d+)"),
                     ("ipc", r"IPC:\s+([\d.]+)"), ("rthroughput", r"Block RThroughput:\s+([\d.]+)")):
        m = re.search(pat, text)
        if m is None:
            raise RuntimeError(f"llvm-mca output without {key!r}:\n{text[:2000]}")
        out[key] = float(m.group(1))
    return out


def run_mca(snippet: str, triple: str, cpu: str, mattr: str = "", iterations: int = 100) -> dict[str, float]:
    cmd = [mca_tool(), f"-mtriple={triple}", f"-mcpu={cpu}", f"-iterations={iterations}",
           "-skip-unsupported-instructions=any"]
    if mattr:
        cmd.append(f"-mattr={mattr}")
    proc = subprocess.run(cmd, input=snippet, capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stderr[-2000:]}")
    return parse_mca(proc.stdout)


def estimate(asm: str, function: str, triple: str, cpu: str | None = None,
             vector_bits: int | None = None, lanes: float | None = None) -> McaEstimate | None:
    """llvm-mca on the hot loop of `function` in `asm`; None when the function has no loop.

    FLOP per iteration count each FMA's lanes from its operands (x86 registers, NEON arrangements) or at the full
    vector length (SVE, RVV: vl is set at run time); `lanes` (e.g. measured: FLOPs ÷ 2·FMAs) overrides that."""
    arch = arch_of(triple)
    cpu = cpu or MCA_CPU[arch]
    bits = vector_bits or CPU_VECTOR_BITS.get(cpu, 128)
    lines = functions(asm).get(function)
    if lines is None:
        raise KeyError(f"function {function!r} not in the assembly")
    loop = hot_loop(lines, arch)
    if loop is None:
        return None
    insns = loop.instructions()
    note, header, entry = "", "", None
    if arch == "riscv64":
        entry = _rvv_type_before(lines, loop)
        if entry and not any(_rvv_type(m, o) for m, o in insns):
            header = f"# LLVM-MCA-RISCV-LMUL {entry[1].upper()}\n# LLVM-MCA-RISCV-SEW {entry[0].upper()}\n"
            note = f"vsetvli hoisted out of the loop: {entry[0]},{entry[1]} passed to llvm-mca as comments"
    fmas = sum(classify(arch, m, o) == VEC_FMA for m, o in insns)
    flops = _fma_flops(arch, insns, bits, entry) if lanes is None else 2.0 * lanes * fmas
    if lanes is not None:
        note = "; ".join(filter(None, [note, f"FLOP/cycle at the measured {lanes:.2f} lanes per FMA"]))
    body = "\n".join(f"\t{m}\t{o}" if o else f"\t{m}" for m, o in insns)
    res = run_mca(f"{header}{loop.label}:\n{body}\n", triple, cpu, MCA_MATTR.get(arch, ""))
    return McaEstimate(function, cpu, len(insns), fmas, flops, res["cycles"] / res["iterations"],
                       res["rthroughput"], res["ipc"], note)
