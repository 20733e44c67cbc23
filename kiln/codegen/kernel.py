"""Emit one scheduled Kernel as an LLVM function `void @name(ptr b0, ..., ptr bn)`.

Loops become counted loops; `vector` loops a vector main loop plus a masked (or scalar) remainder;
`vector_reduce` loops a vector partial and one horizontal combine; a top-level `parallel` loop is outlined
into `@name.par<k>(ptr ctx, i64 chunk)` and handed to Kiln's thread pool (runtime/threadpool.py)."""
from __future__ import annotations

from llvmlite import ir

from kiln.codegen.access import I32, I64, MEMORY, PTR, SCALAR, elem_bytes, prefix_store
from kiln.codegen.bounds import BoundsChecker
from kiln.codegen.constants import vector_constant
from kiln.codegen.exprs import ExprEmitter, VectorCtx
from kiln.codegen.loops import emit_loop, entry_alloca
from kiln.codegen.scalable import ScalableExprEmitter, loop_is_scalable, reduce_is_scalable
from kiln.codegen.scalable import emit_vector_loop as emit_scalable_loop
from kiln.codegen.scalable import emit_vector_reduce as emit_scalable_reduce
from kiln.codegen.sme import emit_sme_tile, has_sme, match_sme_tile
from kiln.codegen.transpose import transposed_load_group, transposed_store_group
from kiln.kernel.analysis import coef
from kiln.kernel.ir import (
    PARALLEL_MIN_WORK,
    Alloc,
    Assign,
    Bin,
    Call,
    Const,
    Expr,
    If,
    Kernel,
    Local,
    LocalRef,
    Loop,
    Prefetch,
    Stmt,
    Store,
    hint,
    init_value,
    is_float,
)
from kiln.target import Target, features_on

NTHREADS_GLOBAL = "kiln.nthreads"
PARALLEL_GLOBAL = "kiln.parallel"
CHUNKS_PER_THREAD = 4
# A long kernel (gemm_1024: 10 ms) is cut finer, into chunks of about CHUNK_FLOPS each (up to MAX_CHUNKS_PER_THREAD
# per thread): with 4 chunks of 2.5 ms each, a thread slowed by a neighbour for a moment leaves the other idle at
# the end (gemm_1024: 4 → 32 chunks per thread, 9.93 → 9.80 ms). Short kernels keep 4: finer chunks cost them
# locality (resnet18 18.2 → 18.6 ms, mobilenetv2 4.43 → 4.56 at 16 per thread).
CHUNK_FLOPS = 25e6
MAX_CHUNKS_PER_THREAD = 32
REDUCE_PARTIALS = 4  # partials of a vector reduction with one update (vector_reduce)
PARALLEL_FN = ir.FunctionType(ir.VoidType(), [PTR, PTR, I64, I32])


def at_most(extent: Expr, n: int) -> bool:
    """Is the run-time loop extent never more than n (a min with a constant)?"""
    return isinstance(extent, Bin) and extent.op == "min" and any(isinstance(x, Const) and int(x.value) <= n
                                                                   for x in (extent.a, extent.b))


def _int_span(lo: ir.Value, hi: ir.Value) -> int | None:
    """hi − lo where both are integer constants (a loop's bounds known at code generation), else None."""
    if isinstance(lo, ir.Constant) and isinstance(hi, ir.Constant) and isinstance(lo.constant, int) \
            and isinstance(hi.constant, int):
        return max(0, hi.constant - lo.constant)
    return None


def declare_runtime(m: ir.Module) -> None:
    """Globals the entry point sets: the thread count and the pool's kiln_parallel (runtime/threadpool.py)."""
    if NTHREADS_GLOBAL in m.globals:
        return
    g = ir.GlobalVariable(m, I32, NTHREADS_GLOBAL)
    g.initializer = ir.Constant(I32, 1)
    g.linkage = "internal"
    p = ir.GlobalVariable(m, I64, PARALLEL_GLOBAL)  # the function's address, as an integer
    p.initializer = ir.Constant(I64, 0)
    p.linkage = "internal"


