"""Hand-written dot-product GEMM microkernels — 8-bit (int32 accumulators) and bf16 (float32 accumulators) — one per
ISA's dot-product instruction, in LLVM IR: the `ukernel` strategy of the integer and bf16 anchors
(kiln/schedule/dot_ukernel.py). One narrow interface, a batch-reduce
GEMM block (oneDNN's brgemm) whose A rows are read in place, where they are (a GEMM's activation rows, a blocked
conv input's pixels at every tap):

    void kiln_ukr_<method>_<ab>_<MR>x<NR>(
        ptr A, i64 lda, i64 rows,     /* row i of A at A + min(i, rows − 1)·lda (bytes): rows past `rows` repeat  */
        ptr B,                        /* the weight panel in VNNI order, one step after another (below)          */
        ptr C, i64 ldc,               /* the MR×NR C tile (int32 / float32), row stride ldc elements; overwritten */
        i64 n2, i64 sa2, i64 n1, i64 sa1, i64 n0, i64 sa0,   /* the steps: for i2 < n2, i1 < n1, i0 < n0      */
        i64 K4)                       /* 4-byte groups per step (≥ 1)                                            */

    step s = (i2·n1 + i1)·n0 + i0 reads A at a = i2·sa2 + i1·sa1 + i0·sa0 bytes past each row's start, K4 groups
    of 4 consecutive bytes, and B at B + s·K4·NR·4: K4 rows of NR columns × 4 bytes (graph/quant_pack.py; for bf16
    the pair order of graph/passes/precision.py: a 4-byte group is a pair of bf16 values; for int16 weights
    (`<ab>` u8s16 / s8s16) a group is a pair of int16 values, and A's group its 2 bytes)
    C[i][j] = Σ_s Σ_{q<K4} Σ_{g<G} A[i][a + G·q + g] · B[s][q][j][g]     (G = 4 bytes, or 2 bf16 / int16)

A GEMM is one step (n2 = n1 = n0 = 1, K4 = K/4); a blocked 3×3 conv has (Ci/cb, kh, kw) steps of cb/4 groups, A
advancing by the input's channel-block, row and pixel strides: the whole reduction is one call, its accumulators
in registers throughout (no C reload per tap).

Methods (`<method>`; `<ab>` = A's then B's type, u8s8 or s8s8, u8s16 or s8s16 (int16 weights), or bf16):
    vnni512  x86 AVX-512 VNNI: vpdpbusd zmm (u8 × s8), A's 4-byte group broadcast from memory ({1to16})
    vnni256, vnni128  x86 AVX-VNNI / AVX-512 VNNI + VL: vpdpbusd ymm / xmm
    pmaddwd<bits>  x86 without VNNI (or s8 A): with int16 weights (u8s16 / s8s16: graph/quant_pack.py dot_group)
             A's pair zero- or sign-extended and broadcast, one vpmaddwd per pair; with int8 ones (an s8 A on a VNNI
             CPU) both widened to int16 pairs, two vpmaddwd per group (exact)
    sdot     AArch64 dotprod: SDOT v.4s (s8 × s8)
    i8mm     AArch64 i8mm: SMMLA v.4s — a 2×2 int32 block from 2 rows × 8 bytes and 2 columns × 8 bytes, i.e. two
             groups per instruction: twice SDOT's multiply-adds per instruction. B's columns are interleaved per
             pair of groups in registers (zip1/zip2 of consecutive rows of the panel), so it reads the same VNNI
             panels as every other method; an odd last group runs with the upper half zero.
    dpbf16_512, dpbf16_256  x86 AVX512_BF16 (+ VL): vdpbf16ps zmm / ymm, a bf16 pair per float32 lane
    bfmmla   AArch64 BF16: BFMMLA v.4s — SMMLA's 2×2 block with 4 bf16 per row and column (two pairs), the same zips
Registers (MR, NR at two vectors): AVX-512 14×32 (28 zmm accumulators), AVX2 6×16 (12 ymm), SSE 4×8, AArch64 8×8
(16 q registers); NR one vector where the weights were packed so (a blocked conv whose channel block is one vector)."""
from __future__ import annotations

import functools
from dataclasses import dataclass

from kiln.target import Target, features_on
from kiln.ukernels import steps

