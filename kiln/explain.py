"""`kiln explain`: every IR level of a model, and for one node its kernel, LLVM IR and assembly."""
from __future__ import annotations

import re
from typing import Any

import onnx

from kiln.compiler import default_threads, lower
from kiln.target import resolve

RULE = "─" * 100


def _function_text(llvm: str, name: str) -> str:
    """The text of one function (and its outlined parallel workers) from a module."""
    out = []
    for m in re.finditer(r"^define [^\n]*@\"?(" + re.escape(name) + r"(\.par\d+)?)\"?\(.*?^}", llvm, re.M | re.S):
        out.append(m.group(0))
    return "\n\n".join(out) or f"(function {name} not found)"


def _asm_of(asm: str, name: str) -> str:
    """The assembly of a kernel function and its outlined parallel workers."""
    found = re.findall(r"^\"?" + re.escape(name) + r"(?:\.par\d+)?\"?:.*?(?=^\s*\.Lfunc_end)", asm, re.M | re.S)
    return "\n".join(found) or f"(assembly of {name} not found)"


def explain(model: onnx.ModelProto, node: str | None = None, stages: list[str] | None = None,
            num_threads: int | None = None, target: str = "host", strategy: str = "direct",
            strategies: dict[str, str] | None = None, **options: Any) -> str:
    stages = stages or ["graph", "kernel", "llvm", "asm"]
    tgt = resolve(target)
    parts: list[str] = []

    def trace(stage: str, obj: Any) -> None:
        if "graph" in stages and (stage == "import" or stage.startswith("graph:")):
            parts.append(f"{RULE}\n== graph IR after {stage.removeprefix('graph:')}\n{obj}")

    c = lower(model, tgt, num_threads or default_threads(), dict(options), trace=trace, strategy=strategy,
              strategies=strategies)
    prog = c.program
    idx = 0
    if node:
        hits = [i for i, g in enumerate(prog.groups) if any(n.name == node or n.op == node for n in g.nodes)]
        if not hits:
            raise ValueError(f"no kernel contains a node named or typed {node!r}")
        idx = hits[0]
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
        from kiln.codegen.jit import emit_assembly, optimize
        asm = emit_assembly(optimize(c.llvm_ir, tgt), tgt)
        parts.append(f"{RULE}\n== {tgt.cpu} assembly of {fn} (after LLVM -O3)\n{_asm_of(asm, fn)}")
    parts.append(f"{RULE}\ncompile stages: " + ", ".join(f"{k} {v:.2f}s" for k, v in c.timings.items()))
    return "\n".join(parts)
