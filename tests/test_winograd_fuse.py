"""Winograd input transforms fused into their products, tile block by tile block (schedule/winograd_fuse.py), against
onnxruntime at 1e-4 relative to the largest |output| (as tests/test_winograd.py: the transforms reorder the sums).

The case is resnet18's first stage — a residual block's 3×3 conv at 56×56, 64 channels — where the product's thread
parts split its tile blocks, at every x86 width and at 2 and 4 threads, built with and without the fusion. Where it
applies, no input-transform kernel is left, and the fused kernel is one parallel loop over tile blocks holding the
transform's nest and the product's. Left alone: batch 2, and a weight-heavy stage whose product splits by position
(fused, every thread would stream all of the transformed weights)."""
from __future__ import annotations

import pytest
from test_winograd import TOL, _chain

from conftest import check, nest_stmts
from kiln.compiler import lower
from kiln.kernel.ir import Loop
from kiln.target import resolve


def _kernels(model, width: str, threads: int, **options):  # noqa: ANN001, ANN003, ANN202
    return lower(model, resolve(width), threads, options, stop_after="kernels").program.kernels


def _inputs(kernels) -> int:  # noqa: ANN001
    """Kernels that are an input transform alone."""
    return sum([c.hints.get("winograd") for c in k.computes] == ["input"] for k in kernels)


@pytest.mark.parametrize("threads", [2, 4])
def test_fused_product_matches(width: str, threads: int) -> None:
    model, feeds = _chain(1, 64, 64, 56, 56, [1, 1, 1, 1], residual=True)
    plain = _kernels(model, width, threads, fuse_winograd=False)
    fused = _kernels(model, width, threads)
    assert _inputs(plain) == 1
    if width != "avx2":  # AVX2's product takes 6 tiles a block: 784 = 130·6 + 4, a tail block, no thread parts
        assert _inputs(fused) == 0 and len(fused) == len(plain) - 1, [k.name for k in fused]
    for k in fused:
        if any(c.hints.get("op") == "WinogradProduct" for c in k.computes) and _inputs(fused) == 0:
            (top,) = k.body
            assert isinstance(top, Loop) and top.kind == "parallel"
            assert [type(s) for s in top.body] == [Loop, Loop]  # the block's transform, then its product
            assert not any(isinstance(s, Loop) and s.kind == "parallel" for s in nest_stmts(top.body))
    for fuse in (True, False):
        check(model, feeds, TOL, target=width, num_threads=threads, fuse_winograd=fuse)


def test_left_alone_where_it_does_not_fit() -> None:
    batch2, feeds2 = _chain(2, 64, 64, 56, 56, [1, 1, 1, 1], residual=True)
    assert _inputs(_kernels(batch2, "avx512", 2)) == 1
    check(batch2, feeds2, TOL)
    heavy, feeds = _chain(1, 256, 256, 7, 7, [1, 1, 1, 1], residual=True)  # 16 tiles, U 4 MiB: split by position
    assert _inputs(_kernels(heavy, "avx512", 2)) == 1
    check(heavy, feeds, TOL)


def test_without_thread_parts(width: str) -> None:
    """Switch `thread_parts` off: the product splits by position, so its transform is not fused (with the switch on
    it is, at AVX-512 and SSE: test_fused_product_matches) — the same outputs."""
    model, feeds = _chain(1, 64, 64, 56, 56, [1, 1, 1, 1], residual=True)
    assert _inputs(_kernels(model, width, 2, thread_parts=False)) == 1
    check(model, feeds, TOL, target=width, num_threads=2, thread_parts=False)
