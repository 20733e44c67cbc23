"""AMX tile kernels: bf16 (`tdpbf16ps`, fp32 accumulators) and int8 (`tdpbssd` / `tdpbsud` / `tdpbusd` /
`tdpbuud`, int32 accumulators), one narrow interface for both — a batch-reduce GEMM block (oneDNN's brgemm) over
K steps whose A tiles may sit anywhere (the taps and channel blocks of a convolution, read in place):

    void kiln_amx_<dt>_<MT>x<NT>_m<MR>_k<KB>(
        ptr A0, ptr A1,   /* row 0 of the MT A tiles (A1 unused when MT = 1); each tile MR rows of KB elements   */
        i64 lda,          /* bytes between consecutive rows of an A tile                                         */
        ptr B,            /* B in VNNI order, one K step after another (below)                                   */
        ptr C, i64 ldc,   /* the (MT·MR) × (NT·16) C block, row stride ldc bytes: fp32 (bf16) or int32 (int8)    */
        i64 n2, i64 sa2, i64 n1, i64 sa1, i64 n0, i64 sa0,   /* the K steps: for i2 < n2, i1 < n1, i0 < n0       */
        i32 accumulate)   /* 0: C = Σ, 1: C += Σ                                                                 */

    for every step s = (i2·n1 + i1)·n0 + i0, with a = i2·sa2 + i1·sa1 + i0·sa0 (bytes):
        A tile t (t < MT):  rows r < MR at At + a + r·lda, each KB elements (KB·size = 64 bytes, or 32 for KB = 16 bf16)
        B step s:           at B + s·(KB/P)·(NT·64) bytes: KB/P rows of NT·16 columns × P  (P = 2 for bf16, 4 for int8)
                            — the VNNI order [K/P][N][P]: column j of row q holds k = q·P .. q·P + P−1
        C[r][j] (+)= Σ_k A[r][k] · B[k][j] over all steps' KB values of k

Packing contract (what the compiler hands these kernels, graph/passes/precision.py and kiln/schedule/amx.py):
  * A: bf16 or 8-bit rows of KB consecutive K elements; rows lda bytes apart (any stride, no alignment needed):
    a GEMM's row-major activation (lda = K·size, sa0 = 64), a blocked conv input's channel block at each pixel
    (lda = stride·cb·size; the steps walk channel blocks, kernel rows and taps: n2 = Ci/cb, n1 = kh, n0 = kw), or a
    packed im2col panel. Signedness of int8 A: `<dt>` = s8s8 / s8u8 / u8s8 / u8u8 names A's then B's.
  * B: the weight panel of NT·16 output columns, K steps contiguous, each step KB/P rows × NT·64 bytes; K padded
    with zeros to a multiple of KB (a zero pair/quad adds nothing).
  * C: MT·MR rows × NT·16 fp32 / int32, written whole (no edges: the caller's C block is a scratch tile; it applies
    the epilogue while copying the valid part out).
Tiles: MT·NT accumulators + MT A tiles + NT B tiles ≤ 8 (2×2: 4 + 2 + 2); palette 1, MR ≤ 16 rows, 64-byte rows.
LLVM's AMX passes write the tile configuration (ldtilecfg) in each call's prologue from the constant shapes, and
release the tiles (tilerelease) at its end, so a kernel needs nothing set up by its caller except the process's
permission (kiln/runtime/amx.py) — and it can run on any thread.

Cost model (Sapphire Rapids): one tdpbf16ps is a 16×16×32 block (8192 multiply-adds) every 16 cycles; one
tdpbssd 16×16×64 (16384). A 2×2 block per step: 4 tile loads (4 KiB) for 4 products (64 cycles).

Prefetch (`prefetch` bytes, the name's `_pf<bytes>` suffix): each step also prefetches (prefetcht0) the B lines that
many bytes ahead in B — the rest of this panel, then the next one (the caller's panels are contiguous). A weight
panel read once per inference streams from memory; the tile loads alone left it latency-bound: bert_base int8's
AMX GEMMs (M = 128 rows, 85 MB of weights) 26.0 → 20.4 ms at 8 KiB ahead, bf16 −12%; resnet50 and mobilenetv2,
whose panels serve hundreds of row blocks from cache, unchanged (2026-11-30, Emerald Rapids; 12 KiB and more
ahead were slower, 4–8 KiB alike). The distance is a knob of the AMX nest (schedule/amx.py `amx_prefetch`)."""
from __future__ import annotations

import functools
from dataclasses import dataclass

from kiln.ukernels import steps

# element type → (bytes per element, elements per VNNI group P, the tile product instruction, C element type)
DTYPES: dict[str, tuple[int, int, str, str]] = {
    "bf16": (2, 2, "tdpbf16ps", "float32"),
    "s8s8": (1, 4, "tdpbssd", "int32"),
    "s8u8": (1, 4, "tdpbsud", "int32"),
    "u8s8": (1, 4, "tdpbusd", "int32"),
    "u8u8": (1, 4, "tdpbuud", "int32"),
}
MAX_ROWS = 16
TILE_BYTES = 64   # the widest tile row (palette 1)
FEATURES = "+amx-tile,+amx-bf16,+amx-int8"


