"""No vector spills in the hot loops of the GEMM and conv tiles, for every x86 width and several CPUs' scheduling
models (emitted assembly only: it holds whether or not this host can run the width).

Why this is a test and not a benchmark: a tile that spills is slower, and — measured on a Zen 5 — its speed then
depends on where the JIT happens to place its code. resnet18's last-stage Winograd products (8×32 tiles, 16
channels unrolled) spilled 86 vector registers per loop trip under LLVM's znver5 scheduling model, not under
sapphirerapids'; 64 copies of that code over the same weights and arena ran 0.51–0.98 ms (a copy's level stable
from pass to pass), and without the spills 0.45–0.54 ms (noise). That was most of the process-to-process spread
of issue 19. The tiles' register budget is schedule/tile.py's; the shapes below are the ones whose budget is
tight (16 to 28 accumulators)."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from conftest import C, op_model, rand
from kiln.asm import function_asm, hot_loop, vector_spills
from kiln.codegen.jit import emit_assembly, optimize
from kiln.compiler import check_options, lower
from kiln.target import resolve

# other CPUs' scheduling models for the same features: the spill above showed under one model and not another
SCHED_MODELS = {"avx512": ("sapphirerapids", "skylake-avx512", "znver4"), "avx2": ("haswell", "znver3"), "sse": ()}

# name: (input NCHW, weight OIHW, conv attributes)
CONVS = {
    "winograd_7x7x512": ((1, 512, 7, 7), (512, 512, 3, 3), {"pads": [1] * 4}),
    "winograd_14x14x256": ((1, 256, 14, 14), (256, 256, 3, 3), {"pads": [1] * 4}),
    "conv3x3_56x56x64": ((1, 64, 56, 56), (64, 64, 3, 3), {"pads": [1] * 4}),
    "conv3x3_s2_28x28": ((1, 128, 28, 28), (256, 128, 3, 3), {"pads": [1] * 4, "strides": [2, 2]}),
    "pointwise_14x14x1024": ((1, 1024, 14, 14), (256, 1024, 1, 1), {}),
}


def _model(name: str):  # noqa: ANN202
    if name == "matmul_128x768x3072":
        return op_model("MatMul", [rand(1, 128, 768), C(rand(768, 3072, seed=1))])[0]
    x, w, attrs = CONVS[name]
    return op_model("Conv", [rand(*x), C((rand(*w, seed=1) / np.sqrt(np.prod(w[1:]))).astype(np.float32))], attrs)[0]


def _cpus(width: str) -> list[str]:
    return [resolve(width).cpu, *SCHED_MODELS[width]]


@pytest.mark.parametrize("name", [*CONVS, "matmul_128x768x3072"])
def test_no_vector_spills_in_hot_loops(width: str, name: str) -> None:
    model = _model(name)
    for cpu in _cpus(width):
        t = replace(resolve(width), cpu=cpu)
        c = lower(model, t, 2, check_options({}), stop_after="llvm")
        asm = emit_assembly(optimize(c.llvm_ir, t), t)
        checked = 0
        for fn in c.kernel_functions:
            loop = hot_loop(function_asm(asm, [fn]))
            if not any(i.mnemonic.startswith(("vfmadd", "mulps")) for i in loop):
                continue  # reorders, transforms: no tile (SSE has no FMA: its tiles multiply and add)
            checked += 1
            assert vector_spills(loop) == 0, (f"{name} on {width} (cpu {cpu}): {fn}'s hot loop spills "
                                              f"{vector_spills(loop)} vector registers per trip")
        assert checked, f"{name} on {width}: no kernel with an FMA loop found (the asm reading broke?)"
