"""The `ukernel` strategy (kiln/schedule/ukernel.py around kiln/ukernels): outputs vs onnxruntime (≤ 1e-3
relative) on MatMul/Gemm/Conv shapes with edges, fused epilogues, the AVX2 family and every zoo model, and
proof (exe.meta["strategies"]) that the microkernel really built each anchor. The microkernels themselves are
checked against NumPy by calling them directly."""
from __future__ import annotations

import ctypes
import re

import numpy as np
import pytest
from onnx import helper

import kiln
from conftest import WIDTHS, C, check, emit_only, make_model, op_model, rand, run_kiln, run_ort, width_runs
from kiln import zoo
from kiln.codegen.jit import emit_assembly, optimize
from kiln.compiler import lower
from kiln.target import resolve
from kiln.ukernels import X86_FAMILIES, isa_of, ukernel_for

RTOL = 1e-3  # the bar for every strategy vs onnxruntime


def check_ukernel(model, feeds, target: str = "host", expect: str = "ukernel", **kw) -> list[np.ndarray] | None:  # noqa: ANN001
    """Kiln with strategy="ukernel" vs onnxruntime, and every anchor built the expected way (a width this CPU
    cannot execute: lowered, every anchor on its microkernel, and its object emitted)."""
    if target in WIDTHS and not width_runs(target):
        c = lower(model, resolve(target), 2, {}, strategy="ukernel", stop_after="kernels")
        built = {node: how for k in c.program.kernels for node, how in k.strategies.items()}
        assert built and all(s == expect for s in built.values()), built
        emit_only(model, target, strategy="ukernel", **kw)
        return None
    exe = kiln.compile(model, num_threads=2, cache=False, strategy="ukernel", target=target, **kw)
    built = exe.meta["strategies"]
    assert built and all(s == expect for s in built.values()), built
    got = exe.run(feeds)
    want = run_ort(model, feeds)
    for g, w in zip(got, want):
        assert g.shape == w.shape
        scale = max(float(np.abs(w).max()), 1e-6)
        err = float(np.abs(g.astype(np.float64) - w).max())
        assert err <= RTOL * scale, f"max error {err:.3g} > {RTOL} × {scale:.3g}"
    return got


# -- the microkernels, called directly ------------------------------------------------------------------------
@pytest.mark.parametrize("isa,mr,cols", [("avx512", 14, 32), ("avx512", 5, 32), ("avx512", 1, 32),
                                         ("avx512", 14, 16), ("avx2", 6, 16), ("avx2", 3, 16), ("avx2", 6, 8),
                                         ("sse", 4, 8), ("sse", 3, 8), ("sse", 4, 4)])