class KernelEmitter:
    def __init__(self, module: ir.Module, kernel: Kernel, fn_name: str, bounds_check: bool = False,
                 target: Target | None = None):
        self.m, self.k, self.name = module, kernel, fn_name
        self.target = target  # a scalable one (SVE, RVV) strip-mines vector loops: codegen/scalable.py
        self.bounds_check = bounds_check  # debug build: every access checked (codegen/bounds.py)
        self.mask_registers = target is not None and "avx512f" in features_on(target.features)
        self.bufs = list(kernel.args) + list(kernel.scratch)
        self.n_par = 0

    def emit(self) -> ir.Function:
        declare_runtime(self.m)
        fn = ir.Function(self.m, ir.FunctionType(ir.VoidType(), [PTR] * len(self.bufs)), self.name)
        fn.linkage = "internal"
        fn.attributes.add("noinline")  # one function per kernel: linear compile time, per-kernel profiles
        for a in fn.args:
            a.attributes.add("noalias")
        b = ir.IRBuilder(fn.append_basic_block("entry"))
        em = self.emitter(b, list(fn.args))  # one emitter: a top-level Local must outlive its statement

        def top(stmts: list[Stmt]) -> None:
            for s in stmts:
                if isinstance(s, Loop) and s.kind == "parallel":
                    self.parallel(b, list(fn.args), s)
                elif isinstance(s, If) and _holds_parallel(s):  # a run-time choice between parallel nests (a
                    c, is_vec = em.ev(s.cond)                    # short run-time axis: schedule/default.py)
                    assert not is_vec, "If conditions must be uniform"
                    with b.if_else(c) as (then, otherwise):
                        with then:
                            top(s.body)
                        with otherwise:
                            top(s.orelse)
                else:
                    self.stmts(b, em, [s])
        top(self.k.body)
        b.ret_void()
        return fn

    def emitter(self, b: ir.IRBuilder, ptrs: list[ir.Value]) -> ExprEmitter:
        buffers = {buf.name: (p, buf.dtype, buf.shape) for buf, p in zip(self.bufs, ptrs)}
        em = (ScalableExprEmitter if self.target is not None and self.target.scalable else ExprEmitter)(
            b, self.m, buffers, {})
        em.target = self.target
        if self.bounds_check:
            em.bounds = BoundsChecker(b, self.m, em.buffers, {buf.name: i for i, buf in enumerate(self.bufs)})
        return em

    # -- statements ------------------------------------------------------------------------------------------
    def stmts(self, b: ir.IRBuilder, em: ExprEmitter, body: list[Stmt]) -> None:
        for s in body:
            if isinstance(s, Loop):
                self.loop(b, em, s)
            elif isinstance(s, Store):
                self.store(b, em, s)
                em.forget_loads()
            elif isinstance(s, Local):
                t = SCALAR[s.dtype]
                ptrs = [self.entry_alloca(b, em.vtype(t)) for _ in range(s.count)]
                em.locals[s.name] = (ptrs, em.vec is not None)
                v, is_vec = em.ev(s.init)
                for ptr in ptrs:
                    b.store(em.splat(v) if em.vec and not is_vec else v, ptr)
            elif isinstance(s, Assign):
                ptr, vec = em.local_slot(s.name, s.slot)
                v, is_vec = em.ev(s.value)
                b.store(em.splat(v) if vec and not is_vec else v, ptr)
            elif isinstance(s, Alloc):
                n = 1
                for d in s.shape:
                    n *= d
                mem = self.entry_alloca(b, ir.ArrayType(MEMORY[s.dtype], n))
                mem.align = 64  # microkernels may use aligned vector loads on their packed blocks
                # llvmlite types an alloca as a typed pointer (and bitcast to `ptr` is a no-op for it), which
                # then rejects vector stores through it: the buffer is used as an opaque `ptr`, like arguments
                mem.type = PTR
                em.buffers[s.name] = (mem, s.dtype, s.shape)
            elif isinstance(s, Call):
                self.call(b, em, s)
                em.forget_loads()
            elif isinstance(s, Prefetch):
                self.prefetch(b, em, s)
            elif isinstance(s, If):
                c, is_vec = em.ev(s.cond)
                assert not is_vec, "If conditions must be uniform"
                pre = b.block  # dominates both arms and the block after them (em.dominator)
                if not s.orelse and len(s.body) == 1 and isinstance(s.body[0], Store):
                    self.address_ahead(em, s.body[0])
                if not s.orelse:
                    with b.if_then(c):
                        em.dominator[b.block] = pre
                        self.stmts(b, em, s.body)
                else:
                    with b.if_else(c) as (then, otherwise):
                        with then:
                            em.dominator[b.block] = pre
                            self.stmts(b, em, s.body)
                        with otherwise:
                            em.dominator[b.block] = pre
                            self.stmts(b, em, s.orelse)
                em.dominator[b.block] = pre

    def call(self, b: ir.IRBuilder, em: ExprEmitter, s: Call) -> None:
        """A microkernel (defined in the module, see codegen/module.py) or a library symbol (resolved when
        the object is loaded): declared here with C types from the argument dtypes."""
        assert em.vec is None, f"call {s.fn} inside a vector loop"
        args = [em.ev(a)[0] for a in s.args]
        fn = self.m.globals.get(s.fn)
        if fn is None:
            fn = ir.Function(self.m, ir.FunctionType(ir.VoidType(), [a.type for a in args]), s.fn)
        b.call(fn, args)

    def prefetch(self, b: ir.IRBuilder, em: ExprEmitter, s: Prefetch) -> None:
        """llvm.prefetch of buf[index]'s line: no bounds check (a prefetch never faults), a uniform index (lane 0
        inside a vector loop)."""
        ptr, dtype, shape = em.buffers[s.buf]
        flat = em.flat(s.index, shape)
        p = em.element_ptr(ptr, flat, MEMORY[dtype])
        fn = em._decl("llvm.prefetch.p0", ir.VoidType(), [PTR, I32, I32, I32])
        b.call(fn, [p, ir.Constant(I32, int(s.write)), ir.Constant(I32, s.locality), ir.Constant(I32, 1)])

    entry_alloca = staticmethod(entry_alloca)  # (scalable.py and sme.py reach it through the emitter)

    def address_ahead(self, em: ExprEmitter, s: Store) -> None:
        """A guarded store's address arithmetic, emitted ahead of its guard — pure integer arithmetic, safe to run
        whether or not the store does — where the guarded stores after it reuse it (em.dominator): a tile's guarded
        rows then share one row address, each adding its constant offset, instead of each block recomputing it."""
        if em.bounds or isinstance(em, ScalableExprEmitter):
            return
        ptr, dtype, shape = em.buffers[s.buf]
        flat = em.flat(s.index, shape)
        if em.vec is None or coef(flat, em.vec.var) == 1:
            em.element_ptr(ptr, flat, MEMORY[dtype])

    def store(self, b: ir.IRBuilder, em: ExprEmitter, s: Store) -> None:
        ptr, dtype, shape = em.buffers[s.buf]
        flat = em.flat(s.index, shape)
        val, is_vec = em.ev(s.value)
        val = em.to_memory(val, dtype)
        mt = MEMORY[dtype]
        align = elem_bytes(mt)
        if isinstance(em, ScalableExprEmitter) and em.strip is not None:
            em.store_vector(s.buf, s.index, val, is_vec)
            return
        if not em.vec:
            if em.bounds:
                em.bounds.scalar_store(val, ptr, em.index(flat), mt, align)
            else:
                b.store(val, em.element_ptr(ptr, flat, mt), align=align)
            return
        if not is_vec:
            val = em.splat(val)
        c = coef(flat, em.vec.var)
        n, mask = em.vec.lanes, em.vec.mask
        if c == 1:
            p = em.element_ptr(ptr, flat, mt)
            if em.bounds:  # drop out-of-bounds lanes: the store becomes a masked one
                mask = em.bounds.lanes(ptr, em.bounds.progression(em._at_base(flat), 1, n), mask)
            if mask is None:
                b.store(val, p, align=align)
            elif em.vec.prefix and not em.bounds:
                prefix_store(b, val, p, em.vec.prefix, mt, align)
            else:
                vt = ir.VectorType(mt, n)
                b.call(em._decl(f"llvm.masked.store.v{n}{em._tname(mt)}.p0", ir.VoidType(),
                                [vt, PTR, I32, ir.VectorType(ir.IntType(1), n)]),
                       [val, p, ir.Constant(I32, align), mask])
            return
        if c == 0:
            raise AssertionError(f"vectorized store to a uniform address in {self.k.name}: bad schedule")
        idx, _ = em.ev(flat)
        ptrs = em.lane_pointers(ptr, idx, mt)
        if em.bounds:
            mask = em.bounds.lanes(ptr, idx, mask)
        vt, mt1 = ir.VectorType(mt, n), ir.VectorType(ir.IntType(1), n)
        fn = em._decl(f"llvm.masked.scatter.v{n}{em._tname(mt)}.v{n}p0", ir.VoidType(),
                      [vt, ir.VectorType(PTR, n), I32, mt1])
        b.call(fn, [val, ptrs, ir.Constant(I32, align), mask if mask is not None else ir.Constant(mt1, [1] * n)])

    def counted(self, b: ir.IRBuilder, lo: ir.Value, hi: ir.Value, step: int, body) -> None:  # noqa: ANN001
        """for (i = lo; i < hi; i += step) body(i)"""
        def one(i: ir.Value) -> ir.Value:
            body(i)
            return ir.Constant(I64, step)
        emit_loop(b, lo, hi, one)

    def loop(self, b: ir.IRBuilder, em: ExprEmitter, s: Loop, lo: ir.Value | None = None,
             hi: ir.Value | None = None) -> None:
        name = s.var.name
        lo = lo if lo is not None else ir.Constant(I64, 0)
        hi = hi if hi is not None else em.ev(s.extent)[0]
        if s.kind == "unroll" and isinstance(s.extent, Const):
            if not isinstance(em, ScalableExprEmitter) and (transposed_store_group(b, em, s)  # transpose.py
                                                             or transposed_load_group(b, em, s)):
                em.forget_loads()
                return
            for it in range(int(s.extent.value)):
                em.env[name] = ir.Constant(I64, it)
                self.stmts(b, em, s.body)
            return
        if s.kind == "vector_reduce" and em.vec is None:
            if isinstance(em, ScalableExprEmitter) and reduce_is_scalable(s):
                emit_scalable_reduce(self, b, em, s, lo, hi, self.target)
                return
            self.vector_reduce(b, em, s, lo, hi)
            return
        if s.kind == "vector" and em.vec is None and s.lanes > 1 and isinstance(em, ScalableExprEmitter) \
                and loop_is_scalable(s.body):
            tile = match_sme_tile(s, lambda buf: em.buffers[buf][2]) if has_sme(self.target) else None
            if tile is not None:  # a register tile as ZA outer products (sme.py)
                emit_sme_tile(self, b, em, s, tile, lo, hi)
            else:
                emit_scalable_loop(self, b, em, s, lo, hi, self.target)
            return
        if s.kind == "vector" and em.vec is None and s.lanes > 1:
            n = s.lanes
            if s.masked and self.mask_registers and at_most(s.extent, n):
                # at most one vector (a tile's run-time edge: min(NR, N − n0)): where masked loads and stores cost
                # what plain ones do (AVX-512's mask registers), one masked iteration, not a full one and a masked
                # copy of the tile beside it (twice the code, for the compile time of a run-time-N attention matmul)
                with b.if_then(b.icmp_signed(">", hi, lo)):
                    lanes = vector_constant(I64, tuple(range(n)))
                    em.vec = VectorCtx(s.var, n, lo, b.icmp_signed("<", lanes, em.splat(b.sub(hi, lo), n)))
                    self.stmts(b, em, s.body)
                    em.vec = None
                return
            # constant bounds: the remainder's size is known here. None is emitted where it is empty (a tile's NR
            # columns in whole vectors): its dead copy of the tile body, masked or scalar, was half the IR of a
            # GEMM kernel for LLVM to parse, optimize and delete (same machine code)
            span = _int_span(lo, hi)
            main_end = ir.Constant(I64, hi.constant - span % n) if span is not None else \
                b.sub(hi, b.srem(b.sub(hi, lo), ir.Constant(I64, n)))

            def vbody(i: ir.Value) -> None:
                em.vec = VectorCtx(s.var, n, i)
                self.stmts(b, em, s.body)
                em.vec = None
            self.counted(b, lo, main_end, n, vbody)
            if span is not None and span % n == 0:
                return
            if s.masked:  # the remainder as one masked vector iteration
                rem = b.sub(hi, main_end)
                with b.if_then(b.icmp_signed(">", rem, ir.Constant(I64, 0))):
                    lanes = vector_constant(I64, tuple(range(n)))
                    mask = b.icmp_signed("<", lanes, em.splat(rem, n))
                    # a loop shorter than a vector (a 6-row tile in 8 lanes): the mask is a known prefix
                    prefix = span % n if span is not None else None
                    em.vec = VectorCtx(s.var, n, main_end, mask, prefix or None)
                    self.stmts(b, em, s.body)
                    em.vec = None
                return
            lo = main_end

        def sbody(i: ir.Value) -> None:
            em.bind_loop_var(name, i)
            self.stmts(b, em, s.body)
        self.counted(b, lo, hi, 1, sbody)

    def vector_reduce(self, b: ir.IRBuilder, em: ExprEmitter, s: Loop, lo: ir.Value, hi: ir.Value) -> None:
        """A reduction loop `$acc = op($acc, x(r))` run `lanes` at a time into a vector partial, the tail
        masked with op's identity, then one horizontal reduction into $acc. Several such updates in one loop (a
        row tile of dot products, schedule/tile.py's dot edge) each keep their own partial — independent chains
        that share the loads they have in common — and each ends in its own horizontal reduction. One update alone
        (a row's max or sum: softmax, a norm's statistics) keeps REDUCE_PARTIALS partials, taken in turn over the
        loop unrolled that many vectors, so consecutive steps do not wait on each other's add or compare (a chain
        of one partial ran at its latency, 4 cycles a vector); they combine pairwise before the horizontal step."""
        ups: list[tuple[Assign, str, Expr, list[ir.Value]]] = []
        n = s.lanes
        span = _int_span(lo, hi)
        parts = REDUCE_PARTIALS if len(s.body) == 1 and (span is None or span >= 2 * n * REDUCE_PARTIALS) else 1
        for upd in s.body:
            assert isinstance(upd, Assign) and isinstance(upd.value, Bin)
            assert upd.value.a == LocalRef(upd.name, upd.value.dtype, upd.slot), "vector_reduce: $acc = op($acc, x)"
            op = {"+": "sum", "*": "prod", "max": "max", "min": "min"}[upd.value.op]
            ptrs = [self.entry_alloca(b, ir.VectorType(SCALAR[upd.value.dtype], n)) for _ in range(parts)]
            for part in ptrs:
                b.store(em.splat(em.const(init_value(op, upd.value.dtype)), n), part)
            ups.append((upd, op, upd.value.b, ptrs))
        main_end = b.sub(hi, b.srem(b.sub(hi, lo), ir.Constant(I64, n)))

        def step(i: ir.Value, mask: ir.Value | None, j: int = 0) -> None:
            em.vec = VectorCtx(s.var, n, i, mask)
            for upd, op, x, ptrs in ups:
                part = ptrs[j]
                acc = b.load(part, typ=part.allocated_type)
                if op == "sum" and is_float(upd.value.dtype) and isinstance(x, Bin) and x.op == "*":
                    # acc + a·b as one fused multiply-add, as in a tile's update; the tail keeps acc in its
                    # masked-off lanes
                    new, _ = em.mul_add(x, lambda acc=acc: (acc, True))
                    b.store(new if mask is None else b.select(mask, new, acc), part)
                    continue
                xv, is_vec = em.ev(x)
                xv = xv if is_vec else em.splat(xv)
                if mask is not None:
                    xv = b.select(mask, xv, em.splat(em.const(init_value(op, upd.value.dtype))))
                b.store(em.combine(op, acc, xv, upd.value.dtype), part)
            em.vec = None
        if parts > 1:
            unrolled_end = b.sub(hi, b.srem(b.sub(hi, lo), ir.Constant(I64, n * parts)))

            def steps(i: ir.Value) -> None:
                for j in range(parts):
                    step(b.add(i, ir.Constant(I64, j * n)), None, j)
            self.counted(b, lo, unrolled_end, n * parts, steps)
            lo = unrolled_end
        self.counted(b, lo, main_end, n, lambda i: step(i, None))
        rem = b.sub(hi, main_end)
        with b.if_then(b.icmp_signed(">", rem, ir.Constant(I64, 0))):
            lanes = vector_constant(I64, tuple(range(n)))
            step(main_end, b.icmp_signed("<", lanes, em.splat(rem, n)))
        for upd, op, _, ptrs in ups:
            vals = [b.load(p, typ=p.allocated_type) for p in ptrs]
            while len(vals) > 1:  # pairwise: (p0 ∘ p1) ∘ (p2 ∘ p3)
                vals = [em.combine(op, vals[i], vals[i + 1], upd.value.dtype) for i in range(0, len(vals), 2)]
            total = em.horizontal(op, vals[0], upd.value.dtype)
            ptr, _ = em.local_slot(upd.name, upd.slot)
            b.store(em.combine(op, b.load(ptr, typ=ptr.allocated_type), total, upd.value.dtype), ptr)

    # -- parallel loops --------------------------------------------------------------------------------------
    def parallel(self, b: ir.IRBuilder, args: list[ir.Value], s: Loop) -> None:
        """Outline the loop body into `worker(ctx, chunk)` and hand it to the thread pool
        (kiln_parallel): ≈ CHUNKS_PER_THREAD chunks of iterations per thread (more for a long kernel), taken
        from a shared counter, so a thread slowed by another process on its core does not hold the others back."""
        worker = ir.Function(self.m, ir.FunctionType(ir.VoidType(), [PTR, I64]), f"{self.name}.par{self.n_par}")
        worker.linkage = "internal"
        # never inlined: a loop over run-time extents also calls it directly when the call has little work (below),
        # and LLVM inlined that call — a second copy of every parallel nest of a dynamic build
        worker.attributes.add("noinline")
        self.n_par += 1
        wb = ir.IRBuilder(worker.append_basic_block("entry"))
        ctx, chunk_id = worker.args
        ptrs = [wb.load(wb.gep(ctx, [ir.Constant(I32, i)], source_etype=PTR), typ=PTR) for i in range(len(args))]
        n_chunks = wb.load(wb.gep(ctx, [ir.Constant(I32, len(args))], source_etype=PTR), typ=I64)
        em = self.emitter(wb, ptrs)
        total = em.ev(s.extent)[0]
        # chunk c = [⌊c·total/n⌋, ⌊(c+1)·total/n⌋): sizes differ by at most one iteration, and with n a multiple
        # of the thread count each thread's segment of chunks is exactly its share of the loop — a loop split
        # into one part per thread (schedule/tile.py: image_thread_parts) keeps its parts (90 tiles in chunks of
        # ⌈90/8⌉ = 12 gave the threads 48 and 42)
        lo = wb.sdiv(wb.mul(chunk_id, total), n_chunks)
        hi = wb.sdiv(wb.mul(wb.add(chunk_id, ir.Constant(I64, 1)), total), n_chunks)
        self.loop(wb, em, Loop(s.var, s.extent, s.body, "serial"), lo, hi)
        wb.ret_void()
        # caller: pack the buffer pointers and the chunk count, call the pool
        em0 = self.emitter(b, args)
        total = em0.ev(s.extent)[0]
        nthreads = b.load(self.m.globals[NTHREADS_GLOBAL], typ=I32)
        nt = b.sext(nthreads, I64)
        if s.chunks:  # a tuned parallel split (schedule/default.py: split_parallel)
            per = b.mul(nt, ir.Constant(I64, s.chunks))
        else:
            per = b.mul(nt, ir.Constant(I64, CHUNKS_PER_THREAD))
            by_work = ir.Constant(I64, int(self.k.flops // CHUNK_FLOPS))
            if not isinstance(s.extent, Const):  # run-time extents: the kernel's FLOPs are its upper bound's, scale
                # them by the iterations this call has (chunks sized for 512 tokens would split a 128-token GEMM's
                # weight panels between the threads, each streaming them from memory)
                by_work = b.sdiv(b.mul(by_work, total), ir.Constant(I64, max(1, hint(s.extent))))
            per = b.select(b.icmp_signed(">", by_work, per), by_work, per)
            most = b.mul(nt, ir.Constant(I64, MAX_CHUNKS_PER_THREAD))
            per = b.select(b.icmp_signed(">", per, most), most, per)
        # a multiple of the thread count: 9 equal chunks on 2 threads leave one idle for a ninth of the loop
        # (conv_r50_3x3: 9 chunks 1.168 ms, 8 chunks 1.083)
        per = b.mul(b.sdiv(b.add(per, b.sub(nt, ir.Constant(I64, 1))), nt), nt)
        chunks = b.select(b.icmp_signed("<", total, per), total, per)
        chunks = b.select(b.icmp_signed(">", chunks, ir.Constant(I64, 0)), chunks, ir.Constant(I64, 1))
        if s.work is not None:  # little work this call (run-time extents): one chunk, on this thread
            serial = b.icmp_signed("<", em0.ev(s.work)[0], ir.Constant(I64, PARALLEL_MIN_WORK))
            chunks = b.select(serial, ir.Constant(I64, 1), chunks)
        arr = self.entry_alloca(b, ir.ArrayType(PTR, len(args) + 1))
        for i, a in enumerate(args):
            b.store(a, b.gep(arr, [ir.Constant(I32, 0), ir.Constant(I32, i)]))
        b.store(chunks, b.gep(arr, [ir.Constant(I32, 0), ir.Constant(I32, len(args))]))
        pool = b.inttoptr(b.load(self.m.globals[PARALLEL_GLOBAL], typ=I64), ir.PointerType(PARALLEL_FN))
        if s.work is not None:
            with b.if_else(serial) as (then, otherwise):
                with then:
                    b.call(worker, [arr, ir.Constant(I64, 0)])
                with otherwise:
                    b.call(pool, [worker, arr, chunks, nthreads])
        else:
            b.call(pool, [worker, arr, chunks, nthreads])


def _holds_parallel(s: If) -> bool:
    """Does a top-level If choose between nests with parallel loops (which must be outlined like top-level ones)?"""
    return any((isinstance(x, Loop) and x.kind == "parallel") or (isinstance(x, If) and _holds_parallel(x))
               for x in s.body + s.orelse)