# method → (32-bit lanes per vector, main MR); NR is one or two vectors (the panel width the weights were packed for)
METHODS: dict[str, tuple[int, int]] = {
    "vnni512": (16, 14), "pmaddwd512": (16, 14),
    "vnni256": (8, 6), "pmaddwd256": (8, 6),
    "vnni128": (4, 4), "pmaddwd128": (4, 4),
    "sdot": (4, 8), "i8mm": (4, 8),
    "dpbf16_512": (16, 14), "dpbf16_256": (8, 6), "bfmmla": (4, 8),
}
BLOCKS = ("i8mm", "bfmmla")   # the 2×2-block methods (row pairs × column pairs)


@dataclass(frozen=True)
class DotUKernel:
    name: str
    method: str
    ab: str        # u8s8 | s8s8 | bf16
    mr: int
    nr: int
    ir_text: str


def method_for(target: Target, a_dtype: str, nr: int) -> tuple[str | None, str]:
    """(the method of `target`'s microkernel for A of `a_dtype` (uint8 / int8 / bfloat16) and NR-wide panels, or
    None; why not). x86: the widest vector that divides NR (a blocked layout's 8-channel panels on AVX-512 take ymm);
    8-bit: vpdpbusd where the CPU has it at that width and A is u8, else vpmaddwd; bf16: vdpbf16ps."""
    f = features_on(target.features)
    if not target.fixed_dot_tiles:  # (SVE targets: the NEON microkernels)
        return None, f"no dot-product microkernel for scalable vectors ({target.name})"
    bf16 = a_dtype == "bfloat16"
    if target.arch == "x86_64":
        bits = next((b for b in (512, 256, 128) if b <= target.vector_bits and nr % (b // 32) == 0), 0)
        if not bits:
            return None, f"no microkernel for {nr}-column panels"
        if bf16:
            if "avx512bf16" not in f or bits == 128 or (bits == 256 and "avx512vl" not in f):
                return None, f"no bf16 dot product (AVX512_BF16) on {target.name} at {bits} bits"
            method = f"dpbf16_{bits}"
        else:
            vnni = "avx512vnni" in f if bits == 512 else ("avxvnni" in f or {"avx512vnni", "avx512vl"} <= f)
            method = f"vnni{bits}" if vnni and a_dtype == "uint8" else f"pmaddwd{bits}"
    elif target.arch == "aarch64" and (a_dtype == "int8" or bf16):
        method = ("bfmmla" if "bf16" in f else "") if bf16 else "i8mm" if "i8mm" in f else "sdot" if "dotprod" in f \
            else ""
        if not method:
            need = "bf16" if bf16 else "dotprod or i8mm"
            return None, f"no {a_dtype} microkernel for {target.name} without {need}"
    else:
        return None, f"no microkernel for {target.name} with {a_dtype} activations"
    lanes = METHODS[method][0]
    if nr % lanes or nr > 2 * lanes:
        return None, f"no microkernel {method} for {nr}-column panels"
    return method, ""


def operands_of(method: str) -> tuple[str, ...]:
    """The `<ab>` a method multiplies."""
    return ("u8s8",) if method.startswith("vnni") else ("s8s8",) if method in ("sdot", "i8mm") else \
        ("bf16",) if "bf" in method else ("u8s8", "s8s8", "u8s16", "s8s16")


@functools.cache
def dot_ukernel(method: str, ab: str, mr: int, nr: int) -> DotUKernel:
    lanes, main_mr = METHODS[method]
    even = method in BLOCKS
    if not 1 <= mr <= main_mr or (even and mr % 2) or nr % lanes or nr > 2 * lanes:
        raise ValueError(f"{method} microkernels have 1..{main_mr} rows{' (even)' if even else ''} "
                         f"and {lanes} or {2 * lanes} columns, not {mr}x{nr}")
    if ab not in operands_of(method):
        raise ValueError(f"{method} multiplies {' or '.join(operands_of(method))}, not {ab}")
    name = f"kiln_ukr_{method}_{ab}_{mr}x{nr}"
    return DotUKernel(name, method, ab, mr, nr, _kernel_ir(name, method, ab, mr, nr, lanes))


ARGS = ("ptr noalias nocapture readonly %A, i64 %lda, i64 %rows, ptr noalias nocapture readonly %B, "
        "ptr noalias nocapture %C, i64 %ldc, i64 %n2, i64 %sa2, i64 %n1, i64 %sa1, i64 %n0, i64 %sa0, i64 %K4")


def _kernel_ir(name: str, method: str, ab: str, mr: int, nr: int, w: int) -> str:
    """The kernel: a whole tile (rows = MR) runs a copy whose rows are A + i·lda — linear, so the row addresses
    share base registers (base + lda·{1, 2, 4, 8}) — instead of MR clamped row pointers, which need more general
    registers than x86 has beside the loop's own (spilled and reloaded every step at MR = 14)."""
    typed = ", ".join(" ".join([a.split()[0], a.split()[-1]]) for a in ARGS.split(", "))
    return "\n".join([
        f"define internal void @{name}({ARGS}) nounwind noinline {{",
        "entry:",
        f"  %full = icmp eq i64 %rows, {mr}",
        "  br i1 %full, label %whole, label %part",
        "whole:",
        f"  call void @{name}.whole({typed})",
        "  ret void",
        "part:",
        f"  call void @{name}.part({typed})",
        "  ret void",
        "}",
        _body_ir(f"{name}.whole", method, ab, mr, nr, w, clamp=False),
        _body_ir(f"{name}.part", method, ab, mr, nr, w, clamp=True)]) + "\n".join(_decls(method, w)) + "\n"


def _body_ir(name: str, method: str, ab: str, mr: int, nr: int, w: int, clamp: bool) -> str:
    out: list[str] = []
    emit = out.append
    mm = method in BLOCKS
    nv = nr // w
    # accumulators: (row, vector) <w x i32 | float>; 2×2 blocks: (row pair, column pair) <4 x …>
    accs = [(i, v) for i in range(mr // 2) for v in range(nr // 2)] if mm else [(i, v) for i in range(mr)
                                                                               for v in range(nv)]
    at = f"<{4 if mm else w} x {'float' if ab == 'bf16' else 'i32'}>"
    emit(f"define internal void @{name}({ARGS}) nounwind noinline {{")
    emit("entry:")
    if clamp:
        emit("  %last = sub i64 %rows, 1")
    for i in range(mr):
        if clamp:
            emit(f"  %lt.{i} = icmp slt i64 {i}, %rows")
            emit(f"  %ri.{i} = select i1 %lt.{i}, i64 {i}, i64 %last")
            emit(f"  %ro.{i} = mul i64 %ri.{i}, %lda")
        else:
            emit(f"  %ro.{i} = mul i64 %lda, {i}")
        emit(f"  %arow.{i} = getelementptr i8, ptr %A, i64 %ro.{i}")
    out.extend(steps.setup())                   # the K-step walk (kiln/ukernels/steps.py)
    emit(f"  %bstep = mul i64 %K4, {4 * nr}")
    emit(f"  %kmain = and i64 %K4, {-2 if mm else -1}")
    emit("  %has.main = icmp sgt i64 %kmain, 0")
    emit("  br label %step")

    def phis(src: list[tuple[str, str]], prefix: str) -> dict[tuple[int, int], str]:
        names = {}
        for a in accs:
            n = f"%{prefix}.{a[0]}.{a[1]}"
            emit(f"  {n} = phi {at} " + ", ".join(f"[ {s(a)}, %{b} ]" for s, b in src))
            names[a] = n
        return names

    # step loop header: s, offa, i0, i1 and the accumulators
    emit("step:")
    emit("  %s = phi i64 [ 0, %entry ], [ %s1, %kdone ]")
    emit("  %offa = phi i64 [ 0, %entry ], [ %offan, %kdone ]")
    emit("  %i0 = phi i64 [ 0, %entry ], [ %i0n, %kdone ]")
    emit("  %i1 = phi i64 [ 0, %entry ], [ %i1n, %kdone ]")
    step_acc = phis([(lambda a: "zeroinitializer", "entry"), (lambda a: f"%fin.{a[0]}.{a[1]}", "kdone")], "sa")
    emit("  %bsoff = mul i64 %s, %bstep")
    emit("  %bs = getelementptr i8, ptr %B, i64 %bsoff")
    for i in range(mr):
        emit(f"  %ab.{i} = getelementptr i8, ptr %arow.{i}, i64 %offa")
    emit("  br i1 %has.main, label %kloop, label %kpost")
    emit("kloop:")
    emit("  %q = phi i64 [ 0, %step ], [ %q.n, %kloop ]")
    k_acc = phis([(lambda a: step_acc[a], "step"), (lambda a: f"%kn.{a[0]}.{a[1]}", "kloop")], "ka")
    new = (_i8mm_groups if mm else _vector_group)(emit, method, ab, mr, nr, w, "%q", k_acc, "k", pair=True)
    for a in accs:
        emit(f"  %kn.{a[0]}.{a[1]} = bitcast {at} {new[a]} to {at}")  # a stable name for the loop phi
    emit(f"  %q.n = add i64 %q, {2 if mm else 1}")
    emit("  %q.more = icmp slt i64 %q.n, %kmain")
    emit("  br i1 %q.more, label %kloop, label %kpost")
    emit("kpost:")
    post = phis([(lambda a: step_acc[a], "step"), (lambda a: f"%kn.{a[0]}.{a[1]}", "kloop")], "kp")
    if mm:  # an odd last group: its upper half zero
        emit("  %odd = icmp ne i64 %kmain, %K4")
        emit("  br i1 %odd, label %ktail, label %kdone")
        emit("ktail:")
        tail = _i8mm_groups(emit, method, ab, mr, nr, w, "%kmain", post, "t", pair=False)
        emit("  br label %kdone")
        emit("kdone:")
        fin = {a: f"%fin.{a[0]}.{a[1]}" for a in accs}
        for a in accs:
            emit(f"  {fin[a]} = phi {at} [ {post[a]}, %kpost ], [ {tail[a]}, %ktail ]")
    else:
        emit("  br label %kdone")
        emit("kdone:")
        for a in accs:
            emit(f"  %fin.{a[0]}.{a[1]} = bitcast {at} {post[a]} to {at}")
    out.extend(steps.advance())                 # the next step: i0 wraps into i1, i1 into i2
    emit("  br i1 %more, label %step, label %store")
    emit("store:")
    if mm:  # block (p, c) = [r0·c0, r0·c1, r1·c0, r1·c1] of rows 2p, 2p+1 and columns 2c, 2c+1
        for p in range(mr // 2):
            for half, sel in ((0, "i32 0, i32 1, i32 4, i32 5"), (1, "i32 2, i32 3, i32 6, i32 7")):
                row = 2 * p + half
                for c in range(0, nr // 2, 2):
                    emit(f"  %st.{row}.{c} = shufflevector {at} %fin.{p}.{c}, {at} %fin.{p}.{c + 1}, "
                         f"<4 x i32> <{sel}>")
                    _store_row(emit, f"%st.{row}.{c}", at, row, 2 * c)
    else:
        for i, v in accs:
            _store_row(emit, f"%fin.{i}.{v}", at, i, v * w)
    emit("  ret void")
    emit("}")
    return "\n".join(out) + "\n"


def _store_row(emit, value: str, vt: str, row: int, col: int) -> None:  # noqa: ANN001
    emit(f"  %so.{value[1:]} = mul i64 %ldc, {row}")
    emit(f"  %sc.{value[1:]} = add i64 %so.{value[1:]}, {col}")
    emit(f"  %sp.{value[1:]} = getelementptr i32, ptr %C, i64 %sc.{value[1:]}")
    emit(f"  store {vt} {value}, ptr %sp.{value[1:]}, align 4")


def _vector_group(emit, method: str, ab: str, mr: int, nr: int, w: int, q: str,  # noqa: ANN001
                  acc: dict[tuple[int, int], str], tag: str, pair: bool) -> dict[tuple[int, int], str]:
    """One 4-byte group q: NR/W B vectors, MR broadcast A groups, MR·NR/W dot products."""
    if ab.endswith("s16"):
        return _word_group(emit, ab, mr, nr, w, q, acc, tag)
    bt, vt = f"<{4 * w} x i8>", f"<{w} x i32>"
    bs = _b_vectors(emit, tag, q, nr, w, bt, 4)
    wide = method.startswith("pmaddwd")
    if wide:  # B's byte pairs (0, 1) and (2, 3) of each lane, sign-extended once per group for all rows
        bs = [(_pairs(emit, b, w, 0, True, f"{tag}bl{v}"), _pairs(emit, b, w, 2, True, f"{tag}bh{v}"))
              for v, b in enumerate(bs)]
    new = {}
    for i in range(mr):
        emit(f"  %{tag}ap.{i} = getelementptr i8, ptr %ab.{i}, i64 %{tag}ao")
        emit(f"  %{tag}aw.{i} = load i32, ptr %{tag}ap.{i}, align 1")
        emit(f"  %{tag}ai.{i} = insertelement {vt} poison, i32 %{tag}aw.{i}, i64 0")
        emit(f"  %{tag}as.{i} = shufflevector {vt} %{tag}ai.{i}, {vt} poison, <{w} x i32> zeroinitializer")
        emit(f"  %{tag}a.{i} = bitcast {vt} %{tag}as.{i} to {bt}")
        a = f"%{tag}a.{i}"
        if wide:
            signed = ab.startswith("s8")
            a = (_pairs(emit, a, w, 0, signed, f"{tag}al{i}"), _pairs(emit, a, w, 2, signed, f"{tag}ah{i}"))
        for v in range(nr // w):
            d = f"%{tag}c.{i}.{v}"
            if method.startswith("vnni"):
                emit(f"  {d} = call {vt} @llvm.x86.avx512.vpdpbusd.{32 * w}({vt} {acc[(i, v)]}, {bt} {a}, "
                     f"{bt} {bs[v]})")
            elif method == "sdot":
                emit(f"  {d} = call {vt} @llvm.aarch64.neon.sdot.v4i32.v16i8({vt} {acc[(i, v)]}, {bt} {a}, "
                     f"{bt} {bs[v]})")
            elif method.startswith("dpbf16"):  # the bytes as bf16 pairs; float32 lanes
                ft, pt = f"<{w} x float>", f"<{2 * w} x bfloat>"
                emit(f"  {d}.a = bitcast {bt} {a} to {pt}")
                emit(f"  {d}.b = bitcast {bt} {bs[v]} to {pt}")
                emit(f"  {d} = call {ft} @llvm.x86.avx512bf16.dpbf16ps.{32 * w}({ft} {acc[(i, v)]}, {pt} {d}.a, "
                     f"{pt} {d}.b)")
            else:
                ht = f"<{2 * w} x i16>"
                fn = {4: "sse2.pmadd.wd", 8: "avx2.pmadd.wd", 16: "avx512.pmaddw.d.512"}[w]
                emit(f"  {d}.l = call {vt} @llvm.x86.{fn}({ht} {a[0]}, {ht} {bs[v][0]})")
                emit(f"  {d}.h = call {vt} @llvm.x86.{fn}({ht} {a[1]}, {ht} {bs[v][1]})")
                emit(f"  {d}.s = add {vt} {d}.l, {d}.h")
                emit(f"  {d} = add {vt} {acc[(i, v)]}, {d}.s")
            new[(i, v)] = d
    return new


def _b_vectors(emit, tag: str, q: str, nr: int, w: int, vtype: str, a_bytes: int) -> list[str]:  # noqa: ANN001
    """Group q's NR/W B vectors (4·NR bytes a group, `vtype` each), and %{tag}ao: A's offset (`a_bytes` a group)."""
    emit(f"  %{tag}bo = mul i64 {q}, {4 * nr}")
    emit(f"  %{tag}ao = mul i64 {q}, {a_bytes}")
    bs = []
    for v in range(nr // w):
        emit(f"  %{tag}bo.{v} = add i64 %{tag}bo, {4 * w * v}")
        emit(f"  %{tag}bp.{v} = getelementptr i8, ptr %bs, i64 %{tag}bo.{v}")
        emit(f"  %{tag}b.{v} = load {vtype}, ptr %{tag}bp.{v}, align 1")
        bs.append(f"%{tag}b.{v}")
    return bs


PSHUFB = {8: "avx2.pshuf.b", 16: "avx512.pshuf.b.512"}  # by 32-bit lanes (the pmaddwd256 / 512 methods' ISAs)


def _word_group(emit, ab: str, mr: int, nr: int, w: int, q: str,  # noqa: ANN001
                acc: dict[tuple[int, int], str], tag: str) -> dict[tuple[int, int], str]:
    """One pair q against int16 weights: NR/W B vectors of W int16 pairs, MR broadcast A pairs (2 bytes widened),
    MR·NR/W vpmaddwd."""
    ht, vt = f"<{2 * w} x i16>", f"<{w} x i32>"
    fn = {4: "sse2.pmadd.wd", 8: "avx2.pmadd.wd", 16: "avx512.pmaddw.d.512"}[w]
    bs = _b_vectors(emit, tag, q, nr, w, ht, 2)
    new = {}
    for i in range(mr):
        emit(f"  %{tag}ap.{i} = getelementptr i8, ptr %ab.{i}, i64 %{tag}ao")
        if ab.startswith("u8") and w > 4:  # the word broadcast, one vpshufb (codegen/int8.py _zero_extend_pairs)
            bt = f"<{4 * w} x i8>"
            emit(f"  %{tag}aw.{i} = load i16, ptr %{tag}ap.{i}, align 1")
            emit(f"  %{tag}ai.{i} = insertelement {ht} poison, i16 %{tag}aw.{i}, i64 0")
            emit(f"  %{tag}as.{i} = shufflevector {ht} %{tag}ai.{i}, {ht} poison, <{2 * w} x i32> zeroinitializer")
            emit(f"  %{tag}ab.{i} = bitcast {ht} %{tag}as.{i} to {bt}")
            control = ", ".join(f"i8 {j // 2 % 2 if j % 2 == 0 else -128}" for j in range(4 * w))
            emit(f"  %{tag}ak.{i} = call {bt} asm \"\", \"=v,0\"({bt} <{control}>) nounwind memory(none)")
            emit(f"  %{tag}az.{i} = call {bt} @llvm.x86.{PSHUFB[w]}({bt} %{tag}ab.{i}, {bt} %{tag}ak.{i})")
            emit(f"  %{tag}a.{i} = bitcast {bt} %{tag}az.{i} to {ht}")
        else:
            emit(f"  %{tag}a2.{i} = load <2 x i8>, ptr %{tag}ap.{i}, align 1")
            emit(f"  %{tag}ax.{i} = {'sext' if ab.startswith('s8') else 'zext'} <2 x i8> %{tag}a2.{i} to <2 x i16>")
            emit(f"  %{tag}aw.{i} = bitcast <2 x i16> %{tag}ax.{i} to i32")
            emit(f"  %{tag}ai.{i} = insertelement {vt} poison, i32 %{tag}aw.{i}, i64 0")
            emit(f"  %{tag}as.{i} = shufflevector {vt} %{tag}ai.{i}, {vt} poison, <{w} x i32> zeroinitializer")
            emit(f"  %{tag}a.{i} = bitcast {vt} %{tag}as.{i} to {ht}")
        for v in range(nr // w):
            d = f"%{tag}c.{i}.{v}"
            emit(f"  {d}.p = call {vt} @llvm.x86.{fn}({ht} %{tag}a.{i}, {ht} {bs[v]})")
            emit(f"  {d} = add {vt} {acc[(i, v)]}, {d}.p")
            new[(i, v)] = d
    return new


def _pairs(emit, v: str, w: int, first: int, signed: bool, name: str) -> str:  # noqa: ANN001
    """Bytes (4i + first, 4i + first + 1) of each lane i of <4W x i8> v, widened to <2W x i16>."""
    idx = ", ".join(f"i32 {4 * (j // 2) + first + j % 2}" for j in range(2 * w))
    emit(f"  %{name}.b = shufflevector <{4 * w} x i8> {v}, <{4 * w} x i8> poison, <{2 * w} x i32> <{idx}>")
    emit(f"  %{name} = {'sext' if signed else 'zext'} <{2 * w} x i8> %{name}.b to <{2 * w} x i16>")
    return f"%{name}"


def _i8mm_groups(emit, method: str, ab: str, mr: int, nr: int, w: int, q: str,  # noqa: ANN001
                 acc: dict[tuple[int, int], str], tag: str, pair: bool) -> dict[tuple[int, int], str]:
    """Groups q and q + 1 (pair) or q alone, upper half zero: SMMLA / BFMMLA on (row pair p) × (column pair c)."""
    emit(f"  %{tag}bo = mul i64 {q}, {4 * nr}")
    emit(f"  %{tag}ao = mul i64 {q}, 4")
    rows = []   # per quad of columns: X (group q) and Y (group q + 1, or zero)
    for half in range(nr // 4):
        emit(f"  %{tag}xo.{half} = add i64 %{tag}bo, {16 * half}")
        emit(f"  %{tag}xp.{half} = getelementptr i8, ptr %bs, i64 %{tag}xo.{half}")
        emit(f"  %{tag}x.{half} = load <4 x i32>, ptr %{tag}xp.{half}, align 1")
        y = "zeroinitializer"
        if pair:
            emit(f"  %{tag}yo.{half} = add i64 %{tag}xo.{half}, {4 * nr}")
            emit(f"  %{tag}yp.{half} = getelementptr i8, ptr %bs, i64 %{tag}yo.{half}")
            emit(f"  %{tag}y.{half} = load <4 x i32>, ptr %{tag}yp.{half}, align 1")
            y = f"%{tag}y.{half}"
        rows.append((f"%{tag}x.{half}", y))
    bops = []
    for c in range(nr // 2):  # columns 2c, 2c+1: [c0 g0, c0 g1, c1 g0, c1 g1] (zip1 / zip2 of X and Y)
        x, y = rows[c // 2]
        sel = "i32 0, i32 4, i32 1, i32 5" if c % 2 == 0 else "i32 2, i32 6, i32 3, i32 7"
        emit(f"  %{tag}bz.{c} = shufflevector <4 x i32> {x}, <4 x i32> {y}, <4 x i32> <{sel}>")
        emit(f"  %{tag}bb.{c} = bitcast <4 x i32> %{tag}bz.{c} to <16 x i8>")
        bops.append(f"%{tag}bb.{c}")
    new = {}
    for p in range(mr // 2):
        halves = []
        for r in (2 * p, 2 * p + 1):
            emit(f"  %{tag}ap.{r} = getelementptr i8, ptr %ab.{r}, i64 %{tag}ao")
            if pair:
                emit(f"  %{tag}aw.{r} = load i64, ptr %{tag}ap.{r}, align 1")
            else:
                emit(f"  %{tag}a4.{r} = load i32, ptr %{tag}ap.{r}, align 1")
                emit(f"  %{tag}aw.{r} = zext i32 %{tag}a4.{r} to i64")
            halves.append(f"%{tag}aw.{r}")
        emit(f"  %{tag}av0.{p} = insertelement <2 x i64> poison, i64 {halves[0]}, i64 0")
        emit(f"  %{tag}av.{p} = insertelement <2 x i64> %{tag}av0.{p}, i64 {halves[1]}, i64 1")
        emit(f"  %{tag}a.{p} = bitcast <2 x i64> %{tag}av.{p} to <16 x i8>")
        for c in range(nr // 2):
            d = f"%{tag}m.{p}.{c}"
            if method == "bfmmla":  # 4 bf16 per row and column instead of 8 bytes
                emit(f"  {d}.a = bitcast <16 x i8> %{tag}a.{p} to <8 x bfloat>")
                emit(f"  {d}.b = bitcast <16 x i8> {bops[c]} to <8 x bfloat>")
                emit(f"  {d} = call <4 x float> @llvm.aarch64.neon.bfmmla(<4 x float> {acc[(p, c)]}, "
                     f"<8 x bfloat> {d}.a, <8 x bfloat> {d}.b)")
            else:
                emit(f"  {d} = call <4 x i32> @llvm.aarch64.neon.smmla.v4i32.v16i8(<4 x i32> {acc[(p, c)]}, "
                     f"<16 x i8> %{tag}a.{p}, <16 x i8> {bops[c]})")
            new[(p, c)] = d
    return new


def _decls(method: str, w: int) -> list[str]:
    vt, bt = f"<{w} x i32>", f"<{4 * w} x i8>"
    if method.startswith("vnni"):
        return [f"declare {vt} @llvm.x86.avx512.vpdpbusd.{32 * w}({vt}, {bt}, {bt})"]
    if method == "sdot":
        return [f"declare {vt} @llvm.aarch64.neon.sdot.v4i32.v16i8({vt}, {bt}, {bt})"]
    if method == "i8mm":
        return ["declare <4 x i32> @llvm.aarch64.neon.smmla.v4i32.v16i8(<4 x i32>, <16 x i8>, <16 x i8>)"]
    if method == "bfmmla":
        return ["declare <4 x float> @llvm.aarch64.neon.bfmmla(<4 x float>, <8 x bfloat>, <8 x bfloat>)"]
    if method.startswith("dpbf16"):
        ft, pt = f"<{w} x float>", f"<{2 * w} x bfloat>"
        return [f"declare {ft} @llvm.x86.avx512bf16.dpbf16ps.{32 * w}({ft}, {pt}, {pt})"]
    ht = f"<{2 * w} x i16>"
    fn = {4: "sse2.pmadd.wd", 8: "avx2.pmadd.wd", 16: "avx512.pmaddw.d.512"}[w]
    spread = [f"declare {bt} @llvm.x86.{PSHUFB[w]}({bt}, {bt})"] if w in PSHUFB else []
    return [f"declare {vt} @llvm.x86.{fn}({ht}, {ht})"] + spread