def test_microkernel_matches_numpy(isa: str, mr: int, cols: int) -> None:
    """C[:, :cols] (+)= Apanelᵀ·Bpanel; cols < NR is the narrow edge kernel, which must leave the rest alone."""
    import llvmlite.binding as llvm

    from kiln.codegen.jit import emit_object, optimize, target_machine
    target = resolve(isa)
    uk = ukernel_for(target, mr, cols)
    assert uk is not None and uk.isa == isa and uk.mr == mr and uk.nr == X86_FAMILIES[isa][2] and uk.cols == cols
    mod = optimize(uk.ir_text.replace("define internal", "define"), target)
    if not width_runs(isa):  # this CPU cannot execute it: the object must still be emitted
        assert emit_object(mod, target)[:4] == b"\x7fELF"
        return
    ee = llvm.create_mcjit_compiler(mod, target_machine(target))
    ee.finalize_object()
    fn = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64,
                          ctypes.c_int32)(ee.get_function_address(uk.name))
    nr, ldc = uk.nr, uk.nr + 5
    for K in (1, 3, 4, 5, 67):  # below, at and around the K unroll, and a long remainder
        a, b = rand(K, mr, seed=K), rand(K, nr, seed=K + 1)
        c = rand(mr, ldc, seed=K + 2)
        before = c.copy()
        fn(a.ctypes.data, b.ctypes.data, c.ctypes.data, ldc, K, 1)  # accumulate into C
        want = before.astype(np.float64)[:, :nr] + a.T.astype(np.float64) @ b
        np.testing.assert_allclose(c[:, :cols], want[:, :cols], rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(c[:, cols:], before[:, cols:])  # nothing written past the tile's columns
        fn(a.ctypes.data, b.ctypes.data, c.ctypes.data, ldc, K, 0)  # overwrite C
        np.testing.assert_allclose(c[:, :cols], (a.T.astype(np.float64) @ b)[:, :cols], rtol=1e-5, atol=1e-5)
    del ee


@pytest.mark.parametrize("isa,mr", [("avx512", 14), ("avx512", 3), ("avx2", 6), ("sse", 4), ("sse", 2)])
def test_pack_kernel_matches_numpy(isa: str, mr: int) -> None:
    """kiln_pack_*: MR rows of a row-major matrix → the [K][MR] panel, rows past `rows` repeating the last."""
    import llvmlite.binding as llvm

    from kiln.codegen.jit import emit_object, optimize, target_machine
    from kiln.ukernels import pack_kernel_for
    target = resolve(isa)
    pk = pack_kernel_for(target, mr)
    assert pk is not None and pk.mr == mr
    mod = optimize(pk.ir_text.replace("define internal", "define"), target)
    if not width_runs(isa):  # this CPU cannot execute it: the object must still be emitted
        assert emit_object(mod, target)[:4] == b"\x7fELF"
        return
    ee = llvm.create_mcjit_compiler(mod, target_machine(target))
    ee.finalize_object()
    fn = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
                          ctypes.c_void_p)(ee.get_function_address(pk.name))
    for K in (1, 7, 16, 41):  # only the scalar tail, whole transposed blocks, both
        for rows in sorted({1, max(1, mr - 1), mr}):
            src = rand(mr + 2, K + 5, seed=K + rows)
            dst = np.full(K * mr + 4, 7.0, np.float32)
            fn(src.ctypes.data, K + 5, rows, K, dst.ctypes.data)
            want = src[np.minimum(np.arange(mr), rows - 1), :K].T.ravel()
            np.testing.assert_array_equal(dst[:K * mr], want)
            assert (dst[K * mr:] == 7.0).all()  # nothing written past the panel
    del ee


def test_registry() -> None:
    sse = ukernel_for(resolve("sse"))  # 128-bit x86 without FMA: multiply + add kernels
    assert sse is not None and (sse.isa, sse.mr, sse.nr) == ("sse", 4, 8) and "llvm.fma" not in sse.ir_text
    host = resolve("host")
    if isa_of(host) is None:
        pytest.skip("no x86 microkernel family for this host")
    main = ukernel_for(host)
    assert main is not None and main.name == f"kiln_ukr_{main.isa}_f32_{main.mr}x{main.nr}"
    assert main.nr == 2 * host.lanes(32)  # the width of the weight panels pack_weights writes
    with pytest.raises(ValueError, match="rows"):
        ukernel_for(host, main.mr + 1)


# -- MatMul / Gemm -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("m,k,n", [(37, 70, 77), (1, 64, 40), (14, 32, 32), (129, 257, 100), (6, 19, 33)])
def test_matmul_edges(width: str, m: int, k: int, n: int) -> None:
    """M, N, K not multiples of MR, NR or the K unroll (and M = 1: the 1-row edge kernel)."""
    model, feeds = op_model("MatMul", [rand(m, k), C(rand(k, n, seed=1))])
    check_ukernel(model, feeds, width)


@pytest.mark.parametrize("k", [3001, 6003])
def test_matmul_k_blocked(width: str, k: int) -> None:
    """K long enough that the schedule splits it into blocks (the kernel's accumulate flag), with a remainder."""
    model, feeds = op_model("MatMul", [rand(17, k, lo=-1, hi=1), C(rand(k, 40, seed=1, lo=-1, hi=1))])
    check_ukernel(model, feeds, width)


def test_batched_matmul(width: str) -> None:
    model, feeds = op_model("MatMul", [rand(3, 20, 48), C(rand(48, 50, seed=2))])
    check_ukernel(model, feeds, width)


