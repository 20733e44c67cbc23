"""The x86 widths Kiln targets generate code of that width and no wider, whatever the host has."""
from __future__ import annotations

import re

import pytest

from kiln.codegen.jit import emit_assembly, optimize
from kiln.target import X86_WIDTHS, host, host_with, missing_features

# y = a * b + y on 16-float vectors, as Kiln emits them (its schedules vectorize; LLVM's loop vectorizer is off,
# codegen/jit.py): the target's width decides how LLVM legalizes them — one zmm, two ymm or four xmm operations
_IR = """
define void @f(ptr noalias %a, ptr noalias %b, ptr noalias %y) {
entry:
  %x = load <16 x float>, ptr %a, align 4
  %w = load <16 x float>, ptr %b, align 4
  %v = load <16 x float>, ptr %y, align 4
  %m = fmul fast <16 x float> %x, %w
  %s = fadd fast <16 x float> %m, %v
  store <16 x float> %s, ptr %y, align 4
  ret void
}
"""
# what each width's code must not contain: VEX/EVEX encodings (v-prefixed packed ops) below AVX, zmm below AVX-512
_FORBIDDEN = {128: re.compile(r"\bv(mul|add|fmadd\w*|movu|mova)p[sd]\b|%[yz]mm"), 256: re.compile(r"%zmm")}


@pytest.mark.parametrize("width", list(X86_WIDTHS))
def test_width_code_is_no_wider(width: str) -> None:
    bits = X86_WIDTHS[width]
    if host().arch != "x86_64":
        pytest.skip("the x86 widths are limits of an x86 host")
    t = host_with(bits)
    asm = emit_assembly(optimize(_IR, t), t)
    assert re.search(r"\b(v?mulps|vfmadd\w*ps)\b", asm), "no packed multiply in the code"
    if bits in _FORBIDDEN:
        wider = _FORBIDDEN[bits].findall(asm)
        assert not wider, f"{width} code uses wider instructions: {sorted(set(map(str, wider)))[:5]}"
    if bits <= host().vector_bits:
        assert not missing_features(t), f"{width} on this host should run here"


@pytest.mark.parametrize("bits", [256, 128])
def test_host_taken_as_narrower(bits: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """KILN_HOST_VECTOR_BITS (kiln/target.py `host`): the host as an AVX2 (or SSE-only: a VM's baseline x86-64 CPU)
    machine would be — its wider features off, every wider width an emit-only target (x86-64-v3 / v4) whose code is
    that wide and does not run here; each width's code no wider than itself."""
    if host().arch != "x86_64" or host().vector_bits < bits:
        pytest.skip("an x86 host at least this wide")
    from kiln.target import HOST_BITS_ENV, resolve, runs_here

    monkeypatch.setenv(HOST_BITS_ENV, str(bits))
    host.cache_clear()
    try:
        h = host()
        assert h.vector_bits == bits and not any(f.startswith("+avx512") or f.startswith("+amx")
                                                 for f in h.features.split(","))
        for width, wbits in X86_WIDTHS.items():
            t = resolve(width)
            assert runs_here(t) == (wbits <= bits), width
            if wbits > bits:
                assert t.cpu == {512: "x86-64-v4", 256: "x86-64-v3"}[wbits] and t.vector_bits == wbits
            asm = emit_assembly(optimize(_IR, t), t)
            assert re.search(r"\b(v?mulps|vfmadd\w*ps)\b", asm)
            if wbits in _FORBIDDEN:
                assert not _FORBIDDEN[wbits].findall(asm), width
        for bad in ("384", "1024"):   # no x86 width; wider than any host is
            monkeypatch.setenv(HOST_BITS_ENV, bad)
            host.cache_clear()
            with pytest.raises(Exception, match="takes 128, 256 or 512, no wider than it is"):
                host()
    finally:
        monkeypatch.delenv(HOST_BITS_ENV)
        host.cache_clear()
