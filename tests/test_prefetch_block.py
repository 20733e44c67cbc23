"""The knob `prefetch_block` (schedule/prefetch.py: prefetch_next_block; schedule/tile.py): a tile with two or more
reduction axes whose streamed operand outgrows L2 prefetches that operand's lines one step of the outermost reduction
axis ahead, in the loop around the unrolled innermost steps. Checked on Winograd products and a stride-2 conv at every
x86 width: the prefetches are there (on the weights, at the next channel block, above the unrolled steps) where the
weights outgrow L2, and not where they fit or the vectors are 128 bits (SSE); the switch `prefetch` and scalable
targets turn them off; outputs match onnxruntime at 1e-4 relative to the largest |output| (a prefetch changes no
value)."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import helper
from test_winograd import TOL, _chain

from conftest import check, make_model, nest_stmts, rand
from kiln.compiler import lower
from kiln.kernel.ir import Loop, Prefetch
from kiln.target import resolve


def _heavy_kernels(model, width: str, **options):  # noqa: ANN001, ANN003, ANN202 - (program, [kernel index])
    prog = lower(model, resolve(width), 2, options, stop_after="kernels").program
    heavy = [j for j, k in enumerate(prog.kernels)
             if any(c.hints.get("op") == "WinogradProduct" or c.hints.get("spatial") for c in k.computes)]
    return prog, heavy


def _prefetch_sites(loop_body) -> list[tuple[Prefetch, Loop]]:  # noqa: ANN001 - (prefetch, the loop it sits in)
    out = []
    for s in nest_stmts(loop_body):
        if isinstance(s, Loop):
            out += [(x, s) for x in s.body if isinstance(x, Prefetch)]
    return out


def _stride2_conv(ci: int, co: int, size: int):  # noqa: ANN202
    x = rand(1, ci, size, size, seed=5)
    w = (np.random.default_rng(6).standard_normal((co, ci, 3, 3)) * 0.05).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w"], ["y"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[2, 2]),
             helper.make_node("Relu", ["y"], ["z"])]
    return make_model(nodes, {"x": x}, ["z"], {"w": w}), {"x": x}


@pytest.mark.parametrize("case", ["winograd-256-14", "stride2-256-512"])
def test_blocks_prefetched_where_the_weights_outgrow_l2(width: str, case: str) -> None:
    if case.startswith("winograd"):
        model, feeds = _chain(1, 256, 256, 14, 14, [1, 1, 1, 1], residual=True)   # U: 16 · 256 · 256 · 4 = 4 MiB
    else:
        model, feeds = _stride2_conv(256, 512, 14)                               # 4.5 MiB of weights
    prog, heavy = _heavy_kernels(model, width)
    sites = [(j, pf, loop) for j in heavy for pf, loop in _prefetch_sites(prog.kernels[j].body)]
    if width == "sse":  # 128-bit vectors: off by default (SSE's tiles spilled with them)
        assert not sites and heavy
        check(model, feeds, TOL, target=width, num_threads=2)
        return
    assert sites, [prog.kernels[j].name for j in heavy]
    for j, pf, loop in sites:
        k = prog.kernels[j]
        weights = {b.name for b, name in zip(k.args, prog.bindings[j]) if name in prog.consts}
        assert pf.buf in weights, (k.name, pf.buf, weights)
        # at the next step of the outermost enclosing reduction loop, in the loop around the unrolled innermost one
        serial = [s.var for s in nest_stmts(k.body) if isinstance(s, Loop) and s.kind == "serial"
                  and any(p is pf for p in nest_stmts(s.body))]
        assert serial and f"({serial[0].name} + 1)" in [repr(i) for i in pf.index], (k.name, repr(pf.index))
        assert loop.kind == "serial" and any(isinstance(x, Loop) and x.kind == "unroll" for x in loop.body), k.name
    off, heavy_off = _heavy_kernels(model, width, prefetch=False)
    assert not [pf for j in heavy_off for pf, _ in _prefetch_sites(off.kernels[j].body)], "the switch prefetch=False"
    for on in (True, False):
        check(model, feeds, TOL, target=width, num_threads=2, prefetch=on)


def test_no_block_prefetch_where_the_weights_fit_l2(width: str) -> None:
    model, feeds = _chain(1, 64, 64, 28, 28, [1, 1, 1, 1], residual=True)        # U: 16 · 64 · 64 · 4 = 256 KiB
    prog, heavy = _heavy_kernels(model, width)
    assert heavy and not [pf for j in heavy for pf, _ in _prefetch_sites(prog.kernels[j].body)]
    check(model, feeds, TOL, target=width, num_threads=2)


def test_no_block_prefetch_on_scalable_targets() -> None:
    model, _ = _chain(1, 256, 256, 14, 14, [1, 1, 1, 1], residual=True)
    prog, heavy = _heavy_kernels(model, "aarch64-sve")
    assert heavy and not [pf for j in heavy for pf, _ in _prefetch_sites(prog.kernels[j].body)]


def test_knob_in_the_search_space() -> None:
    """`prefetch_block` is a knob of the tuner's space (kiln/tune/space.py), its default the heuristic's; the other
    value realizes a schedule whose product has (or lacks) the prefetches."""
    from kiln.tune.space import Space
    from kiln.tune.tuner import kernels_of
    from kiln.tune.workload import workloads_of

    t = resolve("avx512")
    for channels, size, default in ((256, 14, True), (64, 28, False)):
        model, _ = _chain(1, channels, channels, size, size, [1, 1, 1, 1], residual=True)
        (w,) = [w for w in workloads_of(kernels_of(model, t, 2, {}))
                if any(c.hints.get("op") == "WinogradProduct" for c in w.kernel.computes)]
        space = Space(w.kernel, t, 2, {})
        (knob,) = [k for k in space.knobs.values() if k.name.endswith(":prefetch_block")]
        assert knob.domain == (False, True) and knob.default is default
        for value in (False, True):
            cand = space.realize({**space.default, knob.name: value})
            assert cand is not None
            got = [s for s in nest_stmts(cand.kernel.body) if isinstance(s, Prefetch)]
            assert bool(got) is value, (channels, value)
