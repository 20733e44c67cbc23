"""The `library` strategy: an anchor's whole contraction is one SGEMM call per batch item into a vendor library
(OpenBLAS, MKL or oneDNN — kiln/library); Kiln emits only what surrounds the call.

The anchor compute is `out[axes] = E(Σ_r A[...]·B[...])` (kiln/kernel/build.py inlines the epilogue E: bias,
folded BatchNorm, activation, residual add). Its axes are classified by which operand's address they move:

    M axes: move A only      N axes: move B only      K axes: the reduction      batch: both operands, or neither

B is the operand that moves along the output's contiguous axis. For each operand the merged M/N/K index must be
one strided BLAS dimension (strides from the affine load indices): A as M×K row-major (transA = N, lda = its M
stride) or K×M (transA = T); B likewise; C must be M×N row-major. An operand whose layout does not fit is first
copied by a Kiln compute into a contiguous scratch buffer — for a convolution that copy *is* im2col (BLAS has no
convolution; see below) — and C goes to scratch when the epilogue is not the identity or out does not fit.
The loop nest / call sequence (conv 3×3, stride s, NCHW, the input already zero-padded into P by the conv's own
pad compute — the same graph and pad as the direct strategy):

    before (direct):  for co, ho, wo: acc = Σ_{ci,kh,kw} P[ci, ho·s+kh, wo·s+kw] · W[co, ci, kh, kw]
                                      out[co, ho, wo] = relu(acc + bias[co])
    after (library):  for ci, kh, kw, ho, wo (parallel, vectorized):  col[ci, kh, kw, ho, wo] = P[ci, ho·s+kh, wo·s+kw]
                      sgemm(N, N, M=Co, N=Ho·Wo, K=Ci·9, A=W, lda=Ci·9, B=col, ldb=Ho·Wo, C=acc, ldc=Ho·Wo)
                      for co, ho, wo (parallel, vectorized):          out[co, ho, wo] = relu(acc[co, ho, wo] + bias[co])

A MatMul [.., M, K]×[K, N] needs no copies: `for b: sgemm(A + b·M·K, B, C + b·M·N)` (serial over batch items;
the library threads each call), and a MatMul without epilogue writes `out` directly. Gemm arrives as MatMul
(+ Transpose views → trans flags, + alpha/beta/bias → epilogue). A 1×1 stride-1 convolution reads its input as
B = X[Ci, H·W] in place.

Integer anchors (an unpacked QMatMul or NCHW QConv, kernel/lower_quant.py: out = E(Σ i32(A) · i32(W))) take the
library's integer GEMM the same way — int32 C = u8/s8 activation · s8 weights, no offsets (the zero points are in
Kiln's epilogue addend) — where it has one (kiln/library: oneDNN u8 and s8 activations, MKL u8; the graph passes keep
those anchors unpacked and NCHW for it: quantize_qdq.packed_matmul, block_layout.library_conv); a conv's im2col
copy is 8-bit, and as the library takes the activation as its left operand, a conv runs as outᵀ = colᵀ · Wᵀ.

Falls back to the direct loop nest (returns None; `Kernel.strategies` records "direct" and the reason is
logged on the `kiln.library` logger) when: the reduction is not a sum of products of two float32 loads; an
index is not affine with constant non-negative strides (a grouped convolution's channel index `co // cog`);
or the product is a batch of matrix-vector products (a depthwise convolution: one call per channel with
M = 1 costs more than the direct loop).

Why no convolution primitive: of the three libraries only oneDNN has one, and the `onednn` wheel's primitives
need a SYCL CPU engine that this wheel's runtime cannot create (kiln/library/onednn.py). Costs compared with
direct emission: the epilogue is a separate pass over the output (the direct strategy applies it in registers),
and a convolution with a window pays the im2col copy (K·Ho·Wo floats written and read once more)."""
from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from kiln.kernel.analysis import coef, flat_index
from kiln.kernel.ir import (
    Addr,
    Bin,
    Buffer,
    Call,
    Cast,
    Compute,
    Const,
    Expr,
    Kernel,
    Load,
    Loop,
    Reduce,
    Stmt,
    Store,
    Var,
    substitute,
    uses_var,
    walk,
    walk_stmts,
)
from kiln.library import library_of, require

