"""The K-step walk of the batch-reduce kernels (kiln/ukernels/amx.py tile kernels, kiln/ukernels/dot.py microkernels),
as LLVM IR lines: steps s = (i2·n1 + i1)·n0 + i0 over arguments `%n2, %sa2, %n1, %sa1, %n0, %sa0`, the A offset
`%offa` advanced without divisions — by sa0 each step, plus d1 = sa1 − n0·sa0 when i0 wraps and d2 = sa2 − n1·sa1
when i1 wraps too.

    setup():    %total (the number of steps), %d1, %d2            — once, before the loop
    advance():  %s1 = s + 1, %i0n, %i1n, %offan, %more (s1 < total) — at the loop's latch; the loop header's phis
                take %s, %i0, %i1, %offa from them"""
from __future__ import annotations


def setup() -> list[str]:
    return ["  %t10 = mul i64 %n1, %n0",
            "  %total = mul i64 %t10, %n2",
            "  %n0sa0 = mul i64 %n0, %sa0",
            "  %d1 = sub i64 %sa1, %n0sa0",
            "  %n1sa1 = mul i64 %n1, %sa1",
            "  %d2 = sub i64 %sa2, %n1sa1"]


def advance() -> list[str]:
    return ["  %s1 = add i64 %s, 1",
            "  %i0p = add i64 %i0, 1",
            "  %w0 = icmp eq i64 %i0p, %n0",
            "  %i0n = select i1 %w0, i64 0, i64 %i0p",
            "  %w0i = zext i1 %w0 to i64",
            "  %i1p = add i64 %i1, %w0i",
            "  %w1 = icmp eq i64 %i1p, %n1",
            "  %i1n = select i1 %w1, i64 0, i64 %i1p",
            "  %j1 = select i1 %w0, i64 %d1, i64 0",
            "  %j2 = select i1 %w1, i64 %d2, i64 0",
            "  %oa1 = add i64 %offa, %sa0",
            "  %oa2 = add i64 %oa1, %j1",
            "  %offan = add i64 %oa2, %j2",
            "  %more = icmp slt i64 %s1, %total"]
