"""Weight packing of the integer anchors, done once at compile time (the "VNNI layout").

A dot-product instruction (x86 `vpdpbusd`, Arm SDOT, an AMX `tdpbusd` tile) consumes 4 consecutive values of the
reduction per 32-bit lane, so the weights are grouped in fours along K and the output channels run across lanes:

    MatMul   B[K, N] int8              →  Bp[⌈N/NR⌉, ⌈K/G⌉, NR, G]          (zero-padded in N and K)
    Conv     W[Co, Ci, kh, kw] int8    →  Wp[Co/NR, Ci/cb, kh, kw, cb/G, NR, G]  (blocked input, cb | Ci, 4 | cb)
    depthwise W[C, 1, kh, kw] int8     →  Wd[C/NR, kh, kw, NR]              (int8 taps, one vector per tap)
      or where `depthwise_quads` says →  Wq[C/NR, kh, NR, 4]               (a window row's taps per lane, zero-padded)

G = 4 int8 values where the target has a 4-byte dot product (`dot_group`); on x86 without VNNI G = 2 int16 values:
the weights widened once here, so that each pair is one `pmaddwd` lane against the activations' zero-extended pair,
where widening the weight bytes in the loop took ~10 shuffles and extends per vector and k-group.

One k-step of a register tile reads one 32-bit group of A (4 activations, broadcast) and NR·4 contiguous weight
bytes: NR/16 zmm registers on AVX-512. An AMX int8 tile kernel reads B in the same [K/4][N][4] order (16 rows of
64 bytes = 16 k-groups × 16 columns × 4), so a packed panel of NR = 16 is a ready `tileloadd` operand with stride
NR·4 bytes; A rows (the activations, [M][K] with K contiguous, u8) are its other operand as they are."""
from __future__ import annotations

import numpy as np

from kiln.target import Target, features_on, vnni_widths

INT8_K_GROUP = 4  # reduction values per 32-bit lane of a dot-product instruction


def dot_group(target: Target, options: dict[str, bool] | None = None) -> int:
    """The weights' group G on `target`: 4 bytes per int32 lane (vpdpbusd, SDOT, SMMLA, an AMX tile; RVV's plain
    loops), or — switch `word_weights` — 2 int16 values on x86 without VNNI (pmaddwd: kernel/dot.py Dot2). With
    the bytes widened in the loop instead, int8 was slower than float32 as an AVX2 host (Zen 4 at
    KILN_HOST_VECTOR_BITS=256: resnet50 0.72×, mobilenetv2 0.84×)."""
    word = (options or {}).get("word_weights", True) and target.arch == "x86_64" and not vnni_widths(target) \
        and "amx-int8" not in features_on(target.features)  # (AMX tiles read bytes; every AMX CPU has VNNI anyway)
    return 2 if word else INT8_K_GROUP


def _typed(group: int) -> type:
    return np.int8 if group == INT8_K_GROUP else np.int16


def pack_qmatmul(b: np.ndarray, nr: int, group: int = INT8_K_GROUP) -> np.ndarray:
    k, n = b.shape
    kg, panels = -(-k // group), -(-n // nr)
    padded = np.zeros((kg * group, panels * nr), _typed(group))
    padded[:k, :n] = b
    return np.ascontiguousarray(padded.reshape(kg, group, panels, nr).transpose(2, 0, 3, 1))


def unpack_qmatmul(bp: np.ndarray, k: int, n: int) -> np.ndarray:
    panels, kg, nr, g = bp.shape
    return bp.transpose(1, 3, 0, 2).reshape(kg * g, panels * nr)[:k, :n]


def pack_qconv_blocked(w: np.ndarray, nr: int, in_block: int, group: int = INT8_K_GROUP) -> np.ndarray:
    co, ci, kh, kw = w.shape
    g = group
    return np.ascontiguousarray(w.reshape(co // nr, nr, ci // in_block, in_block // g, g, kh, kw)
                                .transpose(0, 2, 5, 6, 3, 1, 4).astype(_typed(group)))


def pack_depthwise(w: np.ndarray, nr: int) -> np.ndarray:
    """Depthwise int8 taps [C/nr, kh, kw, nr]: per tap, one vector of the block's channels."""
    c, _, kh, kw = w.shape
    return np.ascontiguousarray(w.reshape(c // nr, nr, kh, kw).transpose(0, 2, 3, 1).astype(np.int8))


def depthwise_quads(target: Target, kw: int, dilation: int, cb: int, x_dtype: str) -> bool:
    """Whether an int8 depthwise conv (window width kw, channel block cb) takes its window rows as 4-byte groups,
    one vpdpbusd each (kernel/dot.py LaneDot4): x86 with VNNI, uint8 activations, kw ≤ 4 — and at 512 bits only with
    AVX512_VBMI, whose byte permute builds the groups from the row's bytes (codegen/int8.py), and where those bytes
    (from the first tap's channel block to the last's) fit the two 64-byte loads it permutes. Measured
    on mobilenetv2 int8 (Emerald Rapids, one interleaved run; depthwise kernels, ms): AVX-512 with VBMI
    0.74 → 0.61, AVX-VNNI at 256 bits 0.97 → 0.87, but AVX-512 without VBMI (a Cascade Lake's set) 0.61 → 0.80 —
    its word permutes cost more than the taps' widenings."""
    if kw > INT8_K_GROUP or x_dtype != "uint8" or not vnni_widths(target):
        return False
    row_bytes = (kw - 1) * dilation * cb + cb
    return target.vector_bits < 512 or ("avx512vbmi" in features_on(target.features) and row_bytes <= 128)


def pack_depthwise_quads(w: np.ndarray, nr: int) -> np.ndarray:
    """Depthwise int8 taps [C/nr, kh, nr, 4]: per window row, each channel's kw ≤ 4 taps as one 4-byte group (zero
    past kw), the operand of one `vpdpbusd` lane (kernel/dot.py LaneDot4)."""
    c, _, kh, kw = w.shape
    assert kw <= INT8_K_GROUP, kw
    quads = np.zeros((c, kh, INT8_K_GROUP), np.int8)
    quads[:, :, :kw] = w[:, 0]
    return np.ascontiguousarray(quads.reshape(c // nr, nr, kh, INT8_K_GROUP).transpose(0, 2, 1, 3))


def int8_channel_block(c: int, target: Target) -> int:
    """The channel block of an 8-bit blocked tensor: as for float (two int32 vectors, else one: the register tile's
    NR), else half or a quarter vector (MobileNetV2's 24 channels on AVX-512: blocks of 8), never below one 4-byte
    group; 0 when none divides c."""
    lanes = target.lanes(32)
    return next((cb for cb in (2 * lanes, lanes, lanes // 2, lanes // 4) if cb >= INT8_K_GROUP and c % cb == 0), 0)