log = logging.getLogger("kiln.library")
Axis = tuple[Var, int]
ZERO = Const(0, "int64")


@dataclass
class Operand:
    """One matrix of the product as the call sees it: a buffer, the index of its element at M=N=K=0 (batch
    axes still free) and, per axis, the stride of its flat index."""
    buf: str
    index: tuple[Expr, ...]
    strides: dict[Var, int]
    expr: Expr | None = None  # a computed factor (e.g. a zero-padded window): copied to scratch first; strides
    #                           then only say which axes it depends on (1) or not (0)


@dataclass
class Gemm:
    """out = E(A·B) over batch × M × N with reduction K, each axis group in the compute's axis order."""
    batch: list[Axis]
    m: list[Axis]
    n: list[Axis]
    k: list[Axis]
    a: Operand
    b: Operand
    c: Operand | None      # where the raw product can go straight into `out` (identity epilogue), else None
    reduce: Reduce


class NotApplicable(Exception):
    """This compute is not a product a library call can build: why (it is then emitted directly)."""


def _size(axes: list[Axis]) -> int:
    return int(np.prod([n for _, n in axes], dtype=np.int64))


def _strides(k: Kernel, buf: str, index: tuple[Expr, ...], axes: list[Axis]) -> dict[Var, int]:
    """Per axis, the constant non-negative stride of buf[index] along it."""
    if any(isinstance(x, Load) for i in index for x in walk(i)):
        raise NotApplicable(f"{buf} is indexed through another buffer (a gather)")
    flat = flat_index(index, k.buffer(buf).shape)
    out = {}
    for v, _ in axes:
        s = coef(flat, v)
        if s is None or s < 0:
            raise NotApplicable(f"the index of {buf} is not affine with a constant non-negative stride along "
                                f"{v.name} ({flat!r}; e.g. a grouped convolution)")
        out[v] = s
    return out


def _group_stride(axes: list[Axis], strides: dict[Var, int]) -> int | None:
    """The stride of the merged (row-major, last fastest) index of `axes`, or None when they do not merge."""
    s = strides[axes[-1][0]]
    span = 1
    for v, n in reversed(axes):
        if strides[v] != s * span:
            return None
        span *= n
    return s if s >= 1 else None


def as_matrix(rows: list[Axis], cols: list[Axis], strides: dict[Var, int]) -> tuple[bool, int] | None:
    """How BLAS sees an operand whose rows/columns are the merged axis groups: (transposed, leading dimension),
    or None when no strided matrix describes it."""
    nr, nc = _size(rows), _size(cols)
    sr = _group_stride(rows, strides) if rows else None
    sc = _group_stride(cols, strides) if cols else None
    if (not cols or sc == 1) and (not rows or (sr is not None and sr >= nc)):
        return False, sr if rows else max(nc, 1)          # row-major rows × cols
    if (not rows or sr == 1) and (not cols or (sc is not None and sc >= nr)):
        return True, sc if cols else max(nr, 1)           # stored transposed: cols × rows
    return None


