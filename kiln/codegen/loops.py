"""The one loop skeleton codegen emits: counted loops (kernel.py) and strip-mined scalable loops (scalable.py)."""
from __future__ import annotations

from collections.abc import Callable

from llvmlite import ir

I64 = ir.IntType(64)


def emit_loop(b: ir.IRBuilder, lo: ir.Value, hi: ir.Value, body: Callable[[ir.Value], ir.Value],
              names: tuple[str, str, str] = ("head", "body", "done")) -> None:
    """for (i = lo; i < hi; i += step) { step = body(i) } — `body` emits one iteration and returns its i64 step
    (a constant for a counted loop, the strip's length for a strip-mined one)."""
    pre = b.block
    head, loop, done = (b.append_basic_block(x) for x in names)
    b.branch(head)
    b.position_at_end(head)
    i = b.phi(I64)
    i.add_incoming(lo, pre)
    b.cbranch(b.icmp_signed("<", i, hi), loop, done)
    b.position_at_end(loop)
    step = body(i)
    i.add_incoming(b.add(i, step), b.block)
    b.branch(head)
    b.position_at_end(done)
