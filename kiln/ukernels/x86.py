"""Hand-written x86 f32 GEMM microkernels in LLVM IR (AVX-512 and AVX2 with explicit `llvm.fma` intrinsics; SSE,
which has no FMA, with a multiply and an add).

One kernel computes an MR×NR tile of C from a packed A panel and a packed B panel (the interface of every
Kiln microkernel, see kiln/ukernels/__init__.py):

    void kiln_ukr_<isa>_f32_<MR>x<NR>(ptr A,      /* packed [K][MR]: column k of MR rows, contiguous        */
                                      ptr B,      /* packed [K][NR]: row k of the NR-wide panel, contiguous */
                                      ptr C,      /* the MR×NR tile, row stride ldc floats                 */
                                      i64 ldc, i64 K, i32 accumulate)
    C[i][j] = (accumulate ? C[i][j] : 0) + Σ_k A[k][i] · B[k][j]        for i < MR, j < NR

Design (BLIS-style outer-product kernel):
  * MR×(NR/W) accumulator vectors stay in registers for the whole K loop (W = 16 lanes on AVX-512, 8 on
    AVX2). AVX-512 14×32: 28 zmm accumulators + 2 B vectors of the 32 zmm registers (A broadcasts fold into
    the FMA's memory operand, `vfmadd231ps zmm, zmm, [mem]{1to16}`). AVX2 6×16: 12 ymm accumulators + 2 B
    vectors + 1 broadcast of 16 ymm registers. Zen 4 issues one 512-bit (or two 256-bit) FMA per cycle with
    4 cycles latency: 28 (or 12) independent chains keep the FMA pipes full.
  * Each k step: NR/W vector loads of B, MR scalar loads of A broadcast, MR·NR/W FMAs. The K loop is unrolled
    UNROLL times (one loop branch per UNROLL steps), then a remainder loop of single steps.
  * B is prefetched PREFETCH_STEPS k-steps ahead into L1 (the panel streams from L2); A is small and hot.
  * Loads and stores of caller memory use `align 4` (numpy/arena buffers are only 4-byte aligned); the
    packed A panel is the compiler's own 64-byte-aligned block.
Smaller MR (edge and skinny shapes: M = 1 for a GEMV-like layer) and the one-vector narrow edge kernels come
from the same template, as BLIS and IREE's mmt4d keep a family of edge kernels next to the main one.
Measured (1 thread, inputs hot in L1/L2, K = 256…1024): 14×32 AVX-512 116 GFLOP/s and 6×16 AVX2 116 GFLOP/s,
99% of the 117.4 GFLOP/s per-core FMA peak of this Zen 4."""
from __future__ import annotations

UNROLL = 4           # k steps per loop iteration (measured: 1, 2, 4, 8 within noise; 4 keeps the code small)
LATENCY_CHAINS = 8  # independent FMA chains that keep Zen 4's FMA pipes busy (2 pipes × 4 cycles latency)
PREFETCH_STEPS = 8   # how far ahead (in k steps) B is prefetched (measured: 0, 8, 24 within noise on Zen 4)


def kernel_name(isa: str, mr: int, nr: int, cols: int | None = None, rows_a: bool = False) -> str:
    """kiln_ukr_<isa>_f32_<MR>x<NR>; a narrow edge kernel computing only the first `cols` columns of NR-wide
    panels is kiln_ukr_<isa>_f32_<MR>x<cols>_b<NR>; one reading A in place (`rows_a`) ends in _ra."""
    name = f"kiln_ukr_{isa}_f32_{mr}x{nr}" if cols in (None, nr) else f"kiln_ukr_{isa}_f32_{mr}x{cols}_b{nr}"
    return name + "_ra" if rows_a else name


