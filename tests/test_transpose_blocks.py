"""Transposing copies (kiln/schedule/transpose.py): an elementwise compute whose innermost output axis reads its input
S ≥ R elements apart is emitted as R × L blocks transposed in registers (codegen/transpose.py), not a gather per
vector. Against onnxruntime (exact: data movement, a scale by 1.5 fused in) at every x86 width; the nest's form and,
where the host runs the width, no gather in the assembly."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper

from conftest import check, make_model, rand, width_runs
from kiln.codegen.jit import emit_assembly, optimize
from kiln.compiler import check_options, lower
from kiln.kernel.ir import Loop, walk_stmts
from kiln.target import resolve


def _model(shape: tuple[int, ...], perm: tuple[int, ...]) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    x = rand(*shape, seed=sum(shape))
    nodes = [helper.make_node("Mul", ["x", "c"], ["t"]), helper.make_node("Transpose", ["t"], ["y"], perm=perm)]
    return make_model(nodes, {"x": x}, ["y"], consts={"c": np.float32(1.5)}), {"x": x}


CASES = [((1, 128, 12, 64), (0, 2, 3, 1)),   # attention's Kᵀ: [s, h, d] → [h, d, s]
         ((2, 40, 48), (0, 2, 1)),           # rows not a multiple of the lanes: a masked remainder
         ((3, 16, 20, 32), (3, 1, 0, 2)),    # the contiguous input axis first in the output
         ((64, 96), (1, 0))]                 # a plain matrix


@pytest.mark.parametrize("shape,perm", CASES)
def test_transposes_are_register_blocks(shape: tuple[int, ...], perm: tuple[int, ...], width: str) -> None:
    model, feeds = _model(shape, perm)
    check(model, feeds, 0.0, target=width)
    t = resolve(width)
    low = lower(model, t, 2, check_options({}), stop_after="llvm")
    (k,) = low.program.kernels
    unrolled = [s for s in walk_stmts(k.body) if isinstance(s, Loop) and s.kind == "unroll"]
    assert len(unrolled) == 1 and unrolled[0].extent.value == min(t.lanes(32), 16), k
    if width_runs(width):
        asm = emit_assembly(optimize(low.llvm_ir, t), t)
        assert "gather" not in asm, "a gather left in a transposing copy"


def test_transpose_blocks_switch_keeps_the_default_schedule(width: str) -> None:
    model, feeds = _model(*CASES[0])
    check(model, feeds, 0.0, target=width, transpose_blocks=False)
    (k,) = lower(model, resolve(width), 2, check_options({"transpose_blocks": False}),
                 stop_after="kernels").program.kernels
    assert not any(isinstance(s, Loop) and s.kind == "unroll" for s in walk_stmts(k.body))