def test_gemm_bias_relu_epilogue(width: str) -> None:
    a, w, bias = rand(23, 40), rand(40, 67, seed=3), rand(67, seed=4)
    nodes = [helper.make_node("Gemm", ["a", "w", "bias"], ["g"], name="gemm"),
             helper.make_node("Relu", ["g"], ["y"], name="relu")]
    model = make_model(nodes, {"a": a}, ["y"], {"w": w, "bias": bias})
    got = check_ukernel(model, {"a": a}, width)
    assert got is None or ((got[0] == 0).any() and (got[0] > 0).any())  # the ReLU really clipped something


def test_matmul_without_constant_b_falls_back_to_direct() -> None:
    """No weight panels when B is an input: the anchor is emitted directly (and says so)."""
    model, feeds = op_model("MatMul", [rand(9, 40), rand(40, 50, seed=5)])
    check_ukernel(model, feeds, expect="direct")


def test_mixed_strategies_per_node() -> None:
    """strategies= overrides per node: one MatMul on the microkernel, the next emitted directly."""
    a, w1, w2 = rand(16, 48), rand(48, 64, seed=6), rand(64, 40, seed=7)
    nodes = [helper.make_node("MatMul", ["a", "w1"], ["h"], name="mm1"),
             helper.make_node("MatMul", ["h", "w2"], ["y"], name="mm2")]
    model = make_model(nodes, {"a": a}, ["y"], {"w1": w1, "w2": w2})
    exe = kiln.compile(model, num_threads=2, cache=False, strategy="ukernel", strategies={"mm2": "direct"})
    assert exe.meta["strategies"] == {"mm1": "ukernel", "mm2": "direct"}
    np.testing.assert_allclose(exe.run({"a": a})[0], run_ort(model, {"a": a})[0], rtol=1e-4, atol=1e-3)


# -- Conv ----------------------------------------------------------------------------------------------------
CONVS = {  # name: (input shape, weight shape, attributes)
    "3x3_pad1": ((1, 16, 10, 10), (40, 16, 3, 3), {"pads": [1, 1, 1, 1]}),
    "3x3_stride2": ((2, 8, 13, 11), (33, 8, 3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 2]}),
    "1x1": ((1, 24, 7, 9), (70, 24, 1, 1), {}),
    "7x7_stride2": ((1, 3, 30, 30), (32, 3, 7, 7), {"pads": [3, 3, 3, 3], "strides": [2, 2]}),
}


@pytest.mark.parametrize("name", list(CONVS))
def test_conv(width: str, name: str) -> None:
    xs, ws, attrs = CONVS[name]
    model, feeds = op_model("Conv", [rand(*xs), C(rand(*ws, seed=8) * 0.3), C(rand(ws[0], seed=9))], attrs)
    check_ukernel(model, feeds, width)


def test_conv_bn_relu_residual(width: str) -> None:
    """7×7 stride-2 conv + BatchNorm (folded) + ReLU, then a 3×3 conv whose epilogue adds the residual."""
    x = rand(1, 3, 23, 23)
    co = 20
    consts = {"w1": rand(co, 3, 7, 7, seed=10) * 0.2, "w2": rand(co, co, 3, 3, seed=11) * 0.1,
              "scale": rand(co, seed=12, lo=0.5, hi=1.5), "bias": rand(co, seed=13), "mean": rand(co, seed=14),
              "var": rand(co, seed=15, lo=0.5, hi=2.0)}
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], name="conv1", pads=[3, 3, 3, 3], strides=[2, 2]),
             helper.make_node("BatchNormalization", ["c1", "scale", "bias", "mean", "var"], ["bn"], name="bn"),
             helper.make_node("Relu", ["bn"], ["r"], name="relu"),
             helper.make_node("Conv", ["r", "w2"], ["c2"], name="conv2", pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["c2", "r"], ["y"], name="residual")]
    model = make_model(nodes, {"x": x}, ["y"], consts)
    check_ukernel(model, {"x": x}, width)


def test_ukernel_and_direct_agree() -> None:
    """Same graph, same fusion: the two strategies differ only in the inner computation."""
    model, feeds = op_model("Conv", [rand(1, 32, 9, 9), C(rand(64, 32, 3, 3, seed=16) * 0.2)], {"pads": [1, 1, 1, 1]})
    direct = run_kiln(model, feeds)[0]
    uk = run_kiln(model, feeds, strategy="ukernel")[0]
    np.testing.assert_allclose(uk, direct, rtol=1e-4, atol=1e-4 * float(np.abs(direct).max()))


