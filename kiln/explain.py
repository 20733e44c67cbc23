"""`kiln explain`: every IR level of a model, and for one node its kernel, LLVM IR and assembly."""
from __future__ import annotations

import re
from typing import Any

import onnx

from kiln.asm import CLASSES, function_asm, hot_loop, mix, vector_spills
from kiln.compiler import default_threads, lower
from kiln.target import resolve

RULE = "─" * 100


def _definitions(llvm: str, names: str) -> list[str]:
    """The text of each function of the module whose name matches the regex `names`."""
    return [m.group(0) for m in re.finditer(r"^define [^\n]*@\"?(" + names + r")\"?\(.*?^}", llvm, re.M | re.S)]


def _function_text(llvm: str, name: str) -> str:
    """The text of one function (and its outlined parallel workers) from a module; and of the kernel families they
    call (codegen/families.py: a member's body is a call to its family's function)."""
    out = _definitions(llvm, re.escape(name) + r"(\.par\d+)?")
    for family in dict.fromkeys(re.findall(r'call void @"([^"]+\.family)"\(', "\n".join(out))):
        out += _definitions(llvm, re.escape(family))
    return "\n\n".join(out) or f"(function {name} not found)"


def _asm_of(asm: str, name: str) -> str:
    """The assembly of a kernel function and its outlined parallel workers, and of the kernel families they call
    (a member's worker loads its family's address, `….family@GOTOFF`, and calls it)."""
    text = function_asm(asm, [name])
    if not text:
        return f"(assembly of {name} not found)"
    families = list(dict.fromkeys(re.findall(r"\$([\w.$]+\.family)@", text)))
    return "\n".join([text, function_asm(asm, families)]) if families else text


def _kernel_index(prog: Any, node: str | None) -> int:
    if not node:
        return 0
    hits = [i for i, g in enumerate(prog.groups) if any(n.name == node or n.op == node for n in g.nodes)]
    if not hits:
        raise ValueError(f"no kernel contains a node named or typed {node!r}")
    return hits[0]


def compare_strategies(model: onnx.ModelProto, node: str | None, num_threads: int | None = None,
                       target: str = "host", **options: Any) -> str:
    """For one anchor node: the loop nest and the hot loop each available strategy builds, and the instruction
    mix of that hot loop (a microkernel's loop is in its own function; a library's is not Kiln's code)."""
    from kiln.autostrategy import candidates
    from kiln.codegen.jit import emit_assembly, optimize

    tgt = resolve(target)
    threads = num_threads or default_threads()
    proto = model
    rows: list[tuple[str, dict[str, int], int]] = []
    parts: list[str] = []
    for s in candidates(tgt):
        # only the chosen node changes strategy; without --node, the whole model does
        c = lower(proto, tgt, threads, dict(options), strategy="direct" if node else s,
                  strategies={node: s} if node else None)
        idx = _kernel_index(c.program, node)
        k = c.program.kernels[idx]
        built = ", ".join(f"{n}: {how}" for n, how in k.strategies.items()) or "no anchor in this kernel"
        asm = emit_assembly(optimize(c.llvm_ir, tgt), tgt)
        fns = [c.kernel_functions[idx]] + sorted(k.extern_ir) + sorted(k.shared_ir)
        loop = hot_loop(function_asm(asm, fns))
        counts = mix(loop)
        where = "in " + ", ".join(k.symbols) + " (library code, not shown)" if k.symbols and not loop else \
            f"{len(loop)} instructions"
        parts.append(f"{RULE}\n== strategy {s} (built: {built})\n-- loop nest\n{k}\n-- hot loop: {where}\n"
                     + "\n".join("    " + i.text for i in loop[:60]) + ("\n    …" if len(loop) > 60 else ""))
        rows.append((s, counts, vector_spills(loop)))
    # spills: vector instructions on a stack slot — the tile asked for more registers than LLVM had (kiln/asm.py)
    head = f"{'strategy':16s}" + "".join(f"{c:>14s}" for c in CLASSES) + f"{'FMA/load':>10s}{'spills':>8s}"
    lines = [head]
    for s, counts, spills in rows:
        loads = counts["vector load"] or 0
        ratio = f"{counts['vector FMA'] / loads:.2f}" if loads else "–"
        lines.append(f"{s:16s}" + "".join(f"{counts[c]:14d}" for c in CLASSES) + f"{ratio:>10s}{spills:8d}")
    parts.append(f"{RULE}\n== instruction mix of each hot loop (static, one iteration)\n" + "\n".join(lines))
    return "\n".join(parts)


def explain(model: onnx.ModelProto, node: str | None = None, stages: list[str] | None = None,
            num_threads: int | None = None, target: str = "host", strategy: str = "direct",
            strategies: dict[str, str] | None = None, precision: str = "fp32", **options: Any) -> str:
    stages = stages or ["graph", "kernel", "llvm", "asm"]
    tgt = resolve(target)
    parts: list[str] = []

    def trace(stage: str, obj: Any) -> None:
        if "graph" in stages and (stage == "import" or stage.startswith("graph:")):
            parts.append(f"{RULE}\n== graph IR after {stage.removeprefix('graph:')}\n{obj}")

    c = lower(model, tgt, num_threads or default_threads(), dict(options), trace=trace, strategy=strategy,
              strategies=strategies, precision=precision)
    prog = c.program
    idx = _kernel_index(prog, node)
    k, group = prog.kernels[idx], prog.groups[idx]
    if "kernel" in stages:
        parts.append(f"{RULE}\n== kernels ({len(prog.kernels)}, {len(set(c.kernel_functions))} distinct functions); "
                     f"arena {c.plan.arena_bytes / 2**20:.2f} MiB (without reuse {c.plan.naive_bytes / 2**20:.2f} MiB)")
        parts.append("\n".join(f"  {kk.name:28s} ← {', '.join(n.name for n in g.nodes)}"
                               for kk, g in zip(prog.kernels, prog.groups)))
        parts.append(f"{RULE}\n== kernel {k.name}: fused nodes {[n.name for n in group.nodes]}\n"
                     f"-- compute definitions\n" + "\n".join(str(x) for x in k.computes) +
                     f"\n-- scheduled loop nest\n{k}")
    fn = c.kernel_functions[idx]
    if "llvm" in stages:
        parts.append(f"{RULE}\n== LLVM IR of {fn} (as emitted)\n{_function_text(c.llvm_ir, fn)}")
    if "asm" in stages:
        from kiln.codegen.jit import emit_assembly, opt_level, optimize
        level = opt_level(c.program.dims is not None)
        asm = emit_assembly(optimize(c.llvm_ir, tgt, level), tgt)
        parts.append(f"{RULE}\n== {tgt.cpu} assembly of {fn} (after LLVM -O{level})\n{_asm_of(asm, fn)}")
    parts.append(f"{RULE}\ncompile stages: " + ", ".join(f"{k} {v:.2f}s" for k, v in c.timings.items()))
    return "\n".join(parts)
