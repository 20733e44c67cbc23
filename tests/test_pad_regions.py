"""A padded copy of a blocked input whose channel block is narrower than a vector — the int8 stem's 4-byte pixels
(3 RGB channels and a zero) — is written region by region (kernel/lower.py: _pad_regions): the border filled slab
by slab, x copied into the interior by an affine copy whose row fuses into one contiguous run (kernel/analysis.py:
fuse_contiguous_axes, now with the copy's explicit store). Checked: every element of the buffer written exactly once
with x or the fill, for 1-D and 2-D pads, symmetric and not; the scheduled copy one vector loop per row at every x86
width; the stem's output against onnxruntime (at most one quantization step, as the other int8 tests)."""
from __future__ import annotations

import itertools

import numpy as np
import pytest
from test_ops_quant import assert_steps, qlinear_conv_model

from conftest import nest_stmts, rand, run_kiln, run_ort
from kiln.compiler import check_options, lower
from kiln.graph.ir import Value
from kiln.graph.types import TensorType
from kiln.kernel.ir import Bin, Const, Expr, Load, Loop, Var
from kiln.kernel.lower import _pad_regions
from kiln.target import resolve


def _value(e: Expr, env: dict[str, int]) -> int:
    """An affine index at one iteration point (what the store indices of the regions are made of)."""
    if isinstance(e, Const):
        return int(e.value)
    if isinstance(e, Var):
        return env[e.name]
    assert isinstance(e, Bin) and e.op in ("+", "-", "*"), e
    a, b = _value(e.a, env), _value(e.b, env)
    return a + b if e.op == "+" else a - b if e.op == "-" else a * b


@pytest.mark.parametrize("xshape,pads", [((1, 2, 5, 4, 4), (1, 1, 1, 1)), ((2, 1, 3, 6, 4), (2, 0, 1, 3)),
                                         ((1, 3, 7, 2), (2, 1)), ((1, 1, 4, 3, 2), (0, 2, 0, 0))])
def test_regions_write_every_element_once(xshape: tuple[int, ...], pads: tuple[int, ...]) -> None:
    nd = len(pads) // 2
    shape = xshape[:2] + tuple(xshape[2 + i] + pads[i] + pads[i + nd] for i in range(nd)) + xshape[2 + nd:]
    x = Value("x", TensorType("uint8", xshape))
    fill = Const(7, "uint8")
    written = np.full(shape, -1, np.int64)  # what each element got: -2 the fill, else x's flat index
    for c in _pad_regions(x, shape, pads, fill, "x.pad"):
        assert c.out == "x.pad" and c.store is not None and len(c.store) == len(shape)
        for point in itertools.product(*(range(n) for n in c.extents)):
            env = {v.name: i for v, i in zip(c.axes, point)}
            at = tuple(_value(e, env) for e in c.store)
            assert written[at] == -1, f"{at} written twice"
            if c.body == fill:
                written[at] = -2
            else:
                assert isinstance(c.body, Load) and c.body.buf == "x"
                written[at] = np.ravel_multi_index(tuple(_value(e, env) for e in c.body.index), xshape)
    want = np.full(shape, -2, np.int64)
    inner = tuple(slice(None) for _ in range(2)) + tuple(slice(pads[i], pads[i] + xshape[2 + i]) for i in range(nd))
    want[inner] = np.arange(int(np.prod(xshape))).reshape(xshape)
    np.testing.assert_array_equal(written, want)


def test_int8_stem_copy_runs_contiguous(width: str) -> None:
    x = rand(1, 3, 10, 10, lo=-128, hi=127, dtype="int8")  # RGB: channels padded to one 4-byte group a pixel
    model = qlinear_conv_model(x, 8, 1, "int8", True)
    prog = lower(model, resolve(width), 2, check_options({}), stop_after="kernels").program
    pads = [k for k in prog.kernels for b in k.scratch if b.shape == (1, 1, 12, 12, 4)]  # the padded copy
    assert len(pads) == 1, [str(k) for k in prog.kernels]
    k = pads[0]
    vec = [s for s in nest_stmts(k.body) if isinstance(s, Loop) and s.kind == "vector"]
    # the interior copy: one loop over a row's 10 pixels × 4 bytes (it was one 4-byte vector per pixel)
    assert any(s.extent == Const(40, "int64") for s in vec), [str(s.extent) for s in vec]
    got = run_kiln(model, {"x": x}, target=width)
    if got is not None:  # the width runs here
        assert_steps(got[0], run_ort(model, {"x": x})[0], 1.0)