@dataclass(frozen=True)
class AMXKernel:
    name: str
    dtype: str     # bf16 | s8s8 | s8u8 | u8s8 | u8u8
    mt: int        # A tiles (row blocks) per call
    nt: int        # B tiles (16-column blocks) per call
    mr: int        # rows per A / C tile
    kb: int        # K elements per step (one A tile row)
    ir_text: str

    @property
    def rows(self) -> int:
        return self.mt * self.mr

    @property
    def cols(self) -> int:
        return self.nt * 16

    @property
    def pair(self) -> int:
        return DTYPES[self.dtype][1]

    @property
    def step_bytes(self) -> int:
        """Bytes of B per K step: KB/P rows of NT·64 bytes."""
        return self.kb // self.pair * self.nt * TILE_BYTES

    @property
    def c_dtype(self) -> str:
        return DTYPES[self.dtype][3]


def kernel_name(dtype: str, mt: int, nt: int, mr: int, kb: int, prefetch: int = 0) -> str:
    return f"kiln_amx_{dtype}_{mt}x{nt}_m{mr}_k{kb}" + (f"_pf{prefetch}" if prefetch else "")


def full_kb(dtype: str) -> int:
    """K elements in one full 64-byte A tile row: 32 bf16, 64 int8."""
    return TILE_BYTES // DTYPES[dtype][0]


PREFETCH_BYTES = 6144  # the default distance ahead in B (module docstring): 3 steps of a 2×2 block


@functools.cache
def amx_kernel(dtype: str, mt: int = 2, nt: int = 2, mr: int = 16, kb: int | None = None,
               prefetch: int = PREFETCH_BYTES) -> AMXKernel:
    """The tile kernel for `dtype` with MT×NT tiles of MR rows and KB K-elements per step (default: a full row),
    prefetching B `prefetch` bytes ahead (0: not)."""
    if dtype not in DTYPES:
        raise ValueError(f"AMX kernels take {', '.join(DTYPES)}, not {dtype!r}")
    size, pair, _, _ = DTYPES[dtype]
    kb = kb or full_kb(dtype)
    if not (1 <= mt <= 2 and 1 <= nt <= 2 and 1 <= mr <= MAX_ROWS):
        raise ValueError(f"AMX blocks are 1–2 × 1–2 tiles of 1–{MAX_ROWS} rows, not {mt}×{nt} of {mr}")
    if kb % pair or not 0 < kb * size <= TILE_BYTES:
        raise ValueError(f"{dtype} steps hold a multiple of {pair} K elements up to {TILE_BYTES // size}, not {kb}")
    if prefetch < 0 or prefetch % 64:
        raise ValueError(f"the prefetch distance is a whole number of 64-byte lines, not {prefetch}")
    name = kernel_name(dtype, mt, nt, mr, kb, prefetch)
    return AMXKernel(name, dtype, mt, nt, mr, kb, _ir(name, dtype, mt, nt, mr, kb, prefetch))