def match_gemm(k: Kernel, c: Compute) -> Gemm:
    """Classify the compute's axes as batch/M/N/K and its loads as A/B; NotApplicable when it is no GEMM."""
    reds = [e for e in walk(c.body) if isinstance(e, Reduce)]
    if len(reds) != 1 or reds[0].op != "sum":
        raise NotApplicable("the reduction is not one sum")
    r = reds[0]
    prod = r.body
    if not (isinstance(prod, Bin) and prod.op == "*"):
        raise NotApplicable(f"the summand is not a product ({prod!r})")
    if integer_product(prod) is not None:  # i32(A) · i32(B) of 8-bit loads: the integer GEMM's operands as loaded
        prod = Bin("*", prod.a.a, prod.b.a)
    elif any(e.dtype != "float32" for e in (prod.a, prod.b)) or k.buffer(c.out).dtype != "float32":
        raise NotApplicable("SGEMM needs float32 operands and result (or 8-bit operands widened to int32)")
    unit = {v: ZERO for v, n in list(zip(c.axes, c.extents)) + list(r.axes) if n == 1}
    out_axes = [(v, n) for v, n in zip(c.axes, c.extents) if n > 1]
    red_axes = [(v, n) for v, n in r.axes if n > 1]
    every = out_axes + red_axes

    def operand(buf: str, index: tuple[Expr, ...]) -> Operand:
        index = tuple(substitute(i, unit) for i in index)
        return Operand(buf, index, _strides(k, buf, index, every))

    def factor(e: Expr) -> Operand:
        if isinstance(e, Load):
            return operand(e.buf, e.index)
        if any(isinstance(x, Reduce) for x in walk(e)):
            raise NotApplicable(f"a factor of the product is itself a reduction ({e!r})")
        e = substitute(e, unit)
        return Operand("", (), {v: int(uses_var(e, v)) for v, _ in every}, e)
    x, y = factor(prod.a), factor(prod.b)
    store = operand(c.out, c.store_index)
    if any(store.strides[v] for v, _ in red_axes):
        raise NotApplicable("the output index uses a reduction axis")
    inner = [v for v, _ in out_axes if store.strides[v] == 1]
    a, b = (x, y) if not inner or y.strides[inner[0]] or not x.strides[inner[0]] else (y, x)
    m = [(v, n) for v, n in out_axes if a.strides[v] and not b.strides[v]]
    n_ = [(v, n) for v, n in out_axes if b.strides[v] and not a.strides[v]]
    batch = [ax for ax in out_axes if ax not in m and ax not in n_]
    if _size(batch) > 1 and (not m or not n_):
        raise NotApplicable(f"a batch of {_size(batch)} matrix-vector products (e.g. a depthwise convolution): "
                            "one library call per item costs more than the direct loop")
    fit = as_matrix(m, n_, store.strides)
    direct_c = c.body == r and fit is not None and not fit[0]
    return Gemm(batch, m, n_, red_axes, a, b, store if direct_c else None, r)


def integer_product(prod: Expr) -> tuple[str, str] | None:
    """(A's dtype, B's dtype) when `prod` is i32(load) · i32(load) of 8-bit values, else None."""
    if isinstance(prod, Bin) and prod.op == "*" and all(
            isinstance(x, Cast) and x.dtype == "int32" and isinstance(x.a, Load) and x.a.dtype in ("uint8", "int8")
            for x in (prod.a, prod.b)):
        return prod.a.a.dtype, prod.b.a.dtype
    return None


def _copy(k: Kernel, op: Operand, deps: list[Axis], rows: list[Axis], cols: list[Axis], name: str,
          pre: list[Compute], dtype: str = "float32") -> Operand:
    """Materialize an operand into a contiguous scratch buffer [deps..., rows..., cols...] of `dtype` (im2col for a
    convolution's input): a Kiln compute the caller schedules before the call."""
    axes = deps + rows + cols
    buf = Buffer(name, dtype, tuple(n for _, n in axes))
    k.scratch.append(buf)
    vs = tuple(v for v, _ in axes)
    pre.append(Compute(name, vs, buf.shape, op.expr if op.expr is not None else Load(op.buf, op.index, dtype)))
    strides, span = {}, 1
    for v, n in reversed(axes):
        strides[v] = span
        span *= n
    return Operand(name, vs, strides)


def _matrix(k: Kernel, op: Operand, batch: list[Axis], rows: list[Axis], cols: list[Axis], name: str,
            pre: list[Compute], dtype: str = "float32") -> tuple[Operand, tuple[bool, int]]:
    """The operand as a strided matrix for the call ((transposed?, leading dimension)), copied first (`_copy`)
    where it is none (an expression, a conv's input)."""
    fit = as_matrix(rows, cols, op.strides) if op.expr is None else None
    if fit is None:
        op = _copy(k, op, [ax for ax in batch if op.strides[ax[0]]], rows, cols, name, pre, dtype)
        fit = as_matrix(rows, cols, op.strides)
    assert fit is not None, "a contiguous copy always fits"
    return op, fit


@dataclass
class LibraryNest:
    """An anchor on a library: the copies that make its operands strided matrices (`pre`), the calls, and the
    epilogue as its own pass over C (`post`) — computes the caller schedules as any other (schedule/default.py:
    schedule_by_strategy, tags <tag>l0…, <tag>e0…), so this module does not import the default schedule."""
    pre: list[Compute]
    calls: list[Stmt]
    post: list[Compute]