# -- every zoo model -------------------------------------------------------------------------------------------
SLOW_ZOO = {"resnet50", "bert_base"}


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in SLOW_ZOO else n
                                  for n in zoo.names()])
def test_zoo_model(name: str) -> None:
    model, feeds = zoo.build(name), zoo.inputs(name)
    exe = kiln.compile(model, num_threads=2, cache=False, strategy="ukernel")
    assert "ukernel" in exe.meta["strategies"].values() or name == "conv_dw", exe.meta["strategies"]
    got, want = exe.run(feeds), run_ort(model, feeds)
    for g, w in zip(got, want):
        scale = max(float(np.abs(w).max()), 1e-6)
        assert float(np.abs(g.astype(np.float64) - w).max()) <= RTOL * scale


def test_check_helper_still_direct_by_default() -> None:
    """The default strategy is untouched by this module: direct everywhere."""
    model, feeds = op_model("MatMul", [rand(8, 32), C(rand(32, 40, seed=17))])
    exe = kiln.compile(model, num_threads=2, cache=False)
    assert set(exe.meta["strategies"].values()) == {"direct"}
    check(model, feeds, 1e-4)


# AT&T `vmaskmovps %ymm, %ymm, mem`: a masked store (Zen 3 retires about one per 12 cycles)
MASKED_STORE = re.compile(r"vmaskmovps\s+%[xy]mm\d+,\s*%[xy]mm\d+,\s*[^%\s]*\(")


@pytest.mark.parametrize("net", ["stem", "blocked"])
def test_packs_store_without_masks_or_scatters(net: str) -> None:
    """The compiler-generated A pack on AVX2 (6-row tiles in 8 lanes): a 7×7 stride-2 stem (rows flattened over
    18×18 pixels: tiles inside a row read affinely, tiles over a row end do not), and a blocked 3×3 conv
    (Winograd: its products' A runs along k, the 6 rows transposed in registers) followed by a blocked 1×1 conv
    (rows flattened too, but a channel block apart: transposed, not gathered). Every extent divides into whole
    tiles, so no mask is dynamic: the packs' and epilogues' 6-element runs must be plain stores — no vmaskmovps
    store, no scatter. Outputs vs onnxruntime."""
    if net == "stem":
        model, feeds = op_model("Conv", [rand(1, 3, 36, 36), C(rand(64, 3, 7, 7, seed=8) * 0.2)],
                                {"pads": [3, 3, 3, 3], "strides": [2, 2]})
    else:
        x = rand(1, 32, 12, 12)
        nodes = [helper.make_node("Conv", ["x", "w1"], ["c"], pads=[1, 1, 1, 1]),
                 helper.make_node("Relu", ["c"], ["r"]),
                 helper.make_node("Conv", ["r", "w2"], ["d"]), helper.make_node("Relu", ["d"], ["e"]),
                 helper.make_node("Conv", ["e", "w3"], ["y"], pads=[1, 1, 1, 1])]  # keeps the 1×1 output blocked
        model = make_model(nodes, {"x": x}, ["y"], {"w1": rand(32, 32, 3, 3, seed=2) * 0.1,
                                                    "w2": rand(48, 32, 1, 1, seed=3) * 0.2,
                                                    "w3": rand(32, 48, 3, 3, seed=4) * 0.1})
        feeds = {"x": x}
    target = resolve("avx2")
    low = lower(model, target, 2, {}, strategy="ukernel", stop_after="llvm")
    assert any(b.name.startswith("Ap") for k in low.program.kernels for b in k.scratch), "no compiler-built pack"
    assert "masked.scatter" not in low.llvm_ir
    if net == "blocked":  # rows a channel block apart are transposed in registers, never gathered
        ukernel_built = re.compile(r'[^(]*@"?k\d+_(packedconv|winogradproduct)')
        packs = [f for f in low.llvm_ir.split("\ndefine ")[1:] if ukernel_built.match(f)]
        assert len(packs) >= 3 and not any("masked.gather" in f for f in packs)
    asm = emit_assembly(optimize(low.llvm_ir, target), target)
    assert not MASKED_STORE.search(asm), MASKED_STORE.findall(asm)[:4]
    check_ukernel(model, feeds, "avx2")
