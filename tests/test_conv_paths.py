"""The convolution code paths chosen for speed, each against onnxruntime: convs vectorized over output
channels (PackedConv, with the register tile's rows kept below spilling when kernel taps overlap), and
depthwise convs that read their padding through masked loads instead of a padded copy.

Tolerance: 1e-4 relative to the largest |output| (reductions summed in another order than onnxruntime's)."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from conftest import C, check, make_model, op_model, rand
from kiln.compiler import lower
from kiln.schedule.tile_shape import choose_tile
from kiln.target import Target, resolve

TOL = 1e-4


def _lowered(x: tuple[int, ...], w: tuple[int, ...], attrs: dict, target: Target | str | None = None):
    model, _ = op_model("Conv", [rand(*x, seed=1), C(rand(*w, seed=2)), C(rand(w[0], seed=3))], attrs)
    return lower(model, resolve(target or "host"), 2, {}, stop_after="kernels")


def _x86(bits: int, regs: int) -> Target:
    """The host's ISA described with another register file (tile choices only: nothing is run)."""
    base = resolve({512: "avx512", 256: "avx2", 128: "sse"}.get(bits, "host"))  # that width's features (FMA: ≥ 256)
    return replace(base, name=f"x86-{bits}", vector_bits=bits, vector_registers=regs)


# (x shape, w shape, attrs, goes by channels)
DENSE = {
    "3x3-s1-14px": ((1, 16, 14, 14), (64, 16, 3, 3), {"pads": [1, 1, 1, 1]}, True),
    "3x3-s2-odd": ((1, 24, 15, 17), (32, 24, 3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 2]}, True),
    "7x7-s2-stem": ((1, 3, 23, 23), (32, 3, 7, 7), {"pads": [3, 3, 3, 3], "strides": [2, 2]}, True),
    "1x1-small-plane-long-rows": ((1, 512, 7, 9), (64, 512, 1, 1), {}, True),
    "1x1-small-plane-short-rows": ((1, 64, 7, 9), (64, 64, 1, 1), {}, False),
    "1x1-s2": ((1, 64, 14, 14), (32, 64, 1, 1), {"strides": [2, 2]}, True),
    "1x1-28px-rows": ((1, 64, 28, 28), (32, 64, 1, 1), {}, False),
    "3x3-co-not-32": ((1, 16, 14, 14), (24, 16, 3, 3), {"pads": [1, 1, 1, 1]}, False),
}


@pytest.mark.parametrize("case", list(DENSE))
def test_dense_conv_paths(case: str, width: str) -> None:
    xs, ws, attrs, by_channels = DENSE[case]
    ops = [n.op for n in _lowered(xs, ws, attrs, width).graph.nodes]
    assert ("PackedConv" in ops) == by_channels or width == "sse", ops  # SSE's 4 lanes: other layouts pay
    model, feeds = op_model("Conv", [rand(*xs, seed=1), C(rand(*ws, seed=2)), C(rand(ws[0], seed=3))], attrs)
    check(model, feeds, TOL, target=width)


def _tile(c, target: Target):  # noqa: ANN001, ANN202
    k = next(k for k in c.program.kernels if "packedconv" in k.name)
    return choose_tile(k, k.computes[-1], target)


