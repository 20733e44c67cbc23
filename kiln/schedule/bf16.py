"""The bf16 anchors' register tile on AVX512_BF16 (`vdpbf16ps`), for hosts without AMX (Zen 4, Cooper Lake) and for
anchors the AMX schedule does not take.

A bf16 anchor (graph/passes/precision.py) reads its weights in VNNI pair order, so its compute is

    out[.., m, n] = epilogue(Σ_{r…, k} A(m, r…, k) · Bv[.., k // 2, n, k % 2])        A, Bv bfloat16; Σ in float32

which is the integer anchors' dot-product form with pairs instead of 4-byte groups. The nest is their tile
(schedule/int8.py: dot_tile), a float32 accumulator per row and vector, the innermost reduction axis taken 2 at a
time:

    before:  for k in 0..K:  for mi in 0..MR unroll:  $acc[mi] += A(m, k) · Bv[.., k // 2, ni, k % 2]   # 2 FMAs / pair
    after:   for k2 in 0..K/2:  for mi in 0..MR unroll:
                 $acc[mi] = dot2($acc[mi], A(m, 2·k2), Bv[.., k2, ni, 0])     # one vdpbf16ps per zmm, A pair broadcast
             [K odd: the last product as a plain multiply-add]

Half the instructions of the emulation per multiply-add (which widens each bf16 operand and issues one FMA per
product), and B read as stored (no stride-2 shuffles). Returns None — the anchor is then emulated — where the
target has no vdpbf16ps form (AVX2/SSE widths, cross ISAs), the form does not match (an A whose pairs are not
contiguous: NCHW-input convs; MatMuls of two activations, whose B is not in pairs), or the switch `dpbf16`, the
register tile or vectorization is off."""
from __future__ import annotations

from kiln.kernel.ir import Bin, Compute, Kernel, Load, Reduce, Stmt, walk
from kiln.schedule.config import Decisions
from kiln.schedule.dot_form import DotForm, grouped_reads
from kiln.schedule.int8 import dot_tile
from kiln.target import Target, dpbf16_widths


def bf16_form(c: Compute) -> DotForm | None:
    reds = [e for e in walk(c.body) if isinstance(e, Reduce)]
    if len(reds) != 1 or reds[0].op != "sum" or reds[0].dtype != "float32":
        return None
    body = reds[0].body
    if not (isinstance(body, Bin) and body.op == "*" and isinstance(body.a, Load) and isinstance(body.b, Load)):
        return None
    if body.a.dtype != "bfloat16" or body.b.dtype != "bfloat16":
        return None
    return grouped_reads(reds[0], body.a, body.b, 2)


def schedule_dpbf16(k: Kernel, c: Compute, tag: str, target: Target, threads: int,
                    options: dict[str, bool], dec: Decisions | None = None) -> list[Stmt] | None:
    """The vdpbf16ps tile of a bf16 anchor, or None (see the module docstring)."""
    if not options.get("dpbf16", True) or not dpbf16_widths(target):
        return None
    if not (options.get("register_tile", True) and options.get("vectorize", True)):
        return None
    if not all(h in c.hints for h in ("nr", "m_axis", "n_axis")) or bf16_form(c) is None:
        return None
    if c.hints["nr"] % min(dpbf16_widths(target)):
        return None
    nest, block = dot_tile(c, tag, target, threads if options.get("parallel", True) else 1, bf16_form, dec,
                           options.get("mmla", True), options.get("thread_parts", True))
    k.precision[str(c.hints.get("node", c.out))] = block or ("bfdot" if target.arch == "aarch64" else "avx512bf16")
    return nest