def config_bytes(dtype: str, mr: int, kb: int) -> bytes:
    """The 64-byte tile configuration (palette 1) of every kernel with MR-row tiles and KB-element steps:
    tmm0–3 C (MR rows × 64 bytes), tmm4–5 A (MR rows × KB·size bytes), tmm6–7 B (KB/P rows × 64 bytes)."""
    size, pair, _, _ = DTYPES[dtype]
    colsb = [TILE_BYTES] * 4 + [kb * size] * 2 + [TILE_BYTES] * 2
    rows = [mr] * 6 + [kb // pair] * 2
    cfg = bytearray(64)
    cfg[0] = 1
    for t in range(8):
        cfg[16 + 2 * t: 18 + 2 * t] = colsb[t].to_bytes(2, "little")
        cfg[48 + t] = rows[t]
    return bytes(cfg)


def config_name(dtype: str, mr: int, kb: int) -> str:
    return f"kiln_amx_config_{dtype}_m{mr}_k{kb}"


RELEASE = "kiln_amx_release"


def config_ir(dtype: str, mr: int, kb: int) -> str:
    """`void <config_name>()`: load the tile configuration of the (dtype, MR, KB) kernels on this thread."""
    name = config_name(dtype, mr, kb)
    data = "".join(f"\\{b:02x}" for b in config_bytes(dtype, mr, kb))
    return (f'@{name}.cfg = internal constant [64 x i8] c"{data}", align 64\n'
            f'define internal void @{name}() nounwind "target-features"="{FEATURES}" {{\n'
            f"  call void @llvm.x86.ldtilecfg(ptr @{name}.cfg)\n  ret void\n}}\n"
            "declare void @llvm.x86.ldtilecfg(ptr)\n")


def release_ir() -> str:
    """`void kiln_amx_release()`: the thread's tiles back to their initial state (tilerelease)."""
    return (f'define internal void @{RELEASE}() nounwind "target-features"="{FEATURES}" {{\n'
            "  call void @llvm.x86.tilerelease()\n  ret void\n}\n"
            "declare void @llvm.x86.tilerelease()\n")


def _ir(name: str, dtype: str, mt: int, nt: int, mr: int, kb: int, prefetch: int) -> str:
    """Tile registers by hand (the configuration is the caller's: config_ir): C tile (i, j) is tmm(2i + j), A tile
    i tmm(4 + i), B tile j tmm(6 + j). LLVM's own AMX passes are not used: they would load a configuration in every
    call (ldtilecfg measured ≈ 400 cycles here, a third of a 2×2 block's K = 256) and release it on return."""
    size, pair, op, _ = DTYPES[dtype]
    b_rows = kb // pair
    step = b_rows * nt * TILE_BYTES
    ldb = nt * TILE_BYTES
    cs = [(i, j) for i in range(mt) for j in range(nt)]
    L: list[str] = []
    e = L.append
    e(f"define internal void @{name}(ptr %A0, ptr %A1, i64 %lda, ptr %B, ptr %C, i64 %ldc, i64 %n2, i64 %sa2, "
      f'i64 %n1, i64 %sa1, i64 %n0, i64 %sa0, i32 %acc) nounwind "target-features"="{FEATURES}" {{')
    e("entry:")
    for i, j in cs:
        e(f"  %cro{i}{j} = mul i64 %ldc, {i * mr}")
        e(f"  %co{i}{j} = add i64 %cro{i}{j}, {j * TILE_BYTES}")
        e(f"  %cp{i}{j} = getelementptr i8, ptr %C, i64 %co{i}{j}")
    e("  %accum = icmp ne i32 %acc, 0")
    e("  br i1 %accum, label %load, label %zero")
    e("load:")
    for i, j in cs:
        e(f"  call void @llvm.x86.tileloadd64(i8 {2 * i + j}, ptr %cp{i}{j}, i64 %ldc)")
    e("  br label %start")
    e("zero:")
    for i, j in cs:
        e(f"  call void @llvm.x86.tilezero(i8 {2 * i + j})")
    e("  br label %start")
    e("start:")
    # the step loop: s counts steps, (i0, i1) the inner counters, offa the A offset (updated without divisions)
    L += steps.setup()
    e("  %any = icmp sgt i64 %total, 0")
    e("  br i1 %any, label %body, label %done")
    e("body:")
    e("  %s = phi i64 [ 0, %start ], [ %s1, %body ]")
    e("  %i0 = phi i64 [ 0, %start ], [ %i0n, %body ]")
    e("  %i1 = phi i64 [ 0, %start ], [ %i1n, %body ]")
    e("  %offa = phi i64 [ 0, %start ], [ %offan, %body ]")
    e("  %pbs = phi ptr [ %B, %start ], [ %pbn, %body ]")
    for i in range(mt):
        e(f"  %pa{i} = getelementptr i8, ptr %A{i}, i64 %offa")
        e(f"  call void @llvm.x86.tileloadd64(i8 {4 + i}, ptr %pa{i}, i64 %lda)")
    for j in range(nt):
        e(f"  %pb{j} = getelementptr i8, ptr %pbs, i64 {j * TILE_BYTES}")
        e(f"  call void @llvm.x86.tileloadd64(i8 {6 + j}, ptr %pb{j}, i64 {ldb})")
    for i, j in cs:
        e(f"  call void @llvm.x86.{op}(i8 {2 * i + j}, i8 {4 + i}, i8 {6 + j})")
    for line in range(step // 64 if prefetch else 0):  # past B's end too: a prefetch never faults
        e(f"  %pf{line} = getelementptr i8, ptr %pbs, i64 {prefetch + 64 * line}")
        e(f"  call void @llvm.prefetch.p0(ptr %pf{line}, i32 0, i32 3, i32 1)")
    e(f"  %pbn = getelementptr i8, ptr %pbs, i64 {step}")
    L += steps.advance()
    e("  br i1 %more, label %body, label %done")
    e("done:")
    for i, j in cs:
        e(f"  call void @llvm.x86.tilestored64(i8 {2 * i + j}, ptr %cp{i}{j}, i64 %ldc)")
    e("  ret void")
    e("}")
    e("declare void @llvm.x86.tileloadd64(i8, ptr, i64)")
    e("declare void @llvm.x86.tilezero(i8)")
    e("declare void @llvm.x86.tilestored64(i8, ptr, i64)")
    e(f"declare void @llvm.x86.{op}(i8, i8, i8)")
    if prefetch:
        e("declare void @llvm.prefetch.p0(ptr, i32, i32, i32)")
    return "\n".join(L) + "\n"