def test_overlapping_taps_shrink_the_tile() -> None:
    """A 3×3 conv by channels on 32 registers (AVX-512): rows i and i+1 share pixels across taps, so MR stays ≤ 7
    (14 spilled) and divides the 14-pixel rows; a 1×1 conv has no overlap and takes the full register budget."""
    t512 = _x86(512, 32)
    t = _tile(_lowered((1, 16, 14, 14), (64, 16, 3, 3), {"pads": [1, 1, 1, 1]}, t512), t512)
    assert t is not None and t.mr * (t.nr // t.lanes) <= 14 and 14 % t.mr == 0 and not t.channel_block
    t1 = _tile(_lowered((1, 512, 7, 9), (64, 512, 1, 1), {}, t512), t512)
    assert t1 is not None and t1.mr > 7


def test_few_registers_put_channels_innermost() -> None:
    """On 16 registers (AVX2) the taps cannot share broadcasts: the input channels go innermost and the tile is
    the classic 6×16, its rows running on over the ends of the 14-pixel output rows (no 6+6+2 edge tiles)."""
    t256 = _x86(256, 16)
    t = _tile(_lowered((1, 16, 14, 14), (64, 16, 3, 3), {"pads": [1, 1, 1, 1]}, t256), t256)
    assert t is not None and t.channel_block == 16 and t.flatten_rows and (t.mr, t.nr) == (6, 16)
    model, feeds = op_model("Conv", [rand(1, 48, 14, 14, seed=1), C(rand(64, 48, 3, 3, seed=2)), C(rand(64, seed=3))],
                            {"pads": [1, 1, 1, 1]})
    check(model, feeds, TOL)  # Ci = 48: channel blocks of 16


# (x shape, w shape, attrs): depthwise, stride 1, padded
DEPTHWISE = {
    "3x3-30px": ((1, 19, 30, 30), (19, 1, 3, 3), {"pads": [1, 1, 1, 1]}),
    "3x3-asym-pads": ((1, 8, 13, 37), (8, 1, 3, 3), {"pads": [0, 1, 2, 2]}),
    "5x5-dil2": ((2, 6, 17, 21), (6, 1, 5, 5), {"pads": [4, 4, 4, 4], "dilations": [2, 2]}),
    "3x3-multiplier2": ((1, 4, 9, 20), (8, 1, 3, 3), {"pads": [1, 1, 1, 1]}),
}


@pytest.mark.parametrize("case", list(DEPTHWISE))
def test_depthwise_reads_padding_through_masks(case: str, width: str) -> None:
    xs, ws, attrs = DEPTHWISE[case]
    attrs = {**attrs, "group": xs[1]}
    c = _lowered(xs, ws, attrs, width)
    assert not [b for b in c.program.buffers if b.endswith(".pad")], "a padded copy was made"
    x = rand(*xs, seed=1)
    x[..., 0] = 50.0  # large border values: a mask that lets padding through would show
    model, feeds = op_model("Conv", [x, C(rand(*ws, seed=2)), C(rand(ws[0], seed=3))], attrs)
    got = check(model, feeds, TOL, target=width)
    assert got is None or np.isfinite(got[0]).all()


def test_short_reduction_conv_with_residual_epilogue(width: str) -> None:
    """A 1×1 conv with Ci ≤ 128 (its tiles run column panels fastest), 40 output channels (a clamped edge
    row block), the residual add and ReLU fused into the tile's epilogue."""
    from onnx import helper

    x, r = rand(1, 64, 30, 30, seed=1), rand(1, 40, 30, 30, seed=4)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["y"]), helper.make_node("Add", ["y", "r"], ["s"]),
             helper.make_node("Relu", ["s"], ["out"])]
    model = make_model(nodes, {"x": x, "r": r}, ["out"], {"w": rand(40, 64, 1, 1, seed=2), "b": rand(40, seed=3)})
    c = lower(model, resolve(width), 2, {}, stop_after="kernels")
    (k,) = [k for k in c.program.kernels if "conv" in k.name]
    assert "tile" in str(k)
    check(model, {"x": x, "r": r}, TOL, target=width)


def test_1x1_tile_rows_over_row_ends_address_affinely(width: str) -> None:
    """A 1×1 conv on a blocked 7×7 plane whose register tile's rows run over the output rows' ends (pixel p of the
    tile read at [cb, p // 7 + r, p % 7 + q, c], r and q its size-1 window loops): the input's flat index folds back
    to p·stride, affine in the tile's unrolled row — one row pointer and constant offsets, not a division, a
    remainder and a pointer per row (resnet50's 7×7 1×1 convs: 63 stack references → 5)."""
    from onnx import helper

    from kiln.kernel.analysis import coef, flat_index
    from kiln.kernel.ir import Bin, Load, Loop, atoms, walk, walk_stmts

    x = rand(1, 64, 7, 7, seed=1)
    nodes = [helper.make_node("Conv", ["x", "w0", "b0"], ["t"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["t"], ["r"]),
             helper.make_node("Conv", ["r", "w1", "b1"], ["u"]),  # the 1×1 conv blocked in and out
             helper.make_node("Relu", ["u"], ["v"]),
             helper.make_node("Conv", ["v", "w2", "b2"], ["y"])]
    consts = {"w0": rand(96, 64, 3, 3, seed=2), "b0": rand(96, seed=3), "w1": rand(64, 96, 1, 1, seed=4),
              "b1": rand(64, seed=5), "w2": rand(32, 64, 1, 1, seed=6), "b2": rand(32, seed=7)}
    model = make_model(nodes, {"x": x}, ["y"], consts)
    split = []
    for k in lower(model, resolve(width), 2, {}, stop_after="kernels").program.kernels:
        unrolled = {s.var for s in walk_stmts(k.body) if isinstance(s, Loop) and s.kind == "unroll"}
        loads = {ld for s in walk_stmts(k.body) for e in _exprs(s) for ld in walk(e) if isinstance(ld, Load)}
        split += [(k, ld, v) for ld in loads for i in ld.index for d in walk(i) if isinstance(d, Bin) and d.op == "//"
                  for v in atoms(d) & unrolled]
    assert split or width == "sse", "no tile row splits pixels into rows: this test would check nothing"
    for k, ld, v in split:
        assert coef(flat_index(ld.index, k.buffer(ld.buf).shape), v) is not None, (k.name, ld)
    check(model, {"x": x}, TOL, target=width)


def _exprs(s):  # noqa: ANN001, ANN202 - a statement's expressions
    from kiln.kernel.ir import Assign, Store
    return [s.value, *s.index] if isinstance(s, Store) else [s.value] if isinstance(s, Assign) else []
