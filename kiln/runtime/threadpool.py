"""Kiln's thread pool, emitted as LLVM IR and JIT-compiled once per process.

    kiln_parallel(fn, ctx, chunks, nthreads)   runs fn(ctx, c) for c in [0, chunks) on up to nthreads threads

The caller works too, and waits only for chunks in progress — never for a thread that has not started. On this
shared 2-core machine that is the difference that matters: when the other core is busy a fork/join pool (OpenMP's
barrier) stalls every parallel loop until the descheduled worker runs again (measured: a 0.2 ms depthwise conv took
16 ms), while here the caller simply finishes the loop alone.

Each participant (the caller 0, worker i as i + 1) first takes the chunks of its own contiguous segment, then steals
the others' from their back: the same thread computes the same rows of an image in every layer (schedule/tile.py
`image_thread_parts`). That matters when the host puts the two vCPUs on different L3s (a cache line between them ~330 ns
instead of ~60): with one shared counter any chunk went to either thread, and resnet18 ran 19.7 ms there instead of
13.1; with segments and row parts, 14.7.

Workers are pinned (worker i to the process's CPU i + 1); the caller, the user's thread, is not. A worker that joins
a job published from its own CPU moves to the caller's slot, the first CPU (or back to its own, if the caller is
there now): the two had shared one core for the first runs after a compile, until the kernel moved the caller.

Callers are serialized by a spin lock (two models may run at once from two Python threads: ctypes drops
the GIL). Synchronisation: one 64-bit state word = gen << 32 | holders << 1 | open. A worker joins the open job by
CAS (holders + 1) — only then does it read the job's fields — and leaves with an atomic decrement. The
caller publishes a job (fields, then state with open = 1, release), runs chunks, waits until every chunk is
done, closes the job (open = 0) and waits until holders = 0 before the fields can be reused. Idle workers
spin briefly, then sleep on a futex (the generation word)."""
from __future__ import annotations

import ctypes
import functools
import hashlib
import os

from llvmlite import ir

from kiln.cachedir import atomic_path
from kiln.codegen.loops import entry_alloca

I1, I32, I64 = ir.IntType(1), ir.IntType(32), ir.IntType(64)
PTR = ir.PointerType()
CHUNK_FN = ir.FunctionType(ir.VoidType(), [PTR, I64])
SYS_FUTEX, FUTEX_WAIT, FUTEX_WAKE = 202, 128, 129   # x86-64 Linux, *_PRIVATE
SPINS = 20000
MAX_WORKERS = 64


def _g(m: ir.Module, name: str, t: ir.Type, init: int | None = 0) -> ir.GlobalVariable:
    g = ir.GlobalVariable(m, t, name)
    g.initializer = ir.Constant(t, init if not isinstance(t, ir.PointerType) else None)
    g.linkage = "internal"
    return g


def la(b: ir.IRBuilder, g: ir.GlobalVariable, order: str, align: int) -> ir.Value:
    """Atomic load of a global (llvmlite needs the loaded type spelled out)."""
    return b.load_atomic(g, order, align, typ=g.value_type)