def x86_kernel_ir(isa: str, mr: int, nr: int, width: int, unroll: int = UNROLL,
                  prefetch_steps: int = PREFETCH_STEPS, cols: int | None = None, rows_a: bool = False,
                  name: str | None = None) -> str:
    """The LLVM IR definition of one MR×NR kernel with W-lane vectors (a fixed kernel; this only writes out
    its unrolled rows). `cols` < NR: the narrow edge kernel for a last panel with ≤ cols valid columns — it
    computes and stores only C[:, :cols] (B rows still NR floats apart), saving the FMAs of the empty half.

    `rows_a`: A read in place — MR rows of a row-major matrix, not a packed panel —, C overwritten: the arguments
    end `i64 lda, i64 rows` instead of `i32 accumulate`, and A[k][i] is A[min(i, rows − 1)·lda + k] (rows past
    `rows` repeat the last, as the packing kernel's do). A dynamic build's GEMM tails call these
    (schedule/tail_calls.py): a few rows, where packing them would cost as much as their tile. `name` overrides the
    family's name (those kernels are named by their prefetch distance too: kiln.ukernels.rows_ukernel_for)."""
    cols = nr if cols is None else cols
    if nr % width or cols % width or not 0 < cols <= nr or mr < 1 or unroll < 1:
        raise ValueError(f"bad microkernel shape {mr}x{cols} of {nr} for {width}-lane vectors (unroll {unroll})")
    nv = cols // width
    fused = isa != "sse"
    vt = f"<{width} x float>"
    name = name or kernel_name(isa, mr, nr, cols, rows_a)
    accs = [(i, v) for i in range(mr) for v in range(nv)]
    out: list[str] = []
    emit = out.append

    def step(k: str, src: dict[tuple[int, int], str], tag: str) -> dict[tuple[int, int], str]:
        """One rank-1 update at k-step value %k: returns the names of the new accumulators."""
        for v in range(nv):
            emit(f"  %bo.{tag}.{v} = add i64 %kb.{tag}, {v * width}")
            emit(f"  %bp.{tag}.{v} = getelementptr float, ptr %B, i64 %bo.{tag}.{v}")
            emit(f"  %b.{tag}.{v} = load {vt}, ptr %bp.{tag}.{v}, align 4")
        new: dict[tuple[int, int], str] = {}
        for i in range(mr):
            if rows_a:
                emit(f"  %ap.{tag}.{i} = getelementptr float, ptr %arow.{i}, i64 {k}")
            else:
                emit(f"  %ao.{tag}.{i} = add i64 %ka.{tag}, {i}")
                emit(f"  %ap.{tag}.{i} = getelementptr float, ptr %A, i64 %ao.{tag}.{i}")
            emit(f"  %a.{tag}.{i} = load float, ptr %ap.{tag}.{i}, align 4")
            emit(f"  %ai.{tag}.{i} = insertelement {vt} poison, float %a.{tag}.{i}, i64 0")
            emit(f"  %as.{tag}.{i} = shufflevector {vt} %ai.{tag}.{i}, {vt} poison, <{width} x i32> zeroinitializer")
            for v in range(nv):
                d = f"%c.{tag}.{i}.{v}"
                if fused:
                    emit(f"  {d} = call {vt} @llvm.fma.v{width}f32({vt} %as.{tag}.{i}, {vt} %b.{tag}.{v}, "
                         f"{vt} {src[(i, v)]})")
                else:  # SSE has no FMA: a multiply and an add (a libm fmaf per lane otherwise)
                    emit(f"  %p.{tag}.{i}.{v} = fmul {vt} %as.{tag}.{i}, %b.{tag}.{v}")
                    emit(f"  {d} = fadd {vt} {src[(i, v)]}, %p.{tag}.{i}.{v}")
                new[(i, v)] = d
        return new

    def offsets(k: str, tag: str) -> None:
        if not rows_a:
            emit(f"  %ka.{tag} = mul i64 {k}, {mr}")
        emit(f"  %kb.{tag} = mul i64 {k}, {nr}")

    tail = ", i64 %lda, i64 %rows" if rows_a else ", i32 %accumulate"
    emit(f"define internal void @{name}(ptr noalias nocapture readonly %A, ptr noalias nocapture readonly %B, "
         f"ptr noalias nocapture %C, i64 %ldc, i64 %K{tail}) nounwind noinline {{")
    emit("entry:")
    if rows_a:  # the rows' addresses, the last one repeated past `rows`
        emit("  %last = sub i64 %rows, 1")
        for i in range(mr):
            emit(f"  %lt.{i} = icmp slt i64 {i}, %rows")
            emit(f"  %ri.{i} = select i1 %lt.{i}, i64 {i}, i64 %last")
            emit(f"  %ro.{i} = mul i64 %ri.{i}, %lda")
            emit(f"  %arow.{i} = getelementptr float, ptr %A, i64 %ro.{i}")
    if rows_a:  # C is overwritten (no accumulate flag)
        emit("  br label %start")
    else:
        emit("  %acc.on = icmp ne i32 %accumulate, 0")
        emit("  br i1 %acc.on, label %loadc, label %start")
        emit("loadc:")
        for i in range(mr):
            emit(f"  %lrow.{i} = mul i64 %ldc, {i}")
            for v in range(nv):
                emit(f"  %lo.{i}.{v} = add i64 %lrow.{i}, {v * width}")
                emit(f"  %lp.{i}.{v} = getelementptr float, ptr %C, i64 %lo.{i}.{v}")
                emit(f"  %l.{i}.{v} = load {vt}, ptr %lp.{i}.{v}, align 4")
        emit("  br label %start")
    emit("start:")
    for i, v in accs:
        loaded = "" if rows_a else f", [ %l.{i}.{v}, %loadc ]"
        emit(f"  %s.{i}.{v} = phi {vt} [ zeroinitializer, %entry ]{loaded}")
    emit(f"  %kmain = and i64 %K, {-unroll}")
    emit("  %has.main = icmp sgt i64 %kmain, 0")
    emit("  br i1 %has.main, label %main, label %main.done")
    # main loop: UNROLL steps per iteration
    emit("main:")
    emit("  %k = phi i64 [ 0, %start ], [ %k.next, %main ]")
    # few accumulators (MR·NR/W < LATENCY_CHAINS: skinny M) cannot hide the FMA latency: the unrolled steps
    # then rotate over `sets` independent partial tiles, summed after the loop
    sets = max(1, min(unroll, -(-LATENCY_CHAINS // len(accs))))
    for s_ in range(sets):
        for i, v in accs:
            init = f"%s.{i}.{v}" if s_ == 0 else "zeroinitializer"
            emit(f"  %m{s_}.{i}.{v} = phi {vt} [ {init}, %start ], [ @NEXT{s_}.{i}.{v}@, %main ]")
    cur_sets = [{(i, v): f"%m{s_}.{i}.{v}" for i, v in accs} for s_ in range(sets)]
    for u in range(unroll):
        emit(f"  %k.u{u} = add i64 %k, {u}")
        offsets(f"%k.u{u}", f"u{u}")
        cur_sets[u % sets] = step(f"%k.u{u}", cur_sets[u % sets], f"u{u}")
    if prefetch_steps:
        # one prefetch per 64-byte line of B that the next-but-some iteration reads
        lines = max(1, unroll * nr * 4 // 64)
        emit(f"  %pf.k = add i64 %k, {prefetch_steps}")
        emit(f"  %pf.o = mul i64 %pf.k, {nr}")
        for ln in range(lines):
            emit(f"  %pf.o{ln} = add i64 %pf.o, {ln * 16}")
            emit(f"  %pf.p{ln} = getelementptr float, ptr %B, i64 %pf.o{ln}")
            emit(f"  call void @llvm.prefetch.p0(ptr %pf.p{ln}, i32 0, i32 3, i32 1)")
    emit(f"  %k.next = add i64 %k, {unroll}")
    emit("  %more = icmp slt i64 %k.next, %kmain")
    emit("  br i1 %more, label %main, label %main.done")
    emit("main.done:")
    emit("  %kr = phi i64 [ 0, %start ], [ %k.next, %main ]")
    for i, v in accs:  # phis first (LLVM wants them at the top of the block), then the sums
        for s_ in range(sets):
            init = f"%s.{i}.{v}" if s_ == 0 else "zeroinitializer"
            name_ = f"%r0.{i}.{v}" if sets == 1 else f"%d{s_}.{i}.{v}"
            emit(f"  {name_} = phi {vt} [ {init}, %start ], [ {cur_sets[s_][(i, v)]}, %main ]")
    for i, v in accs:
        total = f"%d0.{i}.{v}"
        for s_ in range(1, sets):
            dst = f"%r0.{i}.{v}" if s_ == sets - 1 else f"%sum{s_}.{i}.{v}"
            emit(f"  {dst} = fadd {vt} {total}, %d{s_}.{i}.{v}")
            total = dst
    if unroll > 1:  # remainder: single steps
        emit("  %has.rem = icmp slt i64 %kr, %K")
        emit("  br i1 %has.rem, label %rem, label %store")
        emit("rem:")
        emit("  %q = phi i64 [ %kr, %main.done ], [ %q.next, %rem ]")
        for i, v in accs:
            emit(f"  %rq.{i}.{v} = phi {vt} [ %r0.{i}.{v}, %main.done ], [ %c.r.{i}.{v}, %rem ]")
        offsets("%q", "r")
        step("%q", {(i, v): f"%rq.{i}.{v}" for i, v in accs}, "r")
        emit("  %q.next = add i64 %q, 1")
        emit("  %q.more = icmp slt i64 %q.next, %K")
        emit("  br i1 %q.more, label %rem, label %store")
    else:  # one step per iteration: no remainder
        emit("  br label %store")
    emit("store:")
    for i, v in accs:
        came = f", [ %c.r.{i}.{v}, %rem ]" if unroll > 1 else ""
        emit(f"  %f.{i}.{v} = phi {vt} [ %r0.{i}.{v}, %main.done ]{came}")
    for i in range(mr):
        emit(f"  %srow.{i} = mul i64 %ldc, {i}")
        for v in range(nv):
            emit(f"  %so.{i}.{v} = add i64 %srow.{i}, {v * width}")
            emit(f"  %sp.{i}.{v} = getelementptr float, ptr %C, i64 %so.{i}.{v}")
            emit(f"  store {vt} %f.{i}.{v}, ptr %sp.{i}.{v}, align 4")
    emit("  ret void")
    emit("}")
    # the main loop's phis refer to the last unrolled step's values by the names step() produced
    text = "\n".join(out)
    for s_, cur in enumerate(cur_sets):
        for (i, v), name_ in cur.items():
            text = text.replace(f"@NEXT{s_}.{i}.{v}@", name_)
    decls = [f"declare {vt} @llvm.fma.v{width}f32({vt}, {vt}, {vt})"] if fused else []
    if prefetch_steps:
        decls.append("declare void @llvm.prefetch.p0(ptr nocapture readonly, i32 immarg, i32 immarg, i32 immarg)")
    return text + "\n" + "\n".join(decls) + "\n"


def pack_name(isa: str, mr: int) -> str:
    return f"kiln_pack_{isa}_f32_{mr}"


def x86_pack_ir(isa: str, mr: int, width: int) -> str:
    """The LLVM IR of the A-packing kernel that goes with the MR-row GEMM kernels (BLIS's "packm"):

        void kiln_pack_<isa>_f32_<MR>(ptr src, i64 lda, i64 rows, i64 K, ptr dst)
        dst[k·MR + i] = src[min(i, rows − 1)·lda + k]        for i < MR, k < K

    i.e. MR rows of a row-major matrix (rows past `rows` repeat the last valid one) into the [K][MR] panel.
    Per block of W columns: MR row vectors are loaded (contiguous), transposed in registers by log2(W)
    butterfly stages of two-source shuffles (vpermt2ps), and each column's MR floats stored; the K % W tail is
    scalar. Without it the compiler packs with scatters or gathers (≈ 2 cycles per element on Zen 4)."""
    if mr > width:
        raise ValueError(f"pack kernel: MR={mr} rows exceed the {width}-lane transpose")
    vt, mt = f"<{width} x float>", f"<{mr} x float>"
    name = pack_name(isa, mr)
    out: list[str] = []
    emit = out.append
    emit(f"define internal void @{name}(ptr noalias nocapture readonly %src, i64 %lda, i64 %rows, i64 %K, "
         f"ptr noalias nocapture %dst) nounwind noinline {{")
    emit("entry:")
    emit("  %last = sub i64 %rows, 1")
    for i in range(mr):
        emit(f"  %lt.{i} = icmp slt i64 {i}, %last")
        emit(f"  %ri.{i} = select i1 %lt.{i}, i64 {i}, i64 %last")
        emit(f"  %ro.{i} = mul i64 %ri.{i}, %lda")
        emit(f"  %row.{i} = getelementptr float, ptr %src, i64 %ro.{i}")
    emit(f"  %kmain = and i64 %K, {-width}")
    emit("  %has.main = icmp sgt i64 %kmain, 0")
    emit("  br i1 %has.main, label %main, label %main.done")
    emit("main:")
    emit("  %k = phi i64 [ 0, %entry ], [ %k.next, %main ]")
    cur = []
    for i in range(width):
        if i < mr:
            emit(f"  %lp.{i} = getelementptr float, ptr %row.{i}, i64 %k")
            emit(f"  %v0.{i} = load {vt}, ptr %lp.{i}, align 4")
            cur.append(f"%v0.{i}")
        else:
            cur.append("poison")
    stage, d = 0, width // 2
    while d >= 1:  # swap the off-diagonal d×d blocks of every 2d×2d block: after d = W/2 … 1, transposed
        nxt = list(cur)
        for i in range(width):
            if i & d:
                continue
            j = i + d
            lo = [k if not k & d else width + k - d for k in range(width)]   # [A C]
            hi = [k + d if not k & d else width + k for k in range(width)]   # [B D]
            for dst_row, mask in ((i, lo), (j, hi)):
                m = ", ".join(f"i32 {x}" for x in mask)
                emit(f"  %v{stage + 1}.{dst_row} = shufflevector {vt} {cur[i]}, {vt} {cur[j]}, <{width} x i32> <{m}>")
                nxt[dst_row] = f"%v{stage + 1}.{dst_row}"
        cur, d, stage = nxt, d // 2, stage + 1
    first = ", ".join(f"i32 {x}" for x in range(mr))
    for c in range(width):  # column c of the block: k = %k + c, its MR rows in the first MR lanes
        emit(f"  %col.{c} = shufflevector {vt} {cur[c]}, {vt} poison, <{mr} x i32> <{first}>")
        emit(f"  %kc.{c} = add i64 %k, {c}")
        emit(f"  %so.{c} = mul i64 %kc.{c}, {mr}")
        emit(f"  %sp.{c} = getelementptr float, ptr %dst, i64 %so.{c}")
        emit(f"  store {mt} %col.{c}, ptr %sp.{c}, align 4")
    emit(f"  %k.next = add i64 %k, {width}")
    emit("  %more = icmp slt i64 %k.next, %kmain")
    emit("  br i1 %more, label %main, label %main.done")
    emit("main.done:")
    emit("  %kr = phi i64 [ 0, %entry ], [ %k.next, %main ]")
    emit("  %has.rem = icmp slt i64 %kr, %K")
    emit("  br i1 %has.rem, label %rem, label %exit")
    emit("rem:")
    emit("  %q = phi i64 [ %kr, %main.done ], [ %q.next, %rem ]")
    emit(f"  %qo = mul i64 %q, {mr}")
    for i in range(mr):
        emit(f"  %qp.{i} = getelementptr float, ptr %row.{i}, i64 %q")
        emit(f"  %qv.{i} = load float, ptr %qp.{i}, align 4")
        emit(f"  %qd.{i} = add i64 %qo, {i}")
        emit(f"  %qs.{i} = getelementptr float, ptr %dst, i64 %qd.{i}")
        emit(f"  store float %qv.{i}, ptr %qs.{i}, align 4")
    emit("  %q.next = add i64 %q, 1")
    emit("  %q.more = icmp slt i64 %q.next, %K")
    emit("  br i1 %q.more, label %rem, label %exit")
    emit("exit:")
    emit("  ret void")
    emit("}")
    return "\n".join(out) + "\n"
