"""The one loop skeleton codegen emits: counted loops (kernel.py) and strip-mined scalable loops (scalable.py); and
what the scalable and SME emitters call back into (`NestEmitter`: kernel.py's KernelEmitter), so that they need not
import kernel.py, which imports them."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

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


class NestEmitter(Protocol):
    """The kernel emitter as scalable.py and sme.py use it: emit statements, stack slots, counted loops."""
    m: ir.Module
    name: str
    n_par: int

    def stmts(self, b: ir.IRBuilder, em: Any, body: list[Any]) -> None: ...

    def entry_alloca(self, b: ir.IRBuilder, t: ir.Type) -> ir.Value: ...

    def counted(self, b: ir.IRBuilder, lo: ir.Value, hi: ir.Value, step: int,
                body: Callable[[ir.Value], None]) -> None: ...


def entry_alloca(b: ir.IRBuilder, t: ir.Type) -> ir.Value:
    """A stack slot allocated once, in the function's entry block: mem2reg turns such slots (accumulators) into
    registers, and an alloca anywhere else is a dynamic one, taken again each time control passes it — in the thread
    pool's endless wait loop that leaked 16 bytes of the worker's stack per job until it ran out (a SIGSEGV inside
    a kernel after about half a million parallel loops)."""
    entry = b.function.entry_basic_block
    with b.goto_block(entry):
        if entry.instructions:
            b.position_before(entry.instructions[0])
        return b.alloca(t)