def build_module() -> ir.Module:
    m = ir.Module("kiln_threadpool")
    state, gen32, sleepers = _g(m, "state", I64), _g(m, "gen32", I32), _g(m, "sleepers", I32)
    fn_g, ctx_g = _g(m, "job_fn", I64), _g(m, "job_ctx", I64)  # pointers kept as integers (atomic i64)
    total_g, done_g, limit_g = (_g(m, n, I64) for n in ("job_total", "job_done", "job_limit"))
    nworkers = _g(m, "nworkers", I32)
    busy = _g(m, "busy", I32)  # one job at a time: callers from several threads (two models run at once) queue
    cpus_t = ir.ArrayType(I32, MAX_WORKERS + 1)
    cpus = ir.GlobalVariable(m, cpus_t, "cpus")     # the process's CPUs, set once by kiln_pool_set_cpus
    cpus.initializer = ir.Constant(cpus_t, None)
    cpus.linkage = "internal"
    ncpus = _g(m, "ncpus", I32)
    job_cpu = _g(m, "job_cpu", I32, -1)  # the CPU the caller published the job from (sched_getcpu)
    setaff = ir.Function(m, ir.FunctionType(I32, [I32, I64, PTR]), "sched_setaffinity")
    getcpu = ir.Function(m, ir.FunctionType(I32, []), "sched_getcpu")
    syscall = ir.Function(m, ir.FunctionType(I64, [I64], var_arg=True), "syscall")
    pthread_create = ir.Function(m, ir.FunctionType(I32, [PTR, PTR, PTR, PTR]), "pthread_create")
    pause = ir.Function(m, ir.FunctionType(ir.VoidType(), []), "llvm.x86.sse2.pause")

    def loop(b: ir.IRBuilder, name: str):  # noqa: ANN202 - returns (head, body, exit) blocks
        blocks = [b.append_basic_block(f"{name}.{x}") for x in ("head", "body", "exit")]
        b.branch(blocks[0])
        b.position_at_end(blocks[0])
        return blocks

    # run_chunks(p): participant p (the caller 0, worker i: i + 1) takes the chunks of its own segment — the p-th of
    # `job_parts` equal parts of [0, chunks) — from the front, then steals the other segments' from their back; it adds
    # how many it ran to job_done once, when none are left. Each segment's counter is one word on its own cache line:
    # front count | back count << 32, so owner and thief claim by one atomic add each and a chunk is valid while
    # front + back < the segment's length.
    seg_t = ir.ArrayType(ir.ArrayType(I64, 8), MAX_WORKERS + 1)
    segs = ir.GlobalVariable(m, seg_t, "segments")
    segs.initializer = ir.Constant(seg_t, None)
    segs.linkage = "internal"
    segs.align = 64
    parts_g = _g(m, "job_parts", I64)
    run = ir.Function(m, ir.FunctionType(ir.VoidType(), [I64]), "run_chunks")
    run.linkage = "internal"
    b = ir.IRBuilder(run.append_basic_block("entry"))
    me = run.args[0]
    parts = la(b, parts_g, "monotonic", 8)
    total = la(b, total_g, "monotonic", 8)
    ran, k = entry_alloca(b, I64), entry_alloca(b, I64)
    b.store(ir.Constant(I64, 0), ran)
    b.store(ir.Constant(I64, 0), k)
    s_head, s_body, s_done = loop(b, "segment")
    kv = b.load(k, typ=I64)
    b.cbranch(b.icmp_signed("<", kv, parts), s_body, s_done)
    b.position_at_end(s_body)
    q = b.srem(b.add(me, kv), parts)  # me < parts: a worker joins only if its participant id is within the limit
    # segment q = [⌈q·n/P⌉, ⌈(q+1)·n/P⌉): with fewer chunks than participants the first ones hold a chunk each
    round_up = b.sub(parts, ir.Constant(I64, 1))
    lo = b.sdiv(b.add(b.mul(q, total), round_up), parts)
    seg_len = b.sub(b.sdiv(b.add(b.mul(b.add(q, ir.Constant(I64, 1)), total), round_up), parts), lo)
    counter = b.gep(segs, [ir.Constant(I32, 0), q, ir.Constant(I32, 0)])
    own = b.icmp_signed("==", kv, ir.Constant(I64, 0))
    step = b.select(own, ir.Constant(I64, 1), ir.Constant(I64, 1 << 32))
    t_head, t_body, t_done = loop(b, "take")
    old = b.atomic_rmw("add", counter, step, "monotonic")
    front, back = b.and_(old, ir.Constant(I64, 0xFFFFFFFF)), b.lshr(old, ir.Constant(I64, 32))
    b.cbranch(b.icmp_signed("<", b.add(front, back), seg_len), t_body, t_done)
    b.position_at_end(t_body)
    chunk = b.select(own, b.add(lo, front), b.sub(b.add(lo, b.sub(seg_len, ir.Constant(I64, 1))), back))
    fnp = b.inttoptr(la(b, fn_g, "monotonic", 8), ir.PointerType(CHUNK_FN))  # typed for the indirect call
    b.call(fnp, [b.inttoptr(la(b, ctx_g, "monotonic", 8), PTR), chunk])
    b.store(b.add(b.load(ran, typ=I64), ir.Constant(I64, 1)), ran)
    b.branch(t_head)
    b.position_at_end(t_done)
    b.store(b.add(kv, ir.Constant(I64, 1)), k)
    b.branch(s_head)
    b.position_at_end(s_done)
    b.atomic_rmw("add", done_g, b.load(ran, typ=I64), "release")
    b.ret_void()

    # worker(arg): wait for a new generation, join the open job if there is room, run chunks, leave
    worker = ir.Function(m, ir.FunctionType(PTR, [PTR]), "worker")
    worker.linkage = "internal"
    b = ir.IRBuilder(worker.append_basic_block("entry"))
    # pin worker i to CPU i+1 of the process's CPUs: unpinned, the kernel wakes it onto the caller's CPU
    # (measured: a 2-thread mobilenetv2 ran at 1-thread speed after every idle gap)
    idx = b.trunc(b.ptrtoint(worker.args[0], I64), I32)
    n_cpu = b.load(ncpus, typ=I32)
    mask_t = ir.ArrayType(I64, 16)  # 1024 CPUs
    mask = entry_alloca(b, mask_t)
    my_cpu, home = entry_alloca(b, I32), entry_alloca(b, I32)  # where this worker is pinned; its own slot's CPU
    b.store(ir.Constant(I32, -1), my_cpu)

    def pin_to(b: ir.IRBuilder, cpu: ir.Value) -> None:
        b.store(ir.Constant(mask_t, None), mask)
        word = b.gep(mask, [ir.Constant(I32, 0), b.sdiv(cpu, ir.Constant(I32, 64))])
        b.store(b.shl(ir.Constant(I64, 1), b.zext(b.srem(cpu, ir.Constant(I32, 64)), I64)), word)
        b.call(setaff, [ir.Constant(I32, 0), ir.Constant(I64, 128), mask])
        b.store(cpu, my_cpu)
    pin, pinned = b.append_basic_block("pin"), b.append_basic_block("pinned")
    b.cbranch(b.icmp_signed(">", n_cpu, ir.Constant(I32, 1)), pin, pinned)
    b.position_at_end(pin)
    slot = b.srem(b.add(idx, ir.Constant(I32, 1)), n_cpu)
    cpu = b.load(b.gep(cpus, [ir.Constant(I32, 0), slot]), typ=I32)
    b.store(cpu, home)
    pin_to(b, cpu)
    b.branch(pinned)
    b.position_at_end(pinned)
    seen = entry_alloca(b, I32)
    b.store(ir.Constant(I32, 0), seen)
    wait_head, _, _ = loop(b, "forever")
    # spin, then sleep on the futex until gen32 != seen
    spin = entry_alloca(b, I32)
    b.store(ir.Constant(I32, 0), spin)
    poll = b.append_basic_block("poll")
    b.branch(poll)
    b.position_at_end(poll)
    g = la(b, gen32, "acquire", 4)
    s0 = b.load(seen, typ=I32)
    new, idle = b.append_basic_block("new"), b.append_basic_block("idle")
    b.cbranch(b.icmp_unsigned("!=", g, s0), new, idle)
    b.position_at_end(idle)
    n = b.add(b.load(spin, typ=I32), ir.Constant(I32, 1))
    b.store(n, spin)
    keep, sleep = b.append_basic_block("keep"), b.append_basic_block("sleep")
    b.cbranch(b.icmp_unsigned("<", n, ir.Constant(I32, SPINS)), keep, sleep)
    b.position_at_end(keep)
    b.call(pause, [])
    b.branch(poll)
    b.position_at_end(sleep)
    b.atomic_rmw("add", sleepers, ir.Constant(I32, 1), "seq_cst")
    b.call(syscall, [ir.Constant(I64, SYS_FUTEX), gen32, ir.Constant(I32, FUTEX_WAIT), s0, ir.Constant(PTR, None)])
    b.atomic_rmw("sub", sleepers, ir.Constant(I32, 1), "seq_cst")
    b.store(ir.Constant(I32, 0), spin)
    b.branch(poll)
    b.position_at_end(new)
    b.store(g, seen)
    # join: CAS holders+1 while open and below the job's thread limit
    join_head, join_try, join_out = loop(b, "join")
    s = la(b, state, "acquire", 8)
    is_open = b.icmp_unsigned("!=", b.and_(s, ir.Constant(I64, 1)), ir.Constant(I64, 0))
    holders = b.and_(b.lshr(s, ir.Constant(I64, 1)), ir.Constant(I64, 0x7FFFFFFF))
    # room for this worker: below the job's thread limit, and its participant id a part of the job's chunks (worker
    # i is participant i + 1: a worker left from an earlier job with more threads does not take a lower one's part)
    limit = la(b, limit_g, "monotonic", 8)
    room = b.and_(b.icmp_signed("<", holders, limit), b.icmp_signed("<", b.zext(idx, I64), limit))
    b.cbranch(b.and_(is_open, room), join_try, join_out)
    b.position_at_end(join_try)
    pair = b.cmpxchg(state, s, b.add(s, ir.Constant(I64, 2)), "acq_rel", "acquire")
    joined = b.extract_value(pair, 1)
    work = b.append_basic_block("work")
    b.cbranch(joined, work, join_head)
    b.position_at_end(work)
    # the caller runs on this worker's CPU (the kernel put the Python thread there; it is not pinned): the two shared
    # one core, every parallel loop at half speed or worse, until the kernel's balancer moved the caller — 4 to 6
    # back-to-back runs after a compile or load (mobilenetv2 5–8 ms instead of 2.6). Move to the caller's own slot,
    # the first of the process's CPUs (or back home if that is where the caller is now)
    cur = b.load(my_cpu, typ=I32)
    clash = b.and_(b.icmp_signed(">=", cur, ir.Constant(I32, 0)),
                   b.icmp_signed("==", la(b, job_cpu, "monotonic", 4), cur))
    move, moved = b.append_basic_block("move"), b.append_basic_block("moved")
    b.cbranch(clash, move, moved)
    b.position_at_end(move)
    first = b.load(b.gep(cpus, [ir.Constant(I32, 0), ir.Constant(I32, 0)]), typ=I32)
    target = b.select(b.icmp_signed("==", cur, first), b.load(home, typ=I32), first)
    with b.if_then(b.icmp_signed("!=", target, cur)):
        pin_to(b, target)
    b.branch(moved)
    b.position_at_end(moved)
    b.call(run, [b.add(b.zext(idx, I64), ir.Constant(I64, 1))])
    b.atomic_rmw("sub", state, ir.Constant(I64, 2), "release")
    b.branch(wait_head)
    b.position_at_end(join_out)
    b.branch(wait_head)

    # kiln_parallel(fn, ctx, chunks, nthreads)
    par = ir.Function(m, ir.FunctionType(ir.VoidType(), [PTR, PTR, I64, I32]), "kiln_parallel")
    fn, ctx, chunks, nthreads = par.args
    b = ir.IRBuilder(par.append_basic_block("entry"))
    l_head, l_wait, l_got = loop(b, "lock")
    got = b.extract_value(b.cmpxchg(busy, ir.Constant(I32, 0), ir.Constant(I32, 1), "acquire", "monotonic"), 1)
    b.cbranch(got, l_got, l_wait)
    b.position_at_end(l_wait)
    b.call(pause, [])
    b.branch(l_head)
    b.position_at_end(l_got)
    want = b.sext(b.sub(nthreads, ir.Constant(I32, 1)), I64)           # helpers besides the caller
    want = b.select(b.icmp_signed("<", want, ir.Constant(I64, MAX_WORKERS)), want, ir.Constant(I64, MAX_WORKERS))
    # create missing workers (only ever grows)
    tid, zk = entry_alloca(b, I64), entry_alloca(b, I64)
    b.store(ir.Constant(I64, 0), zk)
    c_head, c_body, c_done = loop(b, "spawn")
    have = b.sext(b.load(nworkers, typ=I32), I64)
    b.cbranch(b.icmp_signed("<", have, want), c_body, c_done)
    b.position_at_end(c_body)
    b.call(pthread_create, [tid, ir.Constant(PTR, None), worker, b.inttoptr(have, PTR)])
    b.store(b.add(b.load(nworkers, typ=I32), ir.Constant(I32, 1)), nworkers)
    b.branch(c_head)
    b.position_at_end(c_done)
    # publish
    b.store_atomic(b.ptrtoint(fn, I64), fn_g, "monotonic", 8)
    b.store_atomic(b.ptrtoint(ctx, I64), ctx_g, "monotonic", 8)
    b.store_atomic(chunks, total_g, "monotonic", 8)
    parts = b.add(want, ir.Constant(I64, 1))
    b.store_atomic(parts, parts_g, "monotonic", 8)
    z_head, z_body, z_done = loop(b, "zero")
    zi = b.load(zk, typ=I64)
    b.cbranch(b.icmp_signed("<", zi, parts), z_body, z_done)
    b.position_at_end(z_body)
    b.store_atomic(ir.Constant(I64, 0), b.gep(segs, [ir.Constant(I32, 0), zi, ir.Constant(I32, 0)]), "monotonic", 8)
    b.store(b.add(zi, ir.Constant(I64, 1)), zk)
    b.branch(z_head)
    b.position_at_end(z_done)
    b.store_atomic(ir.Constant(I64, 0), done_g, "monotonic", 8)
    b.store_atomic(want, limit_g, "monotonic", 8)
    b.store_atomic(b.call(getcpu, []), job_cpu, "monotonic", 4)
    old = la(b, state, "monotonic", 8)
    gen = b.add(b.lshr(old, ir.Constant(I64, 32)), ir.Constant(I64, 1))
    b.store_atomic(b.or_(b.shl(gen, ir.Constant(I64, 32)), ir.Constant(I64, 1)), state, "release", 8)
    b.store_atomic(b.trunc(gen, I32), gen32, "release", 4)
    wake, go = b.append_basic_block("wake"), b.append_basic_block("go")
    b.cbranch(b.icmp_signed(">", la(b, sleepers, "seq_cst", 4), ir.Constant(I32, 0)), wake, go)
    b.position_at_end(wake)
    b.call(syscall, [ir.Constant(I64, SYS_FUTEX), gen32, ir.Constant(I32, FUTEX_WAKE), ir.Constant(I32, MAX_WORKERS)])
    b.branch(go)
    b.position_at_end(go)
    b.call(run, [ir.Constant(I64, 0)])

    def wait_until(b: ir.IRBuilder, name: str, cond) -> None:  # noqa: ANN001 - cond(builder) -> i1 (true = done)
        head, body, out = loop(b, name)
        b.cbranch(cond(b), out, body)
        b.position_at_end(body)
        b.call(pause, [])
        b.branch(head)
        b.position_at_end(out)
    wait_until(b, "alldone", lambda b: b.icmp_signed(">=", la(b, done_g, "acquire", 8), chunks))
    # close the job, then wait for joined workers to leave before its fields may change
    x_head, x_try, x_out = loop(b, "close")
    s = la(b, state, "monotonic", 8)
    pair = b.cmpxchg(state, s, b.and_(s, ir.Constant(I64, ~1)), "acq_rel", "monotonic")
    b.cbranch(b.extract_value(pair, 1), x_out, x_try)
    b.position_at_end(x_try)
    b.branch(x_head)
    b.position_at_end(x_out)

    def no_holders(b: ir.IRBuilder) -> ir.Value:
        h = b.and_(b.lshr(la(b, state, "acquire", 8), ir.Constant(I64, 1)), ir.Constant(I64, 0x7FFFFFFF))
        return b.icmp_unsigned("==", h, ir.Constant(I64, 0))
    wait_until(b, "drain", no_holders)
    b.store_atomic(ir.Constant(I32, 0), busy, "release", 4)
    b.ret_void()
    setc = ir.Function(m, ir.FunctionType(ir.VoidType(), [PTR, I32]), "kiln_pool_set_cpus")
    b = ir.IRBuilder(setc.append_basic_block("entry"))
    src, n = setc.args
    for i in range(MAX_WORKERS + 1):
        b.store(b.load(b.gep(src, [ir.Constant(I32, i)], source_etype=I32), typ=I32),
                b.gep(cpus, [ir.Constant(I32, 0), ir.Constant(I32, i)]))
    b.store(n, ncpus)
    b.ret_void()
    for f in (run, worker, par):  # blocks a loop() made but left unused (the worker never exits)
        for blk in f.blocks:
            if not blk.is_terminated:
                ir.IRBuilder(blk).unreachable()
    return m