def _at_origin(op: Operand, zero: list[Axis]) -> Addr:
    """Pointer to the operand's element at M = N = K = 0 (batch axes are the enclosing loops' variables)."""
    z = {v: ZERO for v, _ in zero}
    return Addr(op.buf, tuple(substitute(i, z) for i in op.index))


def schedule_library(k: Kernel, c: Compute, tag: str, threads: int, options: dict[str, bool],
                     strategy: str) -> LibraryNest | None:
    """The call sequence of the anchor `c` on the library `strategy` names, or None (→ direct) where no
    library call builds it. Raises kiln.library.LibraryUnavailable when that library is not installed."""

    name = library_of(strategy)
    lib = require(name)
    node = c.hints.get("node", c.out)
    try:
        g = match_gemm(k, c)
        dtypes = integer_product(g.reduce.body)
        if dtypes is not None:
            return _integer(k, c, g, lib, name, dtypes, tag)
    except NotApplicable as e:
        log.info("node %s: library:%s does not apply, emitted directly: %s", node, name, e)
        return None

    pre: list[Compute] = []
    a, fa = _matrix(k, g.a, g.batch, g.m, g.k, f"{c.out}_a{tag}", pre)
    b, fb = _matrix(k, g.b, g.batch, g.k, g.n, f"{c.out}_b{tag}", pre)
    post: list[Compute] = []
    out = g.c
    if out is None:  # the raw product into scratch, then the epilogue as its own elementwise pass
        axes = g.batch + g.m + g.n
        acc = Buffer(f"{c.out}_c{tag}", "float32", tuple(n for _, n in axes))
        k.scratch.append(acc)
        index = tuple(v for v, _ in axes)
        out = Operand(acc.name, index, {})
        post.append(Compute(c.out, c.axes, c.extents, substitute(c.body, {g.reduce: Load(acc.name, index)}),
                            c.store))
        ldc = max(_size(g.n), 1)
    else:
        ldc = as_matrix(g.m, g.n, out.strides)[1]
    nest = _calls(lib, g, a, b, out, fa, fb, ldc, f"{c.out}{tag}",
                  threads if options.get("parallel", True) and not getattr(lib, "THREADED", True) else 1)
    call = next(s for s in walk_stmts(nest) if isinstance(s, Call))
    if call.fn not in k.symbols:
        k.symbols.append(call.fn)
    k.strategies[node] = f"library:{name}"
    log.debug("node %s: library:%s, %d call(s) of sgemm M=%d N=%d K=%d, %d copy-in, epilogue %s", node, name,
              _size(g.batch), _size(g.m), _size(g.n), _size(g.k), len(pre), "separate" if post else "none")
    return LibraryNest(pre, nest, post)


def _integer(k: Kernel, c: Compute, g: Gemm, lib: object, name: str, dtypes: tuple[str, str], tag: str
             ) -> LibraryNest:
    """An integer anchor on the library's integer GEMM, which multiplies the activation (u8 / s8, its A) by the s8
    weights (its B): a GEMM as it is, an NCHW conv — out[co, p] = W[co, k] · col[k, p], the weights on the left —
    as the transposed product outᵀ[p, co] = colᵀ · Wᵀ (im2col written as colᵀ, W read through the transpose flag);
    operands that are no strided matrix (a conv's input) copied first, 8-bit. One call per batch item into int32
    scratch (the library threads it), then the epilogue (requantization) as its own pass over C."""

    a, b, m, n = g.a, g.b, g.m, g.n
    dt = {op.buf: (k.buffer(op.buf).dtype if op.buf else "") for op in (a, b)}
    if dt[a.buf] == "int8" and dt[b.buf] in ("uint8", "int8") and dtypes == (dt[b.buf], dt[a.buf]) and \
            dtypes[0] != dtypes[1]:
        a, b, m, n = b, a, n, m  # the weights are the GEMM's left operand (an NCHW conv): the transposed product
    elif dtypes[1] != "int8" or dt[a.buf] != dtypes[0] or dt[b.buf] != "int8":
        raise NotApplicable("the integer GEMM takes the activation (u8/s8) as A and the s8 weights as B")
    pre: list[Compute] = []
    a, fa = _matrix(k, a, g.batch, m, g.k, f"{c.out}_a{tag}", pre, dt[a.buf])
    b, fb = _matrix(k, b, g.batch, g.k, n, f"{c.out}_b{tag}", pre, dt[b.buf])
    axes = g.batch + m + n
    acc = Buffer(f"{c.out}_c{tag}", "int32", tuple(e for _, e in axes))
    co = Buffer(f"{c.out}_co{tag}", "int32", (1,))
    k.scratch += [acc, co]
    index = tuple(v for v, _ in axes)
    call = getattr(lib, "igemm_call", lambda *_: None)(
        dtypes[0], fa[0], fb[0], _size(m), _size(n), _size(g.k), _at_origin(a, m + g.k), fa[1],
        _at_origin(b, g.k + n), fb[1], _at_origin(Operand(acc.name, index, {}), m + n), max(_size(n), 1),
        Addr(co.name, (ZERO,)))
    if call is None:
        raise NotApplicable(f"library:{name} has no GEMM for {dtypes[0]} activations")
    nest: list[Stmt] = [call]
    for v, e in reversed(g.batch):  # serial: the library threads each call
        nest = [Loop(v, Const(e, "int64"), nest)]
    if call.fn not in k.symbols:
        k.symbols.append(call.fn)
    k.strategies[c.hints.get("node", c.out)] = f"library:{name}"
    epilogue = Compute(c.out, c.axes, c.extents, substitute(c.body, {g.reduce: Load(acc.name, index, "int32")}),
                       c.store)
    return LibraryNest(pre, [Store(co.name, (ZERO,), Const(0, "int32")), *nest], [epilogue])


