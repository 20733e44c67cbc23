"""Reading x86 machine code back (AT&T syntax, as LLVM prints it): the loops of a function, its hot loop, and
the instruction mix — what `kiln explain --strategy all` shows per strategy.

The hot loop is the innermost loop (a backward branch to a label, containing no other loop) with the most
vector FMAs; ties go to the longer loop. Classes are rules as data, first match wins."""
from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

CLASSES = ("vector FMA", "vector load", "vector store", "vector other", "scalar FP", "scalar int", "scalar memory",
           "branch")

_VREG = re.compile(r"%[xyz]mm\d+|%k\d")
_DOT = re.compile(r"^v?p?dp[a-z0-9]+$|^vpmadd")  # vpdpbusd, vpdpwssd, vdpbf16ps, vpmaddwd: no scalar forms


@dataclass(frozen=True)
class Insn:
    mnemonic: str
    operands: str

    @property
    def text(self) -> str:
        return f"{self.mnemonic}\t{self.operands}".rstrip()


def _mem_dest(i: Insn) -> bool:  # AT&T: the destination is the last operand
    ops = i.operands.rsplit(",", 1)
    return "(" in ops[-1]


# (predicate, class): first match wins
RULES: list[tuple[Callable[[Insn], bool], str]] = [
    (lambda i: i.mnemonic.startswith("j") or i.mnemonic in ("call", "ret", "loop"), "branch"),
    (lambda i: "broadcast" in i.mnemonic and "(" in i.operands, "vector load"),  # vbroadcastss mem: a load
    # multiply-accumulates: the 8-bit / 16-bit / bf16 dot products (before the scalar rule: vpdpbusd ends in "sd"),
    # then float FMAs — an int8 kernel's hot loop is the one with the most of these, not the longest
    (lambda i: bool(_VREG.search(i.operands)) and _DOT.search(i.mnemonic) is not None, "vector FMA"),
    (lambda i: bool(_VREG.search(i.operands)) and re.search(r"(ss|sd)$", i.mnemonic) is not None
        and "broadcast" not in i.mnemonic, "scalar FP"),
    (lambda i: bool(_VREG.search(i.operands)) and re.search(r"fn?m(add|sub)", i.mnemonic) is not None, "vector FMA"),
    (lambda i: bool(_VREG.search(i.operands)) and "(" in i.operands and _mem_dest(i), "vector store"),
    (lambda i: bool(_VREG.search(i.operands)) and "(" in i.operands, "vector load"),
    (lambda i: bool(_VREG.search(i.operands)), "vector other"),
    (lambda i: "(" in i.operands, "scalar memory"),
    (lambda i: True, "scalar int"),
]


def classify(i: Insn) -> str:
    return next(cls for pred, cls in RULES if pred(i))


def parse(asm: str) -> list[Insn | str]:
    """Instructions and labels (as strings ending in ':') in order; directives and comments dropped."""
    out: list[Insn | str] = []
    for raw in asm.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        if line.endswith(":"):
            out.append(line[:-1].strip('"'))
        elif not line.startswith("."):
            mnem, _, ops = line.partition("\t") if "\t" in line else line.partition(" ")
            out.append(Insn(mnem.strip(), ops.strip()))
    return out


def loops(items: list[Insn | str]) -> list[tuple[int, int]]:
    """(first, last) item index of every loop: a branch back to a label above it."""
    where = {x: i for i, x in enumerate(items) if isinstance(x, str)}
    found = []
    for i, x in enumerate(items):
        if isinstance(x, Insn) and x.mnemonic.startswith("j"):
            tgt = x.operands.strip()
            if tgt in where and where[tgt] < i:
                found.append((where[tgt], i))
    return found


def hot_loop(asm: str) -> list[Insn]:
    """The innermost loop with the most vector FMAs, then (SSE has none) vector multiplies, then the longest; [] for
    straight-line code. (A Winograd product fused with its input transform holds the transform's loop too: longer,
    without a multiply.)"""
    items = parse(asm)
    ls = loops(items)
    inner = [(a, b) for a, b in ls if not any(a <= c and d <= b and (c, d) != (a, b) for c, d in ls)]
    best: list[Insn] = []
    best_key = (-1, -1, -1)
    for a, b in inner:
        body = [x for x in items[a:b + 1] if isinstance(x, Insn)]
        key = (sum(classify(i) == "vector FMA" for i in body), sum("mulp" in i.mnemonic for i in body), len(body))
        if key > best_key:
            best, best_key = body, key
    return best


_STACK_VECTOR = re.compile(r"\(%rsp\)(\{1to\d+\})?,.*%[xyz]mm|%[xyz]mm\d+,\s*-?\d*\(%rsp\)")


def vector_spills(insns: list[Insn]) -> int:
    """Vector instructions that read or write a stack slot (a spill, a reload, or a reload folded into an FMA):
    in a hot loop they are the register allocator running out of vector registers. Kiln's tiles are sized to fit
    (schedule/tile.py), so one here is a schedule — or LLVM's scheduling of it — asking for more."""
    return sum(bool(_STACK_VECTOR.search(i.operands)) for i in insns)


def mix(insns: list[Insn]) -> dict[str, int]:
    counts = Counter(classify(i) for i in insns)
    return {c: counts.get(c, 0) for c in CLASSES}


def function_asm(asm: str, names: list[str]) -> str:
    """The assembly of the named functions (each up to its .Lfunc_end label); outlined `.parN` workers of a
    name are included."""
    found = []
    for name in names:
        found += re.findall(r"^\"?" + re.escape(name) + r"(?:\.par\d+)?\"?:.*?(?=^\s*\.Lfunc_end)", asm, re.M | re.S)
    return "\n".join(found)
