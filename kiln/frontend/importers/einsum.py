"""Einsum: diagonals, sums, then pairwise contractions as batched MatMuls."""
from __future__ import annotations

import numpy as np

from kiln.frontend.context import Ctx
from kiln.frontend.importers.registry import _scalar, importer
from kiln.graph.ir import Value


# -- Einsum: diagonals, sums, then pairwise contractions as batched MatMuls -----------------------------------
def _einsum_terms(cx: Ctx, eq: str, ranks: list[int]) -> tuple[list[list[str]], list[str]]:
    eq = eq.replace(" ", "")
    lhs, arrow, rhs = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(ranks):
        raise cx.unsupported(f"equation {eq!r} names {len(terms)} operands, got {len(ranks)}")
    ell_rank = max((r - len(t.replace("...", "")) for t, r in zip(terms, ranks) if "..." in t), default=0)
    ell = [f"@{i}" for i in range(ell_rank)]  # broadcast (ellipsis) dims, right-aligned across operands
    out_terms = []
    for t, r in zip(terms, ranks):
        head, dots, tail = t.partition("...")
        n = r - len(head) - len(tail) if dots else 0
        letters = list(head) + (ell[ell_rank - n:] if dots else []) + list(tail)
        if len(letters) != r:
            raise cx.unsupported(f"term {t!r} does not match an operand of rank {r}")
        out_terms.append(letters)
    if arrow:
        head, dots, tail = rhs.partition("...")
        out = list(head) + (ell if dots else []) + list(tail)
    else:
        counts: dict[str, int] = {}
        for t in out_terms:
            for ch in t:
                counts[ch] = counts.get(ch, 0) + 1
        out = ell + sorted(ch for ch, k in counts.items() if k == 1 and not ch.startswith("@"))
    return out_terms, out


def _einsum_prepare(cx: Ctx, v: Value, letters: list[str], keep: set[str]) -> tuple[Value, list[str]]:
    """Take repeated letters' diagonals and sum away letters nothing else needs."""
    while len(set(letters)) < len(letters):
        ch = next(c for c in letters if letters.count(c) > 1)
        p = letters.index(ch)
        q = letters.index(ch, p + 1)
        n = v.shape[p]
        eye = np.zeros([n if i in (p, q) else 1 for i in range(len(letters))], dtype=bool)
        eye[tuple(np.arange(n) if i in (p, q) else 0 for i in range(len(letters)))] = True
        v = cx.add("Reduce", [cx.add("Where", [cx.constant(eye), v, _scalar(cx, 0, v)])], kind="sum", axes=(q,),
                   keepdims=False)
        letters = letters[:q] + letters[q + 1:]
    drop = tuple(i for i, ch in enumerate(letters) if ch not in keep)
    if drop:
        v = cx.add("Reduce", [v], kind="sum", axes=drop, keepdims=False)
        letters = [ch for ch in letters if ch in keep]
    return v, letters


def _permute(cx: Ctx, v: Value, letters: list[str], order: list[str]) -> Value:
    perm = tuple(letters.index(ch) for ch in order)
    return cx.add("Transpose", [v], perm=perm) if perm != tuple(range(len(perm))) else v


@importer("Einsum")
def imp_einsum(cx: Ctx, ins: list[Value | None]) -> list[Value]:
    vals = [v for v in ins if v is not None]
    terms, out = _einsum_terms(cx, cx.attr("equation"), [len(v.shape) for v in vals])
    size: dict[str, int] = {}
    for v, t in zip(vals, terms):
        for ch, d in zip(t, v.shape):
            if size.get(ch, 1) != 1 and d not in (1, size[ch]):
                raise cx.unsupported(f"dimension {ch!r} is {size[ch]} and {d}")
            size[ch] = max(size.get(ch, 1), d)
    acc, acc_l = _einsum_prepare(cx, vals[0], terms[0], set(out).union(*terms[1:]))
    for i in range(1, len(vals)):
        later = set(out).union(*terms[i + 1:])
        b, b_l = _einsum_prepare(cx, vals[i], terms[i], later | set(acc_l))
        acc, acc_l = _einsum_prepare(cx, acc, acc_l, later | set(b_l))
        keep = later
        batch = [ch for ch in acc_l if ch in b_l and ch in keep]
        contract = [ch for ch in acc_l if ch in b_l and ch not in keep]
        left = [ch for ch in acc_l if ch not in b_l]
        right = [ch for ch in b_l if ch not in acc_l]
        a2 = _permute(cx, acc, acc_l, batch + left + contract)
        b2 = _permute(cx, b, b_l, batch + contract + right)
        bshape = tuple(size[ch] for ch in batch)
        nb, m = int(np.prod(bshape, dtype=np.int64)), int(np.prod([size[c] for c in left], dtype=np.int64))
        k, n = int(np.prod([size[c] for c in contract], dtype=np.int64)), int(np.prod([size[c] for c in right],
                                                                                      dtype=np.int64))
        full_a = bshape + tuple(a2.shape[len(batch):])
        full_b = bshape + tuple(b2.shape[len(batch):])
        if a2.shape != full_a:
            a2 = cx.add("Expand", [a2], shape=full_a)
        if b2.shape != full_b:
            b2 = cx.add("Expand", [b2], shape=full_b)
        y = cx.add("MatMul", [cx.add("Reshape", [a2], shape=(nb, m, k)), cx.add("Reshape", [b2], shape=(nb, k, n))])
        acc_l = batch + left + right
        acc = cx.add("Reshape", [y], shape=tuple(size[ch] for ch in acc_l))
    acc, acc_l = _einsum_prepare(cx, acc, acc_l, set(out))
    return [_permute(cx, acc, acc_l, out)]
