"""A GEMM over a batch of row blocks ([b, m, k] × [k, n], the weights shared) is tiled as one [b·m, k] GEMM
(kiln/kernel/analysis.py: fuse_row_axes): its register tiles span the batch, so each weight panel streams once,
not once per batch entry. bert_base built statically at batch 4 × 3 tokens ran four 3-row GEMMs per layer:
12.97 ms, against 7.34 ms with the rows merged (Zen 5, benchmarks/batched_rows.py, one interleaved run)."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper

import kiln
from conftest import check, make_model, nest_stmts, rand
from kiln.compiler import check_options, lower
from kiln.kernel.ir import Local, Loop, Stmt
from kiln.target import resolve


def _gemm(shape: tuple[int, ...], seed: int = 1) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    x = rand(*shape, 64, seed=seed)
    w, b = rand(64, 48, seed=seed + 1), rand(48, seed=seed + 2)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Add", ["m", "b"], ["a"]),
             helper.make_node("Relu", ["a"], ["y"])]
    return make_model(nodes, {"x": x}, ["y"], consts={"w": w, "b": b}), {"x": x}


def _structure(stmts: list[Stmt]) -> list[tuple]:
    """A loop nest's shape: each loop's kind and extent, each register tile's accumulator count, in order (a 1-row
    tile per batch entry also has 4 accumulators when it splits its reduction: the loops tell them apart)."""
    return [("local", s.count) if isinstance(s, Local) else ("loop", s.kind, str(s.extent))
            for s in nest_stmts(stmts) if isinstance(s, (Local, Loop))]


def _tiles(model: onnx.ModelProto, width: str) -> list[tuple]:
    c = lower(model, resolve(width), 2, check_options({}), stop_after="kernels")
    return [x for k in c.program.kernels for x in _structure(k.body)]


@pytest.mark.parametrize("shape", [(4, 3), (2, 5), (3, 2, 7), (4, 1)])
def test_batched_gemm_matches_and_tiles_like_one_gemm(shape: tuple[int, ...], width: str) -> None:
    model, feeds = _gemm(shape)
    check(model, feeds, 1e-5, target=width)
    flat, _ = _gemm((int(np.prod(shape)),))
    assert _tiles(model, width) == _tiles(flat, width), "the batch's rows are not in one register tile"


def test_rows_stay_apart_where_the_weights_depend_on_the_batch(width: str) -> None:
    """A batched product of two activations (attention's scores) reads a different B per batch entry: its batch
    axis is not merged, and it still matches onnxruntime."""
    a, b = rand(4, 3, 16, seed=5), rand(4, 16, 8, seed=6)
    model = make_model([helper.make_node("MatMul", ["a", "b"], ["y"])], {"a": a, "b": b}, ["y"])
    check(model, {"a": a, "b": b}, 1e-5, target=width)


def test_int8_batched_gemm_tiles_like_one_gemm(width: str) -> None:
    """The integer anchors are scheduled after the merge too (kiln.quantize of the same model)."""
    model, feeds = _gemm((4, 3))
    flat, flat_feeds = _gemm((12,))
    q = kiln.quantize(model, [feeds])
    qf = kiln.quantize(flat, [flat_feeds])
    assert _tiles(q, width) == _tiles(qf, width)


def _dynamic_gemm() -> onnx.ModelProto:
    from onnx import TensorProto, numpy_helper

    w, b = rand(64, 48, seed=11), rand(48, seed=12)
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Add", ["m", "b"], ["a"]),
                           helper.make_node("Relu", ["a"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 64])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", 48])],
                          [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_dynamic_batch_rows_regime(width: str) -> None:
    """Over run-time [batch, seq] rows a packed GEMM has a second nest whose tiles run over the batch entries, taken
    when batch > seq (schedule/default.py: _batch_rows): one compile, checked against onnxruntime on both sides of
    the switch (4×1, 6×1, 5×2: batch rows; 1×3, 3×17, 2×2: token rows)."""
    from conftest import assert_close, run_ort, width_runs
    from kiln.kernel.ir import If

    model, bounds = _dynamic_gemm(), {"batch": (1, 6), "seq": (1, 20)}
    c = lower(model, resolve(width), 2, check_options({}), dynamic_bounds=bounds, stop_after="object")
    assert c.objs and c.objs[0][:4] == b"\x7fELF"
    gemm = next(k for k in c.program.kernels if "matmul" in k.name)
    assert isinstance(gemm.body[0], If) and "batch" in str(gemm.body[0].cond) and "seq" in str(gemm.body[0].cond)
    if not width_runs(width):
        return
    exe = kiln.compile(model, target=width, num_threads=2, cache=False, dynamic_bounds=bounds)
    for batch, seq in [(4, 1), (6, 1), (5, 2), (1, 3), (3, 17), (2, 2)]:
        x = rand(batch, seq, 64, seed=batch * 31 + seq)
        assert_close(exe.run({"x": x})[0], run_ort(model, {"x": x})[0], 1e-5, f"{batch}×{seq}")
