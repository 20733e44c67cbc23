"""Dynamic instruction counts: QEMU (user mode) runs a static binary with Kiln's TCG plugin (plugin.c), which
dumps per executed address its execution count and encoding; the addresses are then mapped onto the binary's
disassembly (`llvm-objdump -d --mattr=…`: function symbol, mnemonic, operands) and classified with the tables
in classify.py, per function.

    counts = run_counted(["qemu-riscv64", "-cpu", "rv64,v=true,vlen=256", "./model"], workdir)
    profile = attribute(counts, disassemble("./model", "riscv64"), "riscv64")
    profile.by_function["k3_conv"]["vector FMA"]  → how many vector FMAs kernel k3 executed

Counts are exact for one guest thread (QEMU's inline add is not atomic across threads): run the model
single-threaded when counting.
"""
from __future__ import annotations

import bisect
import hashlib
import os
import re
import shutil
import subprocess
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from kiln.cachedir import atomic_path
from kiln.isa.classify import classify

PLUGIN_SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "plugin.c")
UNDISASSEMBLED = "<not in the disassembly>"

# what llvm-objdump must be told so that vector/matrix extensions disassemble instead of printing <unknown>
OBJDUMP_MATTR = {
    "aarch64": "+sve,+sve2,+sme,+sme-f64f64,+sme-i16i64,+bf16,+i8mm,+f32mm,+f64mm,+dotprod,+fullfp16",
    "riscv64": "+m,+a,+f,+d,+c,+v,+zfh,+zvfh,+zba,+zbb,+zbs,+zicsr,+zifencei,+zvl128b",
    "x86_64": "",
}


class ToolMissing(RuntimeError):
    """A host tool the ISA analysis needs is not installed; the message says which and how to get it."""


def find_tool(*names: str) -> str | None:
    for n in names:
        p = shutil.which(n)
        if p:
            return p
    return None


def objdump() -> str:
    tool = find_tool("llvm-objdump-22", "llvm-objdump")
    if tool is None:
        raise ToolMissing("llvm-objdump not found (apt-get install llvm-22)")
    return tool


def qemu_for(arch: str) -> str:
    tool = find_tool(f"qemu-{arch}")
    if tool is None:
        raise ToolMissing(f"qemu-{arch} not found (apt-get install qemu-user)")
    return tool


def missing_tools(arch: str) -> str | None:
    """Why dynamic counting cannot run for `arch` here, or None when everything is installed."""
    try:
        qemu_for(arch)
        objdump()
        if find_tool("gcc", "cc") is None:
            raise ToolMissing("no host C compiler (gcc) to build the QEMU plugin")
    except ToolMissing as exc:
        return str(exc)
    return None


def _cache_dir() -> str:
    from kiln.compiler import cache_dir
    d = os.path.join(cache_dir(), "isa")
    os.makedirs(d, exist_ok=True)
    return d


