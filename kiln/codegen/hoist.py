"""Where the expression emitter may place integer index arithmetic (codegen/exprs.py: `ExprEmitter.hoisted`): above
the branches it stands under, once, in the block where its loop variables are bound — or in the function's entry
for the symbolic dims' own arithmetic. A division moves only where its divisor cannot be zero."""
from __future__ import annotations

import functools
from collections.abc import Iterator
from contextlib import contextmanager

from llvmlite import ir

from kiln.kernel.ir import Addr, Bin, Const, Expr, Load, LocalRef, Reduce, Select, Sym, children, is_float


@contextmanager
def emitting_in(b: ir.IRBuilder, block: ir.Block) -> Iterator[None]:
    """Emit into `block` (before its terminator, if it has one), then continue exactly where the builder was —
    llvmlite's goto_block returns to the end of the old block, past its terminator if that is where it went."""
    old, anchor = b.block, b._anchor
    nxt = old.instructions[anchor] if anchor < len(old.instructions) else None
    if block.is_terminated:
        b.position_before(block.terminator)
    else:
        b.position_at_end(block)
    try:
        yield
    finally:
        if nxt is not None:
            b.position_before(nxt)
        else:
            b.position_at_end(old)


def positive(e: Expr) -> bool:
    """Is the integer expression ≥ 1 at run time, by its form: a symbolic dim (bounds start at 1), a positive
    constant, sums and products of such, a ceiling division ⌈x / d⌉ of one (a run-time tile count), a select
    between two such (a stride of either tile order: schedule/tile.py)?"""
    if isinstance(e, Sym):
        return True
    if isinstance(e, Const):
        return e.value > 0
    if isinstance(e, Select):
        return positive(e.a) and positive(e.b)
    if not isinstance(e, Bin):
        return False
    if e.op == "*":
        return positive(e.a) and positive(e.b)
    if e.op in ("+", "max"):
        return positive(e.a) and non_negative(e.b) or non_negative(e.a) and positive(e.b)
    if e.op == "//" and isinstance(e.b, Const) and e.b.value > 0:  # (x + c) // d ≥ 1 when x ≥ 1, c ≥ d − 1
        return isinstance(e.a, Bin) and e.a.op == "+" and positive(e.a.a) and isinstance(e.a.b, Const) \
            and e.a.b.value + 1 >= e.b.value
    return False


def non_negative(e: Expr) -> bool:
    if isinstance(e, Const):
        return e.value >= 0
    return positive(e) or isinstance(e, Bin) and e.op in ("+", "*", "max") and non_negative(e.a) and non_negative(e.b)


@functools.lru_cache(maxsize=1 << 16)
def hoistable(e: Expr) -> bool:
    """May the pure expression `e` run where its operands are known rather than where it stands? Integer arithmetic
    whose every division is by a divisor never zero (a constant, a run-time tile count): a division by another
    run-time value may stand under the branch that proves it non-zero."""
    if is_float(e.dtype) or isinstance(e, (Load, LocalRef, Addr, Reduce)):
        return False
    if isinstance(e, Bin) and e.op in ("/", "//", "%") and not positive(e.b):
        return False
    return all(hoistable(k) for k in children(e))


def value_key(v: ir.Value | None) -> object:
    """A cache key for an emitted value: an integer constant by its type and value — llvmlite hashes and compares
    constants by their printed text, which was a tenth of code generation (resnet50: 33k hashes) — else the value."""
    return (id(v.type), v.constant) if isinstance(v, ir.Constant) and isinstance(v.constant, int) else v
