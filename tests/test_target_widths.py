"""The x86 widths Kiln targets generate code of that width and no wider, whatever the host has."""
from __future__ import annotations

import re

import pytest

from kiln.codegen.jit import emit_assembly, optimize
from kiln.target import X86_WIDTHS, host, host_with, missing_features

# y[i] = a[i] * b[i] + y[i] over 64 floats, vectorized by LLVM at the target's width
_IR = """
define void @f(ptr noalias %a, ptr noalias %b, ptr noalias %y) {
entry:
  br label %loop
loop:
  %i = phi i64 [0, %entry], [%n, %loop]
  %pa = getelementptr float, ptr %a, i64 %i
  %pb = getelementptr float, ptr %b, i64 %i
  %py = getelementptr float, ptr %y, i64 %i
  %x = load float, ptr %pa, align 4
  %w = load float, ptr %pb, align 4
  %v = load float, ptr %py, align 4
  %m = fmul fast float %x, %w
  %s = fadd fast float %m, %v
  store float %s, ptr %py, align 4
  %n = add i64 %i, 1
  %c = icmp eq i64 %n, 64
  br i1 %c, label %done, label %loop
done:
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
    assert re.search(r"\b(v?mulps|vfmadd\w*ps)\b", asm), "the loop was not vectorized at all"
    if bits in _FORBIDDEN:
        wider = _FORBIDDEN[bits].findall(asm)
        assert not wider, f"{width} code uses wider instructions: {sorted(set(map(str, wider)))[:5]}"
    if bits <= host().vector_bits:
        assert not missing_features(t), f"{width} on this host should run here"