def plugin_path() -> str:
    """The plugin shared object, built with the host C compiler on first use (keyed by its source's hash)."""
    with open(PLUGIN_SOURCE, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()[:12]
    out = os.path.join(_cache_dir(), f"kiln-isa-plugin-{digest}.so")
    if os.path.exists(out):
        return out
    cc = find_tool("gcc", "cc")
    if cc is None:
        raise ToolMissing("no host C compiler (gcc) to build the QEMU plugin")
    with atomic_path(out) as tmp:
        proc = subprocess.run([cc, "-O2", "-shared", "-fPIC", "-fvisibility=hidden", "-Wall", "-o", tmp,
                               PLUGIN_SOURCE, "-lpthread"], capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"building the QEMU plugin failed:\n{proc.stderr}")
    return out


def plugin_args(counts_path: str) -> list[str]:
    """QEMU command-line arguments that load the counting plugin and make it write to `counts_path`."""
    if "," in counts_path:
        raise ValueError(f"QEMU plugin arguments are comma-separated: the path {counts_path!r} may not contain ','")
    return ["-plugin", f"{plugin_path()},out={counts_path}"]


@dataclass(frozen=True)
class ExecutedInsn:
    address: int
    count: int
    encoding: bytes


def read_counts(path: str) -> list[ExecutedInsn]:
    out = []
    with open(path) as f:
        for line in f:
            addr, count, _size, enc = line.split()
            out.append(ExecutedInsn(int(addr, 16), int(count), bytes.fromhex(enc)))
    return out


def run_counted(cmd: Sequence[str], workdir: str, env: dict[str, str] | None = None,
                timeout: float = 1800.0) -> list[ExecutedInsn]:
    """Run `cmd` (qemu-<arch> …args… program …) with the plugin inserted after the qemu executable."""
    counts = os.path.join(workdir, "isa-counts.txt")
    if os.path.exists(counts):
        os.remove(counts)
    full = [cmd[0], *plugin_args(counts), *cmd[1:]]
    proc = subprocess.run(full, cwd=workdir, capture_output=True, text=True, timeout=timeout, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(full)} exited with {proc.returncode}:\n{proc.stderr[-2000:]}")
    if not os.path.exists(counts):
        raise RuntimeError(f"the QEMU plugin wrote no counts ({counts}); stderr:\n{proc.stderr[-2000:]}")
    return read_counts(counts)


@dataclass(frozen=True)
class Insn:
    function: str
    mnemonic: str
    operands: str


_SYMBOL = re.compile(r"^([0-9a-f]+) <(.+)>:\s*$")
_COMMENT = re.compile(r"\s+(//|#\s).*$")
_INSN = re.compile(r"^\s*([0-9a-f]+):\s*(?:[0-9a-f]{2}(?: [0-9a-f]{2})*\s+)?\t(\S+)(?:\t(.*))?$")


def parse_objdump(text: str) -> dict[int, Insn]:
    """Address → (function, mnemonic, operands) from `llvm-objdump -d --no-show-raw-insn` output."""
    out: dict[int, Insn] = {}
    fn = "?"
    for line in text.splitlines():
        m = _SYMBOL.match(line)
        if m:
            fn = m.group(2)
            continue
        m = _INSN.match(line)
        if m:
            ops = _COMMENT.sub("", m.group(3) or "")   # `// =0x10` (AArch64), `# 0x10` (x86); `#16` is an immediate
            out[int(m.group(1), 16)] = Insn(fn, m.group(2), ops.strip())
    return out


def disassemble(binary: str, arch: str, mattr: str | None = None) -> dict[int, Insn]:
    mattr = OBJDUMP_MATTR.get(arch, "") if mattr is None else mattr
    cmd = [objdump(), "-d", "--no-show-raw-insn"] + ([f"--mattr={mattr}"] if mattr else []) + [binary]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stderr[-2000:]}")
    return parse_objdump(proc.stdout)


@dataclass
class Profile:
    """Dynamic instruction counts per function and class (and per mnemonic, for looking closer)."""
    arch: str
    by_function: dict[str, Counter[str]] = field(default_factory=dict)
    mnemonics: dict[str, Counter[str]] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return sum(sum(c.values()) for c in self.by_function.values())

    def classes(self, functions: Sequence[str] | None = None) -> Counter[str]:
        out: Counter[str] = Counter()
        for fn, c in self.by_function.items():
            if functions is None or fn in functions:
                out.update(c)
        return out


def attribute(executed: Sequence[ExecutedInsn], disasm: dict[int, Insn], arch: str) -> Profile:
    prof = Profile(arch)
    for e in executed:
        insn = disasm.get(e.address)
        fn = insn.function if insn else UNDISASSEMBLED
        cls = classify(arch, insn.mnemonic, insn.operands) if insn else "other"
        prof.by_function.setdefault(fn, Counter())[cls] += e.count
        prof.mnemonics.setdefault(fn, Counter())[insn.mnemonic if insn else "?"] += e.count
    return prof


_TARGET = re.compile(r"\b0x([0-9a-f]+)\b")


def fma_loop_addresses(disasm: dict[int, Insn], arch: str, functions: set[str] | None = None) -> set[int]:
    """Addresses inside innermost loops that contain a vector FMA (or SME outer product): a matrix kernel's
    reduction loops. A loop is a backward branch's range [target, branch] within one function; innermost = it
    encloses no other. What a matrix kernel executes outside these (tile setup, packing, edge tiles, the fused
    epilogue, stores) is the part that is not multiply-accumulate. `functions`: only look inside these."""
    from kiln.isa.classify import BRANCH, SME_OUTER, VEC_FMA
    addrs = sorted(a for a, i in disasm.items() if functions is None or i.function in functions)
    ranges: dict[str, list[tuple[int, int]]] = {}
    for a in addrs:
        insn = disasm[a]
        if classify(arch, insn.mnemonic, insn.operands) != BRANCH:
            continue
        m = _TARGET.search(insn.operands)
        target = int(m.group(1), 16) if m else None
        if target is not None and target <= a and target in disasm and disasm[target].function == insn.function:
            ranges.setdefault(insn.function, []).append((target, a))
    inner = [r for rs in ranges.values() for r in rs
             if not any(o != r and r[0] <= o[0] and o[1] <= r[1] for o in rs)]
    out: set[int] = set()
    for lo, hi in inner:
        span = addrs[bisect.bisect_left(addrs, lo):bisect.bisect_right(addrs, hi)]
        if any(classify(arch, disasm[a].mnemonic, disasm[a].operands) in (VEC_FMA, SME_OUTER) for a in span):
            out.update(span)
    return out