def _unmerge(axes: list[Axis], flat: Expr) -> dict[Var, Expr]:
    """The index of each axis of a row-major merged group (last fastest) at merged position `flat`."""
    out, span = {}, 1
    for v, n in reversed(axes):
        out[v] = (flat // span) % n if span > 1 else flat % n
        span *= n
    return out


def _addr(op: Operand, zero: list[Axis], at: dict[Var, Expr]) -> Addr:
    """Pointer to the operand's element with the `zero` axes at 0 and the axes of `at` at the given indices."""
    z: dict[Expr, Expr] = {v: ZERO for v, _ in zero}
    z.update(at)
    return Addr(op.buf, tuple(substitute(i, z) for i in op.index))


def _calls(lib: object, g: Gemm, a: Operand, b: Operand, out: Operand, fa: tuple[bool, int], fb: tuple[bool, int],
           ldc: int, name: str, slabs: int) -> list[Stmt]:
    """The library call(s) over the batch axes: one call per batch item with the library threading it, or — for
    a library that runs on the calling thread (`THREADED = False`: BLIS here) — `slabs` column slabs per batch
    item, spread by Kiln's pool; a slab of N/slabs columns (a multiple of 16) is an independent product:

        parallel for p in batch × slabs:  j0 = (p % slabs)·w
            sgemm(M, min(w, N − j0), K, A[b], B[b][:, j0:], C[b][:, j0:])"""
    m, n, kk = _size(g.m), _size(g.n), _size(g.k)
    width = -(-n // max(slabs, 1))
    width = min(n, -(-width // 16) * 16)
    slabs = -(-n // width) if n else 1
    if slabs <= 1:
        stmts = lib.sgemm_call(fa[0], fb[0], m, n, kk, _at_origin(a, g.m + g.k), fa[1], _at_origin(b, g.k + g.n),
                               fb[1], _at_origin(out, g.m + g.n), ldc)
        nest = stmts if isinstance(stmts, list) else [stmts]
        for v, e in reversed(g.batch):  # serial: the library threads each call
            nest = [Loop(v, Const(e, "int64"), nest)]
        return nest
    p = Var(f"{name}_slab", "int64")
    j0 = (p % slabs) * width
    at = {**_unmerge(g.batch, p // slabs), **_unmerge(g.n, j0)} if g.batch else _unmerge(g.n, j0)
    cols = Bin("min", Const(width, "int64"), Const(n, "int64") - j0)
    stmts = lib.sgemm_call(fa[0], fb[0], m, cols, kk, _addr(a, g.m + g.k, at), fa[1], _addr(b, g.k, at), fb[1],
                           _addr(out, g.m, at), ldc)
    return [Loop(p, Const(_size(g.batch) * slabs, "int64"), stmts if isinstance(stmts, list) else [stmts],
                 kind="parallel")]
