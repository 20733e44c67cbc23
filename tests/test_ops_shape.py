"""Data movement and shape operators against onnxruntime: Reshape, Flatten, Squeeze, Unsqueeze, Transpose,
Concat, Split, Slice, Gather, Pad, Expand, Tile, Identity, Dropout, and the shape sub-graph operators
(Shape, Size, Constant, ConstantOfShape, Range) that fold away at import.

Everything here moves values without arithmetic: outputs must be exact (tolerance 0), except where a
pre/post arithmetic node is added (x·2, +1), which is exact in float32 too."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from conftest import (
    C,
    assert_close,
    check,
    check_op,
    check_op_chained,
    make_model,
    nest_stmts,
    rand,
    run_kiln,
    run_ort,
)
from kiln.compiler import check_options, lower
from kiln.kernel.ir import Loop
from kiln.target import resolve

EXACT = 0.0
I64 = np.iinfo(np.int64)


def i64(*v: int) -> C:
    return C(np.array(v, dtype=np.int64))


def both(op: str, args: list, attrs: dict | None = None, opset: int = 17, n_out: int = 1) -> None:
    """The op on a graph input (its output a graph output), and between two computed values."""
    check_op(op, args, rtol=EXACT, attrs=attrs, opset=opset, n_out=n_out)
    check_op_chained(op, args, rtol=EXACT, attrs=attrs, opset=opset, n_out=n_out)


# -- Reshape / Flatten / Squeeze / Unsqueeze -----------------------------------------------------------------
RESHAPE = [((2, 3, 4, 5), [0, -1]), ((2, 3, 4, 5), [-1, 5]), ((2, 3, 4, 5), [2, 0, 0, 5]),
           ((2, 3, 4, 5), [0, 0, -1]), ((2, 3, 4, 5), [120]), ((2, 3, 4, 5), [1, -1, 1, 5]), ((7,), [7, 1]),
           ((3, 17), [17, 3]),
           ((2, 1, 3, 4, 5), [-1]), ((17,), [1, 1, 17, 1, 1])]


@pytest.mark.parametrize("shape,target", RESHAPE, ids=str)
def test_reshape(shape: tuple[int, ...], target: list[int]) -> None:
    both("Reshape", [rand(*shape), i64(*target)])


@pytest.mark.parametrize("allowzero", [0, 1])
def test_reshape_opset14(allowzero: int) -> None:
    both("Reshape", [rand(2, 3, 4, 5), i64(2, 12, -1)], attrs={"allowzero": allowzero}, opset=14)


def test_reshape_allowzero_empty_tensor() -> None:
    """allowzero=1 with a genuine 0 extent: reshape an empty (0×3) tensor to (3, 0)."""
    check_op("Reshape", [np.zeros((0, 3), np.float32), i64(3, 0)], rtol=EXACT, attrs={"allowzero": 1},
             opset=14)


def test_reshape_constant_data() -> None:
    check_op("Reshape", [C(rand(2, 3, 4)), i64(4, -1)], rtol=EXACT)


@pytest.mark.parametrize("axis", [-4, -3, -2, -1, 0, 1, 2, 3, 4])
def test_flatten(axis: int) -> None:
    both("Flatten", [rand(2, 3, 4, 5)], attrs={"axis": axis})


@pytest.mark.parametrize("shape,axis", [((7,), 0), ((7,), 1), ((7,), -1), ((3, 17), -2), ((2, 1, 3, 1, 5), 3),
                                        ((2, 1, 3, 1, 5), -2)], ids=str)
def test_flatten_ranks(shape: tuple[int, ...], axis: int) -> None:
    both("Flatten", [rand(*shape)], attrs={"axis": axis}, opset=11)


SQUEEZE = [None, [0], [-1], [0, 2], [2, -1], [0, 2, 4]]


@pytest.mark.parametrize("axes", SQUEEZE, ids=str)
@pytest.mark.parametrize("opset", [11, 13])
def test_squeeze(axes: list[int] | None, opset: int) -> None:
    x = rand(1, 3, 1, 5, 1)
    if opset < 13:
        both("Squeeze", [x], attrs={} if axes is None else {"axes": axes}, opset=opset)
    else:
        both("Squeeze", [x] + ([] if axes is None else [i64(*axes)]), opset=opset)


UNSQUEEZE = [((3, 5), [0]), ((3, 5), [-1]), ((3, 5), [1, 3]), ((3, 5), [-1, 0]), ((17,), [0, 1, 3]),
             ((2, 3, 4, 5), [4]), ((2, 3, 4, 5), [-3]), ((), [0])]


@pytest.mark.parametrize("shape,axes", UNSQUEEZE, ids=str)
@pytest.mark.parametrize("opset", [11, 13])
def test_unsqueeze(shape: tuple[int, ...], axes: list[int], opset: int) -> None:
    x = rand(*shape)
    if opset < 13:
        both("Unsqueeze", [x], attrs={"axes": axes}, opset=opset)
    else:
        both("Unsqueeze", [x, i64(*axes)], opset=opset)


# -- Transpose -----------------------------------------------------------------------------------------------
TRANSPOSE = [((3, 17), None), ((3, 17), [1, 0]), ((1, 33), None), ((2, 3, 17), None), ((2, 3, 17), [0, 2, 1]),
             ((2, 3, 17), [1, 0, 2]), ((2, 3, 5, 7), [0, 2, 3, 1]), ((2, 3, 5, 7), [0, 3, 1, 2]),
             ((2, 3, 5, 7), None), ((2, 1, 3, 4, 5), [0, 4, 1, 3, 2]), ((2, 1, 3, 4, 5), None),
             ((3, 5, 7), [0, 1, 2]), ((65, 1025), None), ((4, 33, 257), [0, 2, 1])]


@pytest.mark.parametrize("shape,perm", TRANSPOSE, ids=str)
def test_transpose(shape: tuple[int, ...], perm: list[int] | None) -> None:
    both("Transpose", [rand(*shape)], attrs={} if perm is None else {"perm": perm})


def test_transpose_int64_and_bool() -> None:
    check_op("Transpose", [rand(3, 5, 7, lo=-9, hi=9, dtype="int64")], rtol=EXACT, attrs={"perm": [2, 0, 1]})
    check_op("Transpose", [rand(3, 5, 7, dtype="bool")], rtol=EXACT, attrs={"perm": [1, 2, 0]})


# -- Concat / Split ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("axis", [0, 1, 2, -1, -3])
def test_concat_3d(axis: int) -> None:
    base = [2, 3, 5]
    parts = []
    for i, n in enumerate((1, 4, 7)):
        s = list(base)
        s[axis] = n
        parts.append(rand(*s, seed=i))
    both("Concat", parts, attrs={"axis": axis})


@pytest.mark.parametrize("shapes,axis", [([(7,), (17,), (1,)], 0), ([(3, 5), (3, 17), (3, 1), (3, 2)], 1),
                                         ([(2, 3, 4, 5), (2, 3, 1, 5), (2, 3, 4, 5)], 2),
                                         ([(1, 2, 3, 4, 5), (2, 2, 3, 4, 5), (3, 2, 3, 4, 5)], 0),
                                         ([(1, 2, 3, 4, 5), (1, 2, 3, 4, 1), (1, 2, 3, 4, 17)], 4)], ids=str)
def test_concat_ranks(shapes: list[tuple[int, ...]], axis: int) -> None:
    both("Concat", [rand(*s, seed=i) for i, s in enumerate(shapes)], attrs={"axis": axis})


def test_concat_parts_run_contiguous(width: str) -> None:
    """Each part of a Concat along channels is one contiguous vector loop over the part (kernel/analysis.py:
    fuse_contiguous_axes through the part's explicit store), not one loop per row; outputs exact at every width."""
    feeds = {"x": rand(1, 4, 6, 5), "y": rand(1, 3, 6, 5, seed=1)}
    model = make_model([helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Neg", ["y"], ["b"]),
                        helper.make_node("Concat", ["a", "b"], ["z"], axis=1)], feeds, ["z"])
    prog = lower(model, resolve(width), 2, check_options({}), stop_after="kernels").program
    (cat,) = [k for k in prog.kernels if k.name.endswith("concat")]
    vec = sorted(int(s.extent.value) for s in nest_stmts(cat.body) if isinstance(s, Loop) and s.kind == "vector")
    assert vec == [3 * 30, 4 * 30], (vec, str(cat))
    got = run_kiln(model, feeds, target=width)
    if got is not None:  # the width runs here
        assert_close(got[0], run_ort(model, feeds)[0], EXACT)


def test_concat_with_constants_and_repeats() -> None:
    x = rand(3, 5)
    check_op("Concat", [x, C(rand(3, 2, seed=1)), x], rtol=EXACT, attrs={"axis": 1})
    check_op("Concat", [rand(2, 3, dtype="int64", lo=0, hi=9), C(rand(1, 3, dtype="int64", lo=0, hi=9))],
             rtol=EXACT, attrs={"axis": 0})


SPLIT = [  # (shape, axis, opset, sizes (input / attribute), outputs, num_outputs attribute)
    ((6, 5), 0, 13, None, 3, None), ((6, 5), 0, 11, None, 2, None), ((3, 17), 1, 13, [1, 7, 9], 3, None),
    ((3, 17), -1, 11, [10, 7], 2, None), ((2, 3, 4, 5), 2, 13, [1, 3], 2, None),
    ((2, 3, 4, 7), -1, 18, None, 3, 3), ((2, 10, 5), 1, 18, None, 4, 4), ((2, 8, 5), 1, 18, None, 2, 2),
    ((2, 1, 3, 4, 10), 4, 18, [2, 2, 6], 3, None),
]


@pytest.mark.parametrize("shape,axis,opset,sizes,n_out,num_outputs", SPLIT, ids=str)
def test_split(shape: tuple[int, ...], axis: int, opset: int, sizes: list[int] | None, n_out: int,
               num_outputs: int | None) -> None:
    attrs: dict = {"axis": axis}
    args: list = [rand(*shape)]
    if sizes is not None and opset >= 13:
        args.append(i64(*sizes))
    elif sizes is not None:
        attrs["split"] = sizes
    if num_outputs is not None:
        attrs["num_outputs"] = num_outputs
    both("Split", args, attrs=attrs, opset=opset, n_out=n_out)


# -- Slice ---------------------------------------------------------------------------------------------------
SLICE = [  # (starts, ends, axes, steps) on a (7, 9, 11) tensor
    ([1], [-1], [1], None), ([0, 2, 3], [7, 9, 11], None, None), ([-3], [I64.max], [2], None),
    ([-I64.max], [3], [0], None), ([2], [1000], [-1], [2]), ([-1], [-I64.max], [1], [-1]),
    ([5], [1], [0], [-2]), ([-1, 10], [-100, 0], [0, 2], [-3, -4]), ([0, 1], [7, 9], [0, 1], [2, 3]),
    ([1, 0], [-1, 100], [-1, -3], [5, 1]),
    ([3], [3], [1], None), ([8], [2], [2], [-1]), ([100], [-100], [2], [-1]), ([-100], [100], [2], [7]),
]


@pytest.mark.parametrize("starts,ends,axes,steps", SLICE, ids=str)
def test_slice(starts: list[int], ends: list[int], axes: list[int] | None, steps: list[int] | None) -> None:
    args: list = [rand(7, 9, 11), i64(*starts), i64(*ends)]
    if axes is not None or steps is not None:
        args.append(i64(*axes) if axes is not None else None)
    if steps is not None:
        args.append(i64(*steps))
    both("Slice", args, opset=13)


def test_slice_opset10_and_5d() -> None:
    check_op("Slice", [rand(7, 9, 11), i64(1, -2), i64(6, 1), i64(0, 2), i64(2, -3)], rtol=EXACT, opset=10)
    both("Slice", [rand(2, 3, 4, 5, 6), i64(1, 1, -1), i64(2, 5, 0), i64(1, 3, 4), i64(1, 2, -2)])


def test_slice_constant_folded() -> None:
    check_op("Slice", [C(rand(7, 9, 11)), i64(-1, 1), i64(-I64.max, 100), i64(0, 2), i64(-2, 3)], rtol=EXACT)


# -- Gather --------------------------------------------------------------------------------------------------
GATHER_IDX = [np.array(3), np.array(-2), np.array([0, 4, -1]), np.array([[1, -3, 2], [0, 0, -5]])]


@pytest.mark.parametrize("const", [True, False], ids=["const-idx", "runtime-idx"])
@pytest.mark.parametrize("idx", GATHER_IDX, ids=lambda i: f"idx{list(i.shape)}")
@pytest.mark.parametrize("axis", [0, 1, 2, -1])
def test_gather(axis: int, idx: np.ndarray, const: bool) -> None:
    idx = idx.astype(np.int64)
    both("Gather", [rand(5, 7, 9), C(idx) if const else idx], attrs={"axis": axis})


@pytest.mark.parametrize("idx_dtype", ["int64", "int32"])
def test_gather_embedding(idx_dtype: str) -> None:
    """The embedding pattern: a constant table, runtime token ids (int32 as well as int64)."""
    ids = rand(2, 17, lo=-50, hi=100, dtype=idx_dtype)
    check_op("Gather", [C(rand(100, 33)), ids], rtol=EXACT, attrs={"axis": 0})


def test_gather_1d_and_5d() -> None:
    both("Gather", [rand(17), np.array([16, 0, -17, 3], np.int64)], attrs={"axis": 0})
    both("Gather", [rand(2, 3, 4, 5, 6), np.array([[1], [-1]], np.int64)], attrs={"axis": 3})


# -- Pad -----------------------------------------------------------------------------------------------------
PAD = [  # (shape, pads, mode)
    ((7,), [2, 3], "constant"), ((3, 17), [1, 0, 2, 5], "constant"),
    ((2, 3, 5, 7), [0, 0, 1, 2, 0, 0, 3, 1], "constant"),
    ((3, 17), [1, 2, 2, 3], "reflect"), ((2, 3, 5, 7), [0, 1, 2, 3, 0, 1, 4, 6], "reflect"),
    ((7,), [3, 2], "edge"), ((2, 3, 5, 7), [0, 1, 2, 3, 1, 0, 4, 8], "edge"),
    ((3, 17), [-1, 2, 1, -3], "constant"), ((2, 3, 5, 7), [0, -1, 1, -2, 0, 0, -1, 3], "constant"),
    ((3, 17), [-1, 2, 1, -3], "edge"), ((3, 17), [1, -2, -1, 3], "reflect"),
    ((1, 2, 3, 4, 5), [0, 0, 1, 1, 2, 0, 0, 2, 1, 0], "constant"),
    ((1, 2, 3, 4, 5), [0, 0, 1, 1, 2, 0, 0, 2, 1, 3], "edge"),
]


@pytest.mark.parametrize("opset", [11, 18])
@pytest.mark.parametrize("shape,pads,mode", PAD, ids=str)
def test_pad(shape: tuple[int, ...], pads: list[int], mode: str, opset: int) -> None:
    args: list = [rand(*shape), i64(*pads)]
    if mode == "constant":
        args.append(C(np.array(1.5, np.float32)))
    both("Pad", args, attrs={"mode": mode}, opset=opset)


def test_pad_default_value_and_int64() -> None:
    check_op("Pad", [rand(3, 5), i64(1, 2, 0, 1)], rtol=EXACT, opset=13)
    check_op("Pad", [rand(3, 5, lo=-9, hi=9, dtype="int64"), i64(1, 2, 0, 1), C(np.array(-7, np.int64))],
             rtol=EXACT, opset=13)


def test_pad_opset10_attributes() -> None:
    check_op("Pad", [rand(3, 5)], rtol=EXACT, attrs={"pads": [1, 0, 2, 3], "value": -2.0}, opset=10)
    check_op("Pad", [rand(3, 5)], rtol=EXACT, attrs={"pads": [1, 2, 0, 1], "mode": "reflect"}, opset=10)


@pytest.mark.parametrize("axes,pads,mode", [([1], [2, 3], "constant"), ([-1, 0], [1, 2, 3, 0], "edge"),
                                            ([2], [1, 2], "reflect")], ids=str)
def test_pad_axes_input_opset18(axes: list[int], pads: list[int], mode: str) -> None:
    both("Pad", [rand(2, 5, 7), i64(*pads), None, i64(*axes)], attrs={"mode": mode}, opset=18)


def test_pad_wrap_opset19() -> None:
    both("Pad", [rand(3, 5, 7), i64(0, 2, 3, 0, 4, 1)], attrs={"mode": "wrap"}, opset=19)


# -- Expand / Tile -------------------------------------------------------------------------------------------
EXPAND = [((3, 1), [2, 3, 4]), ((1, 5), [3, 1]), ((17,), [2, 1, 17]), ((2, 1, 3, 1, 5), [2, 4, 3, 6, 5]),
          ((), [3, 7]), ((3, 1, 1), [3, 5, 7]), ((1,), [33])]


@pytest.mark.parametrize("shape,target", EXPAND, ids=str)
def test_expand(shape: tuple[int, ...], target: list[int]) -> None:
    both("Expand", [rand(*shape), i64(*target)])


TILE = [((3, 5), [2, 3]), ((7,), [3]), ((2, 1, 7), [1, 3, 2]), ((2, 3, 5, 7), [1, 1, 1, 1]),
        ((1, 2, 1, 3, 2), [2, 1, 3, 1, 2])]


@pytest.mark.parametrize("shape,repeats", TILE, ids=str)
def test_tile(shape: tuple[int, ...], repeats: list[int]) -> None:
    both("Tile", [rand(*shape), i64(*repeats)])


def test_expand_and_tile_int64() -> None:
    check_op("Expand", [rand(3, 1, dtype="int64", lo=0, hi=9), i64(2, 3, 4)], rtol=EXACT)
    check_op("Tile", [rand(3, 1, dtype="bool"), i64(2, 3)], rtol=EXACT)


# -- Identity / Dropout --------------------------------------------------------------------------------------
@pytest.mark.parametrize("shape", [(7,), (3, 17), (2, 1, 3, 4, 5)], ids=str)
def test_identity(shape: tuple[int, ...]) -> None:
    both("Identity", [rand(*shape)])
    check_op("Identity", [C(rand(*shape))], rtol=EXACT)


@pytest.mark.parametrize("opset,args,attrs", [(7, [], {"ratio": 0.3}), (10, [], {"ratio": 0.5}), (13, [], {}),
                                              (13, [C(np.array(0.25, np.float32))], {})], ids=str)
def test_dropout_is_identity_at_inference(opset: int, args: list, attrs: dict) -> None:
    both("Dropout", [rand(3, 17)] + args, attrs=attrs, opset=opset)


@pytest.mark.parametrize("opset,args", [(12, []), (13, [C(np.array(0.25, np.float32)), C(np.array(False))])],
                         ids=str)
def test_dropout_mask_is_all_true(opset: int, args: list) -> None:
    """(onnxruntime's Dropout-10 returns an all-false mask, the ONNX reference all-true: compared from 12
    on.)"""
    check_op("Dropout", [rand(3, 17)] + args, rtol=EXACT, opset=opset, n_out=2)


# -- shape sub-graphs: Shape, Size, Constant, ConstantOfShape, Range (all fold at import) --------------------
def _n(op: str, ins: list[str], outs: list[str], **attrs) -> object:  # noqa: ANN003
    return helper.make_node(op, ins, outs, name=f"{op}_{outs[0]}", **attrs)


def test_shape_gather_concat_reshape() -> None:
    """The exporter classic: reshape x to (batch, -1) through Shape → Gather → Unsqueeze → Concat."""
    x = rand(2, 3, 4, 5)
    nodes = [_n("Shape", ["x"], ["s"]),
             _n("Constant", [], ["zero"], value=helper.make_tensor("", 7, [], [0])),
             _n("Gather", ["s", "zero"], ["b"], axis=0), _n("Unsqueeze", ["b", "ax"], ["b1"]),
             _n("Constant", [], ["m1"], value_ints=[-1]), _n("Concat", ["b1", "m1"], ["shape"], axis=0),
             _n("Reshape", ["x", "shape"], ["y"])]
    check(make_model(nodes, {"x": x}, ["y"], {"ax": np.array([0], np.int64)}, 13), {"x": x}, rtol=EXACT)


def test_shape_start_end_and_size() -> None:
    """Shape with start/end (opset 15), Size, arithmetic on shapes, ConstantOfShape, Range, Cast."""
    x = rand(2, 3, 17)
    nodes = [_n("Shape", ["x"], ["tail"], start=-2), _n("Shape", ["x"], ["head"], end=1),
             _n("ReduceProd", ["tail"], ["rows"], keepdims=1),
             _n("Concat", ["head", "rows"], ["shape"], axis=0),
             _n("Reshape", ["x", "shape"], ["flat"]),                              # (2, 51)
             _n("Size", ["x"], ["size"]), _n("Constant", [], ["k"], value_int=102),
             _n("Div", ["size", "k"], ["one_i"]), _n("Cast", ["one_i"], ["one_f"], to=1),   # 102 / 102 = 1
             _n("Shape", ["flat"], ["fshape"]), _n("ConstantOfShape", ["fshape"], ["ones"],
                                                     value=helper.make_tensor("", 1, [1], [0.5])),
             _n("Gather", ["fshape", "last"], ["ncols"], axis=0),
             _n("Constant", [], ["start"], value=helper.make_tensor("", 7, [], [0])),
             _n("Constant", [], ["delta"], value=helper.make_tensor("", 7, [], [1])),
             _n("Range", ["start", "ncols", "delta"], ["ramp_i"]), _n("Cast", ["ramp_i"], ["ramp"], to=1),
             _n("Constant", [], ["scale"], value_float=0.25), _n("Mul", ["ramp", "scale"], ["ramp4"]),
             _n("Add", ["flat", "ones"], ["a"]), _n("Add", ["a", "ramp4"], ["b"]),
             _n("Mul", ["b", "one_f"], ["y"])]
    model = make_model(nodes, {"x": x}, ["y"], {"last": np.array(1, np.int64)}, 15)
    check(model, {"x": x}, rtol=EXACT)


def test_range_float_and_constant_of_shape_int() -> None:
    x = rand(3, 7)
    nodes = [_n("Constant", [], ["a"], value=helper.make_tensor("", 1, [], [0.5])),
             _n("Constant", [], ["b"], value=helper.make_tensor("", 1, [], [4.0])),
             _n("Constant", [], ["d"], value=helper.make_tensor("", 1, [], [0.5])),
             _n("Range", ["a", "b", "d"], ["r"]),                                   # 7 values
             _n("Constant", [], ["shp"], value_ints=[3, 7]),
             _n("ConstantOfShape", ["shp"], ["c"], value=helper.make_tensor("", 7, [1], [3])),
             _n("Cast", ["c"], ["cf"], to=1), _n("Add", ["x", "r"], ["t"]), _n("Mul", ["t", "cf"], ["y"]),
             _n("ConstantOfShape", ["shp"], ["zeros"]), _n("Add", ["x", "zeros"], ["y2"])]
    model = make_model(nodes, {"x": x}, ["y", "y2"], {}, 17)
    check(model, {"x": x}, rtol=1e-5)  # plain float32 arithmetic


def test_constant_outputs() -> None:
    """A model whose outputs are Constant nodes (no arithmetic on inputs at all)."""
    x = rand(3)
    nodes = [_n("Constant", [], ["c"], value=helper.make_tensor("", 1, [2, 2], [1, 2, 3, 4])),
             _n("Constant", [], ["f"], value_floats=[0.5, -1.5]), _n("Identity", ["x"], ["y"])]
    check(make_model(nodes, {"x": x}, ["c", "f", "y"], {}, 17), {"x": x}, rtol=EXACT)


@pytest.mark.parametrize("op", ["HannWindow", "HammingWindow", "BlackmanWindow"])
@pytest.mark.parametrize("periodic", [0, 1])
def test_window_ops(op: str, periodic: int) -> None:
    """Constant-size window generators (opset 17): evaluated at import, copied to the output."""
    check_op(op, [C(np.array(10, np.int64))], rtol=1e-5, attrs={"periodic": periodic})