@functools.cache
def pool_address() -> int:
    """JIT the pool once per process; returns the address of kiln_parallel."""
    from kiln.codegen.jit import LoadedObject, emit_object, optimize
    from kiln.codegen.module import opaque_pointers
    from kiln.target import host

    with opaque_pointers():
        text = str(build_module())
    tgt = host()
    loaded = _load_cached(text, tgt)
    if loaded is None:
        obj = emit_object(optimize(text, tgt), tgt)
        loaded = LoadedObject(obj, tgt)
        _store(text, tgt, obj)
    _KEEP.append(loaded)
    try:
        mine = sorted(os.sched_getaffinity(0))[:MAX_WORKERS + 1]
    except AttributeError:  # not Linux: no pinning
        mine = []
    if os.environ.get("KILN_PIN_THREADS", "1") == "0":
        mine = []
    arr = (ctypes.c_int32 * (MAX_WORKERS + 1))(*mine)
    ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int32)(loaded.address("kiln_pool_set_cpus"))(
        ctypes.addressof(arr), len(mine))
    return loaded.address("kiln_parallel")


def _cache_path(text: str, tgt) -> str:  # noqa: ANN001 - kiln.target.Target
    """The pool's object in Kiln's cache directory, keyed by its IR and the target: a process that loads a model
    from the cache need not spend ~60 ms JIT-compiling the pool first (resnet50 from the cache: ~0.22 → ~0.16 s).
    The file is the object's SHA-256, then the object."""
    from kiln.cachedir import cache_dir

    key = hashlib.sha256(f"{tgt.key}\n{text}".encode()).hexdigest()[:32]
    return os.path.join(cache_dir(), f"threadpool-{key}.o")


def _load_cached(text: str, tgt):  # noqa: ANN001, ANN202 - Target → LoadedObject | None
    from kiln.codegen.jit import LoadedObject

    try:
        with open(_cache_path(text, tgt), "rb") as f:
            digest, obj = f.read(32), f.read()
        if hashlib.sha256(obj).digest() != digest:  # damaged: LLVM would abort the process on a bad object
            return None
        loaded = LoadedObject(obj, tgt)
        loaded.address("kiln_parallel")
        return loaded
    except Exception:  # noqa: BLE001 - absent, unreadable or damaged: compile it again (and rewrite it)
        return None


def _store(text: str, tgt, obj: bytes) -> None:  # noqa: ANN001
    try:
        with atomic_path(_cache_path(text, tgt)) as tmp, open(tmp, "wb") as f:
            f.write(hashlib.sha256(obj).digest() + obj)
    except OSError:  # a read-only cache directory: the pool is compiled per process, as before
        pass


_KEEP: list[object] = []
PARALLEL_T = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int32)
