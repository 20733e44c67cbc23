"""store_beside: a compute's `also` buffers (kernel/ir.py `Compute.also`) written where its schedule writes its output.

Every Store of the output gets a twin that reads the element back and stores it, converted to the `also` buffer's
element type, at the same index (the buffers have one shape) — in the epilogue, where the value was just stored:

    before:  b0[n, c, h, w] = max($acc[mi] + b3[c] + b2[n, c, h, w], 0)
    after:   b0[n, c, h, w] = max($acc[mi] + b3[c] + b2[n, c, h, w], 0)
             b1[n, c, h, w] = bfloat16(b0[n, c, h, w])         (forwarded from the store: no memory access)

Read back, not re-evaluated: the output may share its storage with an input the value reads (runtime/memory.py
`in_place`: the residual sum written over the residual), which the first Store has just overwritten. A nest that
hands the output's address to a call (a microkernel or library routine writing it, no epilogue Store after it) is
not rewritten: the caller appends a conversion loop of its own after the nest."""
from __future__ import annotations

from dataclasses import replace

from kiln.kernel.ir import Addr, Call, Cast, Compute, If, Load, Loop, Stmt, Store, walk


def written_by_call(stmts: list[Stmt], buf: str) -> bool:
    """Does a Call in the nest take an address into `buf`?"""
    for s in stmts:
        if isinstance(s, Call) and any(isinstance(x, Addr) and x.buf == buf for a in s.args for x in walk(a)):
            return True
        if isinstance(s, Loop) and written_by_call(s.body, buf):
            return True
        if isinstance(s, If) and (written_by_call(s.body, buf) or written_by_call(s.orelse, buf)):
            return True
    return False


def store_beside(stmts: list[Stmt], c: Compute, dtypes: dict[str, str]) -> list[Stmt]:
    """`stmts` with a twin after each Store of `c.out` for each buffer of `c.also` (`dtypes`: their element types)."""
    out: list[Stmt] = []
    for s in stmts:
        if isinstance(s, Loop):
            out.append(replace(s, body=store_beside(s.body, c, dtypes)))
        elif isinstance(s, If):
            out.append(replace(s, body=store_beside(s.body, c, dtypes), orelse=store_beside(s.orelse, c, dtypes)))
        elif isinstance(s, Store) and s.buf == c.out:
            stored = Load(s.buf, s.index, s.value.dtype)
            out += [s, *(Store(b, s.index, Cast(dtypes[b], stored)) for b in c.also)]
        else:
            out.append(s)
    return out


def stores_of(stmts: list[Stmt], buf: str) -> int:
    n = 0
    for s in stmts:
        if isinstance(s, Store) and s.buf == buf:
            n += 1
        elif isinstance(s, Loop):
            n += stores_of(s.body, buf)
        elif isinstance(s, If):
            n += stores_of(s.body, buf) + stores_of(s.orelse, buf)
    return n
