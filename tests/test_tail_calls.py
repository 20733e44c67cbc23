"""A dynamic GEMM's tail tiles that call the shared microkernels reading A in place (schedule/tail_calls.py,
kiln/ukernels/x86.py `rows_a`): every row count a run-time M can leave in its last row block, at every x86 width
(emit-only where the CPU cannot run it), against onnxruntime running the same dynamic model: max|kiln − ort| ≤
1e-4 · max|ort| (float32 accumulation order). A split build defines the shared kernels once, in its entry module."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper, numpy_helper

import kiln
from conftest import assert_close, run_ort, width_runs
from kiln.compiler import check_options, lower
from kiln.kernel.ir import Call, If, Loop, Stmt
from kiln.schedule.default import TAIL_CALL_ROWS
from kiln.target import resolve
from kiln.ukernels import isa_of

RTOL = 1e-4
K1, N1, N2 = 50, 72, 40  # K odd to the unroll (the kernels' remainder steps); N's last panel narrow at any width


def gemm_model() -> onnx.ModelProto:
    """x[batch, seq, K1] → MatMul + bias → Relu → MatMul + bias: two packed GEMMs over batch·seq run-time rows, one
    with a fused activation, the second reading the first's rows."""
    r = np.random.default_rng(3)
    inits = {"w1": (r.standard_normal((K1, N1)) * 0.2).astype(np.float32), "w2": (r.standard_normal((N1, N2)) * 0.2)
             .astype(np.float32), "b1": r.standard_normal(N1).astype(np.float32),
             "b2": r.standard_normal(N2).astype(np.float32)}
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["p"]), helper.make_node("Add", ["p", "b1"], ["pb"]),
             helper.make_node("Relu", ["pb"], ["h"]), helper.make_node("MatMul", ["h", "w2"], ["q"]),
             helper.make_node("Add", ["q", "b2"], ["y"])]
    g = helper.make_graph(nodes, "tails", [helper.make_tensor_value_info("x", T.FLOAT, ["batch", "seq", K1])],
                          [helper.make_tensor_value_info("y", T.FLOAT, ["batch", "seq", N2])],
                          [numpy_helper.from_array(v, k) for k, v in inits.items()])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def calls_in(body: list[Stmt]) -> list[str]:
    """The functions a loop nest calls."""
    return [fn for s in body for fn in ([s.fn] if isinstance(s, Call) else
                                        calls_in(s.body) + calls_in(s.orelse) if isinstance(s, If) else
                                        calls_in(s.body) if isinstance(s, Loop) else [])]


def test_called_tails_match_onnxruntime_at_every_row_count(width: str) -> None:
    model = gemm_model()
    bounds = {"batch": (1, 3), "seq": (1, 20)}
    prog = lower(model, resolve(width), 2, check_options({}), dynamic_bounds=bounds, stop_after="kernels").program
    called = sorted({fn for k in prog.kernels for fn in calls_in(k.body)})
    # the x86 families have the kernels: each GEMM's called tails (and nothing else) call them, defined as shared
    assert isa_of(resolve(width)) is not None
    assert called and all(fn.endswith("_ra_p" + fn.rsplit("_p", 1)[1]) for fn in called), called
    heights = sorted({int(fn.split("_f32_")[1].split("x")[0]) for fn in called}, reverse=True)
    assert 3 in heights and set(heights) <= set(TAIL_CALL_ROWS)  # (6 rows only below an 8-row full tile: AVX-512)
    assert {fn for k in prog.kernels for fn in k.shared_ir} == set(called)
    rows = ", ".join(f"{r}-row" for r in heights)
    assert sorted(how for k in prog.kernels for how in k.strategies.values()) == \
        [f"direct (tails {rows}: microkernel)"] * 2  # exe.meta["strategies"] says so, for both GEMMs
    if not width_runs(width):
        c = lower(model, resolve(width), 2, {}, dynamic_bounds=bounds, stop_after="object")
        assert c.obj[:4] == b"\x7fELF"
        return
    exe = kiln.compile(model, target=width, num_threads=2, cache=False, dynamic_bounds=bounds)
    assert exe.meta["compilations"] == 1
    # every remainder of seq over the full tile's rows (8 at AVX-512, 6 at AVX2 and SSE), at one and three entries
    for i, (b, s) in enumerate([(1, s) for s in range(1, 10)] + [(3, 2), (3, 3), (3, 5), (3, 11), (2, 20)]):
        x = np.random.default_rng(i).standard_normal((b, s, K1)).astype(np.float32)
        (want,), (got,) = run_ort(model, {"x": x}), exe.run({"x": x})
        assert_close(got, want, RTOL, f"batch {b}, seq {s}")


def test_tail_calls_knob_off_emits_every_tail() -> None:
    """The tuner's knob `tail_calls` (schedule/default.py): off, the kernel emits all its tails and calls nothing."""
    from kiln.schedule.default import schedule_kernel
    prog = lower(gemm_model(), resolve("avx2"), 2, check_options({}), dynamic_bounds={"batch": (1, 3), "seq": (1, 20)},
                 stop_after="kernels").program
    k = next(k for k in prog.kernels if calls_in(k.body))
    # one knob per nest: the token rows', and the batch rows' (schedule/default.py: _batch_rows)
    knobs = [name for name in k.decisions.values if name.endswith("tail_calls")]
    assert knobs and all(k.decisions.values[n] is True for n in knobs) and k.shared_ir
    schedule_kernel(k, resolve("avx2"), 2, check_options({}), {n: False for n in knobs})
    assert not calls_in(k.body) and not k.shared_ir


@pytest.mark.parametrize("seq", [2, 3])
def test_split_build_defines_the_shared_tails_once(seq: int) -> None:
    """gpt_decoder splits into compile units: the entry module defines each shared tail kernel (external), every
    unit only declares it — and the linked model runs the called tails right."""
    from kiln import zoo
    from kiln.codegen.module import build_module_text, build_unit_text
    from kiln.codegen.split import compile_jobs, split_kernels
    model = zoo.build("gpt_decoder")
    bounds = {"batch": (1, 2), "seq": (1, 16)}
    host = resolve("host")
    c = lower(model, host, 2, check_options({}), dynamic_bounds=bounds, stop_after="kernels")
    shared = {fn for k in c.program.kernels for fn in k.shared_ir}
    if not shared:
        pytest.skip(f"no microkernel family for {host.name}")
    units = split_kernels(c.program, max(2, compile_jobs()))
    assert len(units) > 1
    entry, _ = build_module_text(c.program, c.plan, host, split=True)
    for fn in shared:
        assert f"define void @{fn}(" in entry
        for u in units:
            text = build_unit_text(c.program, u, host)
            assert f"define internal void @{fn}(" not in text and f"define void @{fn}(" not in text
    exe = kiln.compile(model, num_threads=2, cache=False, dynamic_bounds=bounds)
    ids = np.random.default_rng(seq).integers(0, 1000, (2, seq)).astype(np.int64)
    (want,), (got,) = run_ort(model, {"input_ids": ids}), exe.run({"input_ids": ids})
    assert_close(got, want, RTOL, f"logits at 2 × {seq}")
