"""Quantized ONNX (issue 18, integer side): per-op tests against onnxruntime, QDQ models written by onnxruntime's
quantizer, kiln.quantize, the integer code per x86 width, and error cases.

Tolerances: integer outputs (QuantizeLinear, QLinear*, *Integer) equal onnxruntime's within 1 quantization step
(`atol=1` on the integers: a float rounding at a .5 boundary may differ); float outputs of a QDQ model within
1 step of the last quantized tensor's scale; kiln.quantize against fp32 by an SNR floor (dB) stated per test."""
from __future__ import annotations

import os
import re
import subprocess
import tempfile

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

import kiln
from conftest import C, check, last_step, make_model, op_model, rand, run_kiln, run_ort, width_runs
from kiln.codegen.int8 import vnni_widths
from kiln.codegen.jit import emit_assembly, optimize
from kiln.compiler import check_options, executable_of, lower
from kiln.errors import KilnError
from kiln.graph.quant_pack import int8_channel_block
from kiln.quantization import snr_db
from kiln.target import features_on, resolve

T = onnx.TensorProto


def assert_steps(got: np.ndarray, want: np.ndarray, step: float, steps: float = 1.0, what: str = "output") -> None:
    assert got.shape == want.shape and got.dtype == want.dtype, (got.shape, got.dtype, want.shape, want.dtype)
    err = np.abs(got.astype(np.float64) - want.astype(np.float64)).max()
    assert err <= steps * step * (1 + 1e-6), f"{what}: max error {err} > {steps} step(s) of {step}"


def compare(model: onnx.ModelProto, feeds: dict[str, np.ndarray], step: float = 1.0, **kw) -> list | None:
    got = run_kiln(model, feeds, **kw)
    if got is None:
        return None
    for g, w in zip(got, run_ort(model, feeds)):
        assert_steps(g, w, step if w.dtype.kind == "f" else 1.0)
    return got


# -- per-op ----------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", ["int8", "uint8"])
@pytest.mark.parametrize("per_channel", [False, True])
def test_quantize_dequantize(dtype: str, per_channel: bool) -> None:
    x = rand(2, 5, 7, lo=-3, hi=3)
    s = np.array([0.02, 0.03, 0.05, 0.011, 0.04], np.float32) if per_channel else np.array(0.025, np.float32)
    zp = (np.array([3, -4, 0, 7, 1]) + (128 if dtype == "uint8" else 0)).astype(dtype) if per_channel \
        else np.array(128 if dtype == "uint8" else -5, dtype)
    axis = {"axis": 1} if per_channel else {}
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], **axis),
             helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"], **axis)]
    m = make_model(nodes, {"x": x}, ["q", "y"], {"s": s, "z": zp}, opset=13)
    compare(m, {"x": x}, step=float(s.max()))


def test_quantize_rounds_ties_to_even(width: str) -> None:
    """A clipped value quantized (the int8 epilogue's shape: the Quantize clamp dropped as satisfied,
    kernel/simplify.py) converts with one cvtps2dq on x86 — round half to even in the default rounding mode,
    codegen/exprs.py — where it rounded, then truncated: the ties ±0.5, 1.5, 2.5 … against onnxruntime."""
    x = (np.arange(-300, 300, dtype=np.float32) + 0.5).reshape(6, 100) * np.float32(0.25)
    for dt, lo, hi in (("uint8", 0.0, 63.75), ("int8", -32.0, 31.75)):
        nodes = [helper.make_node("Clip", ["x", "lo", "hi"], ["c"]),
                 helper.make_node("QuantizeLinear", ["c", "s", "z"], ["q"])]
        m = make_model(nodes, {"x": x}, ["q"], {"lo": np.array(lo, np.float32), "hi": np.array(hi, np.float32),
                                                "s": np.array(0.25, np.float32), "z": np.array(0, dt)}, opset=13)
        t = resolve(width)
        if t.arch == "x86_64":
            asm = emit_assembly(optimize(lower(m, t, 2, check_options({}), stop_after="llvm").llvm_ir, t), t)
            assert "cvtps2dq" in asm and "cvttps2dq" not in asm and "rndscale" not in asm and "roundps" not in asm
        got = run_kiln(m, {"x": x}, target=width)
        if got is not None:
            np.testing.assert_array_equal(got[0], run_ort(m, {"x": x})[0])


@pytest.mark.parametrize("opset", [10, 21])
def test_quantize_opsets(opset: int) -> None:
    x = rand(3, 8, lo=-2, hi=2)
    m = make_model([helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"])], {"x": x}, ["q"],
                   {"s": np.array(0.01, np.float32), "z": np.array(3, np.uint8)}, opset=opset)
    compare(m, {"x": x})


def qlinear_conv_model(x: np.ndarray, co: int, group: int, xdt: str, per_channel: bool, stride: int = 1):
    ci = x.shape[1]
    w = rand(co, ci // group, 3, 3, lo=-100, hi=100, dtype="int8", seed=3)
    ws = (np.linspace(0.002, 0.004, co) if per_channel else np.array([0.003])).astype(np.float32)
    wz = np.zeros(ws.shape, np.int8)
    xz = np.array(128 if xdt == "uint8" else 3, xdt)
    b = rand(co, lo=-500, hi=500, dtype="int32", seed=5)
    node = helper.make_node("QLinearConv", ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz", "b"], ["y"],
                            pads=[1, 1, 1, 1], strides=[stride, stride], group=group)
    consts = {"xs": np.array(0.05, np.float32), "xz": xz, "w": w, "ws": ws, "wz": wz,
              "ys": np.array(0.2, np.float32), "yz": np.array(-2 if xdt == "int8" else 120, xdt), "b": b}
    return make_model([node], {"x": x}, ["y"], consts, opset=13)


@pytest.mark.parametrize("xdt,per_channel", [("uint8", False), ("int8", True)])
def test_qlinear_conv(width: str, xdt: str, per_channel: bool) -> None:
    x = rand(1, 8, 9, 7, lo=0 if xdt == "uint8" else -128, hi=255 if xdt == "uint8" else 127, dtype=xdt)
    compare(qlinear_conv_model(x, 16, 1, xdt, per_channel), {"x": x}, target=width)


@pytest.mark.parametrize("y_scale", [0.2, 1e-30])
def test_requantize_saturates(width: str, y_scale: float) -> None:
    """A uint8 requantizing epilogue clamps to [0, 255] — on AVX-512 as max(x, 0), the convert, and a truncation
    with unsigned saturation (vpmovusdb; codegen/exprs.py `_saturating_u8`), so values past int32's range (an output
    scale of 1e-30: every product ≥ 2^31 steps) must still land on 255 and negatives on 0, as in onnxruntime."""
    x = rand(1, 8, 9, 7, lo=0, hi=255, dtype="uint8")
    m = qlinear_conv_model(x, 16, 1, "uint8", True)
    for init in m.graph.initializer:
        if init.name == "ys":
            init.CopyFrom(numpy_helper.from_array(np.array(y_scale, np.float32), "ys"))
    got = compare(m, {"x": x}, target=width)
    if got is not None and y_scale < 1e-20:
        assert set(np.unique(got[0])) == {0, 255}, np.unique(got[0])
    t = resolve(width)
    if "avx512f" in features_on(t.features):
        low = lower(m, t, 2, check_options({}), stop_after="llvm")
        asm = emit_assembly(optimize(low.llvm_ir, t), t)
        assert "vpmovusdb" in asm and "vminps" not in asm, "the saturating epilogue"


def test_qlinear_conv_depthwise_odd_channels(width: str) -> None:
    x = rand(1, 16, 7, 7, lo=-128, hi=127, dtype="int8")
    compare(qlinear_conv_model(x, 16, 16, "int8", True, stride=2), {"x": x}, target=width)
    x3 = rand(1, 3, 10, 10, lo=-128, hi=127, dtype="int8")  # an RGB stem: channels padded to a 4-byte group
    compare(qlinear_conv_model(x3, 8, 1, "int8", True), {"x": x3}, target=width)


def depthwise_chain_model(x: np.ndarray, c: int, kernel: tuple[int, int], stride: int, dilation: int
                          ) -> onnx.ModelProto:
    """QLinearConv 1×1 (x's channels → c, uint8) then a depthwise QLinearConv on c channels (padded): blocked in and
    out, so the depthwise one is a QPackedConv (graph/passes/block_layout.py)."""
    ci = x.shape[1]
    kh, kw = kernel
    w1 = rand(c, ci, 1, 1, lo=-100, hi=100, dtype="int8", seed=3)
    wd = rand(c, 1, kh, kw, lo=-127, hi=127, dtype="int8", seed=4)
    pads = [dilation * (kh // 2), dilation * (kw // 2)] * 2
    nodes = [helper.make_node("QLinearConv", ["x", "xs", "xz", "w1", "ws", "wz", "ys", "yz", "b1"], ["h"]),
             helper.make_node("QLinearConv", ["h", "ys", "yz", "wd", "wds", "wdz", "zs", "zz", "bd"], ["y"],
                              group=c, pads=pads, strides=[stride, stride], dilations=[dilation, dilation])]
    consts = {"xs": np.array(0.05, np.float32), "xz": np.array(128, np.uint8), "w1": w1,
              "ws": np.linspace(0.002, 0.004, c).astype(np.float32), "wz": np.zeros(c, np.int8),
              "ys": np.array(0.3, np.float32), "yz": np.array(120, np.uint8), "b1": rand(c, lo=-500, hi=500,
                                                                                         dtype="int32", seed=5),
              "wd": wd, "wds": np.linspace(0.003, 0.006, c).astype(np.float32), "wdz": np.zeros(c, np.int8),
              "zs": np.array(0.5, np.float32), "zz": np.array(100, np.uint8),
              "bd": rand(c, lo=-900, hi=900, dtype="int32", seed=6)}
    return make_model(nodes, {"x": x}, ["y"], consts, opset=13)


@pytest.mark.parametrize("c,kernel,stride,dilation", [(64, (3, 3), 1, 1), (48, (3, 3), 2, 1), (48, (3, 3), 1, 1),
                                                      (32, (3, 3), 1, 2), (40, (3, 2), 1, 1), (16, (5, 5), 1, 1)])
def test_depthwise_window_rows(width: str, c: int, kernel: tuple[int, int], stride: int, dilation: int) -> None:
    """An int8 depthwise conv on x86 with VNNI sums each window row's ≤ 4 taps per channel with one vpdpbusd
    (kernel/dot.py LaneDot4; weights [C/NR, kh, NR, 4]); with AVX512_VBMI a row's taps are one or two 64-byte loads
    and a byte permute, guarded by per-tap masks on edge tiles (codegen/int8.py). Channel blocks of 32, 16 and 8,
    strides, dilation, a 3×2 window, and a 5×5 one (wider than a group: the per-tap form) against onnxruntime,
    within 1 step; the form is checked in the kernels and, with VBMI, in the assembly."""
    if os.environ.get("KILN_BOUNDS_CHECK", "0") not in ("", "0") and (width != "avx512" or (c, stride) not in
                                                                      ((48, 2), (40, 1))):
        # the bounds-checked build emits LaneDot4.expand(), the same loads at every width: two shapes at one width
        # check the window-row indices (all 15 cases took 228 s of LLVM there, a tenth of CI's budget)
        pytest.skip("bounds-checked run: the window-row indices are checked on avx512 at 48 (stride 2) and 40 channels")
    x = rand(1, 8, 9, 30, lo=0, hi=255, dtype="uint8")  # rows of 30: interior tiles (plain loads) and edge ones
    m = depthwise_chain_model(x, c, kernel, stride, dilation)
    t = resolve(width)
    vbmi = "avx512vbmi" in features_on(t.features)
    cb = int8_channel_block(c, t)
    row_bytes = (kernel[1] - 1) * dilation * cb + cb  # the two 64-byte loads hold the window row's blocks
    rows = bool(vnni_widths(t)) and kernel[1] <= 4 and (t.vector_bits < 512 or (vbmi and row_bytes <= 128))
    low = lower(m, t, 2, check_options({}), stop_after="llvm")
    kernels = "\n".join(str(k) for k in low.program.kernels)
    assert ("lane_dot4" in kernels) == rows, kernels[:2000]
    if rows and vbmi and t.vector_bits >= 512:
        asm = emit_assembly(optimize(low.llvm_ir, t), t)
        assert "vpermt2b" in asm or "vpermb" in asm or "vpermi2b" in asm, "no byte permute: the window-row loads"
        assert "vpdpbusd" in asm
        # an edge tile's per-tap masks: built as a 64-bit integer and moved to a mask register, not through byte
        # vectors (vpmovm2b … vpmovb2m; mobilenetv2 int8's depthwise kernels were 15% slower so)
        assert "kmovq" in asm and "vpmovb2m" not in asm, "the guarded window-row masks"
        if cb == 16:  # a window row of 16-channel blocks in one load: one vpermb (not vpermd + vpshufb)
            assert re.search(r"\bvpermb\b", asm), "the 16-channel window rows' byte permute"
    compare(m, {"x": x}, target=width)


def test_depthwise_window_rows_need_vbmi_at_512_bits() -> None:
    """AVX-512 with VNNI but without VBMI (a Cascade Lake's set): the window-row groups would be built with word
    permutes, slower than the taps one by one (graph/quant_pack.py depthwise_quads) — the per-tap form, still
    matching onnxruntime where the host runs AVX-512."""
    from dataclasses import replace

    x = rand(1, 8, 9, 30, lo=0, hi=255, dtype="uint8")
    m = depthwise_chain_model(x, 64, (3, 3), 1, 1)
    t = resolve("avx512")
    t = replace(t, name="avx512-novbmi", features=",".join(
        "-" + f[1:] if f[1:] in ("avx512vbmi", "avx512vbmi2") else f for f in t.features.split(",")))
    kernels = "\n".join(str(k) for k in lower(m, t, 2, check_options({}), stop_after="kernels").program.kernels)
    assert "lane_dot4" not in kernels and "qpackedconv" in kernels
    if width_runs("avx512"):
        compare(m, {"x": x}, target=t)


@pytest.mark.parametrize("adt", ["uint8", "int8"])
def test_qlinear_matmul(width: str, adt: str) -> None:
    a = rand(5, 37, lo=0 if adt == "uint8" else -128, hi=255 if adt == "uint8" else 127, dtype=adt)
    b = rand(37, 21, lo=-128, hi=127, dtype="int8", seed=2)
    node = helper.make_node("QLinearMatMul", ["a", "as", "az", "b", "bs", "bz", "ys", "yz"], ["y"])
    consts = {"as": np.array(0.02, np.float32), "az": np.array(7, adt), "b": b, "bs": np.array(0.01, np.float32),
              "bz": np.array(0, np.int8), "ys": np.array(0.5, np.float32), "yz": np.array(1, adt)}
    compare(make_model([node], {"a": a}, ["y"], consts, opset=13), {"a": a}, target=width)


def test_matmul_integer_and_conv_integer(width: str) -> None:
    a = rand(3, 6, 20, lo=0, hi=255, dtype="uint8")
    b = rand(20, 11, lo=-128, hi=127, dtype="int8", seed=1)
    check(*op_model("MatMulInteger", [a, C(b), C(np.array(12, np.uint8)), C(np.array(0, np.int8))]),
          rtol=0, target=width)
    x = rand(1, 4, 6, 6, lo=0, hi=255, dtype="uint8")
    w = rand(8, 4, 3, 3, lo=-128, hi=127, dtype="int8", seed=4)
    check(*op_model("ConvInteger", [x, C(w), C(np.array(100, np.uint8)), C(np.array(0, np.int8))],
                    {"pads": [1, 1, 1, 1]}), rtol=0, target=width)


def test_dynamic_quantize_linear() -> None:
    x = rand(4, 33, lo=-3, hi=5)
    m = make_model([helper.make_node("DynamicQuantizeLinear", ["x"], ["y", "s", "z"])], {"x": x}, ["y", "s", "z"])
    compare(m, {"x": x}, step=1e-7)


def test_unsupported_zero_point_type_is_a_clear_error() -> None:
    x = rand(2, 3)
    m = make_model([helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"])], {"x": x}, ["q"],
                   {"s": np.array(0.1, np.float32), "z": np.array(0, np.uint16)}, opset=21)
    with pytest.raises(KilnError, match="QuantizeLinear.*uint16"):
        kiln.compile(m, cache=False)


# -- models from onnxruntime's quantizer -------------------------------------------------------------------------------
def convnet(c: int = 16, seed: int = 0) -> onnx.ModelProto:
    """Conv(3→c)+Relu, strided Conv+Relu, depthwise Conv + residual Add, MaxPool, Flatten, Gemm."""
    r = np.random.default_rng(seed)

    def w(*s: int) -> np.ndarray:
        return (r.standard_normal(s) / np.sqrt(np.prod(s[1:]))).astype(np.float32)

    inits = {"w1": w(c, 3, 3, 3), "b1": (r.standard_normal(c) * 0.1).astype(np.float32), "w2": w(c, c, 3, 3),
             "b2": (r.standard_normal(c) * 0.1).astype(np.float32), "w3": w(c, 1, 3, 3), "fc": w(10, c * 16),
             "fcb": (r.standard_normal(10) * 0.1).astype(np.float32)}
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1], strides=[2, 2]),
             helper.make_node("Relu", ["c2"], ["r2"]),
             helper.make_node("Conv", ["r2", "w3"], ["c3"], pads=[1, 1, 1, 1], group=c),
             helper.make_node("Add", ["c3", "r2"], ["a3"]),
             helper.make_node("MaxPool", ["a3"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Flatten", ["p"], ["f"]),
             helper.make_node("Gemm", ["f", "fc", "fcb"], ["y"], transB=1)]
    g = helper.make_graph(nodes, "convnet", [helper.make_tensor_value_info("x", T.FLOAT, [1, 3, 16, 16])],
                          [helper.make_tensor_value_info("y", T.FLOAT, [1, 10])],
                          [numpy_helper.from_array(v, k) for k, v in inits.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def transformer_block(d: int = 32, seq: int = 8, seed: int = 1) -> onnx.ModelProto:
    """Single-head attention + MLP with residuals and LayerNorm (MatMuls with constant weights)."""
    r = np.random.default_rng(seed)

    def w(*s: int) -> np.ndarray:
        return (r.standard_normal(s) / np.sqrt(s[0])).astype(np.float32)

    inits = {"wq": w(d, d), "wk": w(d, d), "wv": w(d, d), "wo": w(d, d), "w1": w(d, 4 * d), "w2": w(4 * d, d),
             "g": np.ones(d, np.float32), "beta": np.zeros(d, np.float32), "sc": np.array(d ** -0.5, np.float32)}
    nodes = [helper.make_node("MatMul", ["x", "wq"], ["q"]), helper.make_node("MatMul", ["x", "wk"], ["k"]),
             helper.make_node("MatMul", ["x", "wv"], ["v"]),
             helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 1]),
             helper.make_node("MatMul", ["q", "kt"], ["s0"]), helper.make_node("Mul", ["s0", "sc"], ["s1"]),
             helper.make_node("Softmax", ["s1"], ["p"], axis=-1), helper.make_node("MatMul", ["p", "v"], ["att"]),
             helper.make_node("MatMul", ["att", "wo"], ["o"]), helper.make_node("Add", ["o", "x"], ["h"]),
             helper.make_node("LayerNormalization", ["h", "g", "beta"], ["hn"], axis=-1),
             helper.make_node("MatMul", ["hn", "w1"], ["f1"]), helper.make_node("Relu", ["f1"], ["f2"]),
             helper.make_node("MatMul", ["f2", "w2"], ["f3"]), helper.make_node("Add", ["f3", "hn"], ["y"])]
    g = helper.make_graph(nodes, "block", [helper.make_tensor_value_info("x", T.FLOAT, [1, seq, d])],
                          [helper.make_tensor_value_info("y", T.FLOAT, [1, seq, d])],
                          [numpy_helper.from_array(v, k) for k, v in inits.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def samples(model: onnx.ModelProto, n: int, seed: int) -> list[dict[str, np.ndarray]]:
    r = np.random.default_rng(seed)
    i = model.graph.input[0]
    shape = [d.dim_value for d in i.type.tensor_type.shape.dim]
    return [{i.name: r.standard_normal(shape).astype(np.float32)} for _ in range(n)]


def ort_quantized(model: onnx.ModelProto, feeds: list[dict[str, np.ndarray]] | None) -> onnx.ModelProto:
    """onnxruntime's quantize_static (QDQ, S8S8, per-channel) or, with feeds None, quantize_dynamic."""
    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        QuantType,
        quantize_dynamic,
        quantize_static,
    )

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.it = iter(feeds or [])

        def get_next(self) -> dict | None:
            return next(self.it, None)

    with tempfile.TemporaryDirectory() as d:
        src, dst = os.path.join(d, "f.onnx"), os.path.join(d, "q.onnx")
        onnx.save(model, src)
        if feeds is None:
            quantize_dynamic(src, dst, weight_type=QuantType.QInt8)
        else:
            quantize_static(src, dst, Reader(), quant_format=QuantFormat.QDQ, activation_type=QuantType.QInt8,
                            weight_type=QuantType.QInt8, per_channel=True)
        return onnx.load(dst)


def test_ort_static_qdq_convnet(width: str) -> None:
    m = convnet()
    q = ort_quantized(m, samples(m, 8, 1))
    tgt = resolve(width)
    c = lower(q, tgt, 2, check_options({}))  # one build: its object disassembled, then run where the CPU can
    with tempfile.NamedTemporaryFile(suffix=".o") as f:
        f.write(c.obj)
        f.flush()
        asm = subprocess.run(["objdump", "-d", f.name], capture_output=True, text=True, check=True).stdout
    # what the width has on this host: AVX-512 VNNI (zmm), AVX-VNNI or AVX-512 VNNI + VL at 256 bits, or none (SSE;
    # an AVX2 width on a CPU without AVX-VNNI, e.g. Zen 4; an emit-only AVX-512 width without VNNI on an AVX2 host)
    forms = vnni_widths(tgt)
    if not forms:  # the honest fallback: exact int16 multiply-adds, and exe.meta says so
        assert "vpdpbusd" not in asm and "pmaddwd" in asm
    elif forms[0] == 16:
        assert "vpdpbusd" in asm and "zmm" in asm
    else:
        assert "vpdpbusd" in asm and "zmm" not in asm
    if not width_runs(width):
        return
    exe = executable_of(c, tgt, 2)
    want = "512-bit" if forms and forms[0] == 16 else "256-bit" if forms else "no VNNI"
    assert want in exe.meta["int8"], exe.meta["int8"]
    for f in samples(m, 3, 2):
        assert_steps(exe.run(f)[0], run_ort(q, f)[0], last_step(q))


@pytest.mark.parametrize("c,w", [(3, 37), (3, 224), (24, 37)])
def test_rgb_stem_quantize_reorders_rows(width: str, c: int, w: int) -> None:
    """The float input's QuantizeLinear fused into the ToBlocked reorder of its 3 channels padded to a 4-byte
    group (24 channels: blocks of 8 on AVX-512): rows read with vector loads, not gathers (the pad's clamps
    dropped over the row, schedule/ranges.py), the full vector width along the row with a masked tail at 37 pixels;
    outputs within one step of onnxruntime."""
    r = np.random.default_rng(0)
    inits = {"w1": (r.standard_normal((8, c, 3, 3)) / 5).astype(np.float32),
             "b1": (r.standard_normal(8) * 0.1).astype(np.float32)}
    g = helper.make_graph([helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
                           helper.make_node("Relu", ["c1"], ["y"])], "stem",
                          [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, c, 5, w])],
                          [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 8, 5, w])],
                          [numpy_helper.from_array(a, n) for n, a in inits.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    q = ort_quantized(m, samples(m, 4, 1))
    low = lower(q, resolve(width), 2, check_options({}), stop_after="llvm")
    assert any("toblocked" in k.name for k in low.program.kernels)
    assert "masked.gather" not in low.llvm_ir, "the reorder's row loads are gathers (clamped indices?)"
    t = resolve(width)
    vbmi = "avx512vbmi" in features_on(t.features)  # (an AVX2 host's emit-only avx512 is x86-64-v4: no VBMI)
    if t.vector_bits == 512 and (c == 3 or vbmi):  # 16 4-byte pixels interleaved by one permute of one register,
        # not a butterfly of byte and word unpacks (codegen/transpose.py interleave_in_one_register); 24 channels:
        # blocks of 8 bytes, two registers' worth — one byte permute of two sources per register with VBMI
        # (interleave_in_two_registers), else the butterfly
        from kiln.asm import function_asm

        name = next(k.name for k in low.program.kernels if "toblocked" in k.name)
        asm = function_asm(emit_assembly(optimize(low.llvm_ir, t), t), [name])
        if vbmi:  # a byte permute is one instruction with VBMI only
            assert "vpermt2b" in asm or "vpermb" in asm or "vpermi2b" in asm, asm[:3000]
        assert not re.search(r"vpunpck[lh]bw", asm), "the reorder's interleave as unpacks"
    if width_runs(width):
        exe = kiln.compile(q, target=width, num_threads=2, cache=False)
        for f in samples(m, 2, 3):
            assert_steps(exe.run(f)[0], run_ort(q, f)[0], last_step(q))


def test_ort_static_and_dynamic_transformer_block(width: str) -> None:
    m = transformer_block()
    q = ort_quantized(m, samples(m, 8, 1))
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    literal = ort.InferenceSession(q.SerializeToString(), so, providers=["CPUExecutionProvider"])
    for f in samples(m, 2, 2):
        got = run_kiln(q, f, target=width)
        if got is None:
            continue
        # the QDQ graph as written (onnxruntime without graph optimizations): within 1 step of the output
        assert_steps(got[0], literal.run(None, f)[0], last_step(q))
        # onnxruntime's fused int8 kernels (QLinearMatMul for q·kᵀ and p·v, its own rounding inside attention):
        # a 1-step difference inside attention reaches the output as at most 2 steps
        assert_steps(got[0], run_ort(q, f)[0], last_step(q), steps=2.0, what="vs onnxruntime's fused int8")
    d = ort_quantized(m, None)  # DynamicQuantizeLinear → MatMulInteger → scale: float outputs, rtol vs ort
    for f in samples(m, 2, 3):
        check(d, f, rtol=1e-4, target=width)


def test_quantize_qdq_switch_runs_fake_quant() -> None:
    m = convnet()
    q = ort_quantized(m, samples(m, 4, 1))
    f = samples(m, 1, 5)[0]
    a = kiln.compile(q, cache=False).run(f)[0]
    b = kiln.compile(q, cache=False, quantize_qdq=False).run(f)[0]
    assert_steps(a, b, last_step(q), what="integer anchors vs the float QDQ meaning")


# -- kiln.quantize ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("method,floor_db", [("minmax", 30.0), pytest.param("percentile", 30.0, marks=pytest.mark.slow),
                                             pytest.param("entropy", 5.0, marks=pytest.mark.slow)])
def test_kiln_quantize_convnet(method: str, floor_db: float) -> None:
    m = convnet()
    cal, test = samples(m, 16, 1), samples(m, 6, 2)
    q = kiln.quantize(m, cal, method=method)
    assert sum(n.op_type == "QuantizeLinear" for n in q.graph.node) >= 4
    exe = kiln.compile(q)
    sess = ort.InferenceSession(q.SerializeToString(), providers=["CPUExecutionProvider"])
    for f in test:  # the integer build of Kiln's QDQ model = onnxruntime's int8 result (1 step of the last input)
        assert_steps(exe.run(f)[0], sess.run(None, f)[0], 1e-4 * float(np.abs(sess.run(None, f)[0]).max()))
    report = kiln.quantization_report(m, q, test)
    assert [r["op"] for r in report] == ["Conv", "Conv", "Conv", "Gemm", "output"]
    assert report[-1]["snr_db"] >= floor_db, report


def conv_bn_net(seed: int = 3) -> onnx.ModelProto:
    """Conv → BatchNorm → Relu → Conv (no bias) → BatchNorm, the second BatchNorm a graph output's producer."""
    r = np.random.default_rng(seed)
    c = 8

    def bn(name: str) -> dict[str, np.ndarray]:
        return {f"{name}_g": r.uniform(0.5, 1.5, c).astype(np.float32),
                f"{name}_b": r.normal(0, .2, c).astype(np.float32),
                f"{name}_m": r.normal(0, .2, c).astype(np.float32), f"{name}_v": r.uniform(.5, 2, c).astype(np.float32)}
    inits = {"w1": r.normal(0, .3, (c, 3, 3, 3)).astype(np.float32), "b1": r.normal(0, .1, c).astype(np.float32),
             "w2": r.normal(0, .2, (c, c, 1, 1)).astype(np.float32), **bn("bn1"), **bn("bn2")}
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1] * 4),
             helper.make_node("BatchNormalization", ["c1", "bn1_g", "bn1_b", "bn1_m", "bn1_v"], ["n1"], epsilon=1e-3),
             helper.make_node("Relu", ["n1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2"], ["c2"]),
             helper.make_node("BatchNormalization", ["c2", "bn2_g", "bn2_b", "bn2_m", "bn2_v"], ["y"])]
    g = helper.make_graph(nodes, "convbn", [helper.make_tensor_value_info("x", T.FLOAT, [1, 3, 12, 12])],
                          [helper.make_tensor_value_info("y", T.FLOAT, [1, c, 12, 12])],
                          [numpy_helper.from_array(v, k) for k, v in inits.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def test_kiln_quantize_folds_batchnorm() -> None:
    """kiln.quantize folds each BatchNorm into its conv first (quantization/prepare.py, as onnxruntime's
    quant_pre_process): the folded float model computes the same (onnxruntime, 1e-5), the QDQ model has no
    BatchNormalization left, so both convs are integer anchors that stay in the blocked layout."""
    from kiln.quantization.prepare import fold_batchnorm

    m = conv_bn_net()
    folded = fold_batchnorm(m)
    assert [n.op_type for n in folded.graph.node] == ["Conv", "Relu", "Conv"]
    onnx.checker.check_model(folded)
    for f in samples(m, 3, 4):
        want = run_ort(m, f)[0]
        np.testing.assert_allclose(run_ort(folded, f)[0], want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    q = kiln.quantize(m, samples(m, 8, 5))
    assert not any(n.op_type == "BatchNormalization" for n in q.graph.node)
    exe = kiln.compile(q, cache=False)
    assert exe.meta["int8"] is not None
    assert not any("batchnorm" in k for k in exe.meta["kernels"]), exe.meta["kernels"]
    for f in samples(m, 3, 6):
        want = run_ort(m, f)[0]
        assert snr_db(want, exe.run(f)[0]) >= 30.0


def residual_net(c: int = 16, hw: int = 8, seed: int = 7) -> onnx.ModelProto:
    """Two ResNet-style blocks of 1×1 convs: a downsample block (Conv ds(x) and Conv→Relu→Conv summed, Relu) and an
    identity block (Conv→Relu→Conv + its input, Relu), then a Conv reading the sum. (1×1: a bounds-checked AVX2
    build of a 3×3 int8 conv on 32 channels took 233 s of LLVM.)"""
    r = np.random.default_rng(seed)

    def w(*s: int) -> np.ndarray:
        return (r.standard_normal(s) * np.sqrt(2 / np.prod(s[1:]))).astype(np.float32)

    def b() -> np.ndarray:
        return (r.standard_normal(c) * 0.1).astype(np.float32)
    inits = {"wa": w(c, 16, 1, 1), "ba": b(), "wb": w(c, c, 1, 1), "bb": b(), "wd": w(c, 16, 1, 1), "bd": b(),
             "wc": w(c, c, 1, 1), "bc": b(), "we": w(c, c, 1, 1), "be": b(), "wf": w(c, c, 1, 1), "bf": b()}
    conv = helper.make_node
    nodes = [conv("Conv", ["x", "wd", "bd"], ["ds"]),
             conv("Conv", ["x", "wa", "ba"], ["a"]), conv("Relu", ["a"], ["ar"]),
             conv("Conv", ["ar", "wb", "bb"], ["bo"]), conv("Add", ["bo", "ds"], ["s1"]), conv("Relu", ["s1"], ["h1"]),
             conv("Conv", ["h1", "wc", "bc"], ["c"]), conv("Relu", ["c"], ["cr"]),
             conv("Conv", ["cr", "we", "be"], ["e"]), conv("Add", ["e", "h1"], ["s2"]), conv("Relu", ["s2"], ["h2"]),
             conv("Conv", ["h2", "wf", "bf"], ["y"])]
    for n in nodes:
        n.name = n.output[0]
    return make_model(nodes, {"x": np.zeros((1, 16, hw, hw), np.float32)}, ["y"], inits)


def test_kiln_quantize_residual_add_in_the_epilogue(width: str) -> None:
    """kiln.quantize leaves the residual Add to the epilogue of the conv computed last (quantization/qdq.py): no
    Quantize between that conv and the Add — the sum after its Relu is quantized, as the next conv's input — while
    the downsample conv's output keeps its Q → DQ and is stored 8-bit (kernel/build.py keeps the Dequantize out of
    its epilogue and in the reader's). The integer build matches onnxruntime on the same QDQ model (1 step of the
    output's scale) at each x86 width, and the int8 model stays within 30 dB of the float one."""
    m = residual_net()
    q = kiln.quantize(m, samples(m, 12, 3))
    quantized = {n.input[0] for n in q.graph.node if n.op_type == "QuantizeLinear"}
    assert {"x", "ds", "ar", "h1", "cr", "h2"} <= quantized, quantized
    assert not {"bo", "s1", "e", "s2"} & quantized, quantized
    t = resolve(width)
    prog = lower(q, t, 2, check_options({}), stop_after="kernels").program
    stores = {n.name: grp.output.dtype for grp in prog.groups for n in grp.nodes}
    assert stores["ds"] in ("uint8", "int8"), stores
    # the requantization folded through the residual Add (quantize_qdq.py fold_requantize): no division by the
    # output scale left in the anchors' epilogues, those that add the skip included (only the "/ 1.0" of the folded
    # Quantize; the input's own Quantize divides)
    for kern in prog.kernels:
        text = "\n".join(str(c.body) for c in kern.computes)
        assert "sum[" not in text or not re.search(r"(?<!/)/ (?!1\.0\b)\d", text), (kern.name, text)
    test = samples(m, 3, 4)
    sess = ort.InferenceSession(q.SerializeToString(), providers=["CPUExecutionProvider"])
    for f in test:
        got = run_kiln(q, f, target=width)
        want = sess.run(None, f)[0]
        if got is not None:
            assert_steps(got[0], want, 1e-4 * float(np.abs(want).max()), what=width)
    if width_runs(width):
        exe = kiln.compile(q, target=width, cache=False)
        for f in test:
            assert snr_db(run_ort(m, f)[0], exe.run(f)[0]) >= 30.0


def gelu_mlp(d: int = 32, seq: int = 8, seed: int = 5) -> onnx.ModelProto:
    """MatMul → bias → GELU written out as exporters write it (x/√2, Erf, +1, ·x, ·½) → MatMul → bias, and a SiLU
    (x·Sigmoid(x)) after the second."""
    r = np.random.default_rng(seed)
    inits = {"w1": (r.standard_normal((d, 4 * d)) / np.sqrt(d)).astype(np.float32),
             "b1": (r.standard_normal(4 * d) * 0.1).astype(np.float32),
             "w2": (r.standard_normal((4 * d, d)) / np.sqrt(4 * d)).astype(np.float32),
             "b2": (r.standard_normal(d) * 0.1).astype(np.float32), "w3": (r.standard_normal((d, d)) / np.sqrt(d)
                                                                            ).astype(np.float32),
             "sqrt2": np.array(np.sqrt(2), np.float32), "one": np.array(1, np.float32),
             "half": np.array(0.5, np.float32)}
    mk = helper.make_node
    nodes = [mk("MatMul", ["x", "w1"], ["u"]), mk("Add", ["u", "b1"], ["ub"]), mk("Div", ["ub", "sqrt2"], ["g0"]),
             mk("Erf", ["g0"], ["g1"]), mk("Add", ["g1", "one"], ["g2"]), mk("Mul", ["ub", "g2"], ["g3"]),
             mk("Mul", ["g3", "half"], ["g"]), mk("MatMul", ["g", "w2"], ["v"]), mk("Add", ["v", "b2"], ["vb"]),
             mk("Sigmoid", ["vb"], ["s0"]), mk("Mul", ["vb", "s0"], ["s"]), mk("MatMul", ["s", "w3"], ["y"])]
    for n in nodes:
        n.name = n.output[0]
    return make_model(nodes, {"x": np.zeros((1, seq, d), np.float32)}, ["y"], inits)


def test_kiln_quantize_activation_written_out(width: str) -> None:
    """kiln.quantize quantizes an anchor's output after its activation also when the activation is several nodes
    (quantization/qdq.py activation_region: the erf GELU, SiLU), not between the anchor and the activation; the
    integer build matches onnxruntime on that QDQ model (1 step of the output's scale: its last quantized input)."""
    m = gelu_mlp()
    q = kiln.quantize(m, samples(m, 12, 3))
    quantized = {n.input[0] for n in q.graph.node if n.op_type == "QuantizeLinear"}
    assert quantized == {"x", "g", "s"}, quantized
    for f in samples(m, 3, 4):
        compare(q, f, step=last_step(q), target=width)
    if width_runs(width):
        exe = kiln.compile(q, target=width, cache=False)
        for f in samples(m, 3, 4):
            assert snr_db(run_ort(m, f)[0], exe.run(f)[0]) >= 25.0


def test_kiln_quantize_outputs_only_where_an_anchor_reads_them(width: str) -> None:
    """kiln.quantize stores an anchor's output 8-bit only where an anchor reads it (through data movement) or a
    later anchor's epilogue adds it (a residual operand): attention's q, k, v feed float products, o and f3 the
    residual stream — quantizing them only added error. The QDQ model matches onnxruntime on each width."""
    m = transformer_block()
    q = kiln.quantize(m, samples(m, 8, 1))
    quantized = {n.input[0] for n in q.graph.node if n.op_type == "QuantizeLinear"}
    assert quantized == {"x", "att", "hn", "f2"}, quantized
    for f in samples(m, 2, 2):
        compare(q, f, step=1e-3, target=width)


_QUANTIZED: dict[str, onnx.ModelProto] = {}


def test_kiln_quantize_transformer_and_options(width: str) -> None:
    m = transformer_block()
    cal, test = samples(m, 8, 1), samples(m, 3, 2)
    if width not in _QUANTIZED:  # the same model for every width: quantized once
        _QUANTIZED[width] = _QUANTIZED.get("any") or kiln.quantize(m, cal, symmetric=True, per_channel=False)
        _QUANTIZED["any"] = _QUANTIZED[width]
    q = _QUANTIZED[width]
    for f in test:
        compare(q, f, step=1e-3, target=width)
    if width != "avx512":
        return
    snr = kiln.quantization_report(m, q, test)[-1]["snr_db"]
    assert snr >= 25.0, snr
    q2 = kiln.quantize(m, cal, exclude_ops=("MatMul",))
    assert not any(n.op_type == "QuantizeLinear" for n in q2.graph.node)


def test_kiln_quantize_errors() -> None:
    m = convnet()
    with pytest.raises(ValueError, match="needs calibration data"):
        kiln.quantize(m, [])
    with pytest.raises(ValueError, match=r"input 'x': expected float32 of shape \(1, 3, 16, 16\)"):
        kiln.quantize(m, [{"x": np.zeros((1, 3, 8, 8), np.float32)}])
    with pytest.raises(ValueError, match="lacks input 'x'"):
        kiln.quantize(m, [{"y": np.zeros((1, 3, 16, 16), np.float32)}])
    with pytest.raises(ValueError, match="method must be one of"):
        kiln.quantize(m, samples(m, 1, 0), method="mse")


def test_cli_quantize_flags(tmp_path, capsys) -> None:  # noqa: ANN001
    from kiln.cli import main

    m = convnet()
    onnx.save(m, tmp_path / "m.onnx")
    np.savez(tmp_path / "cal.npz", x=np.stack([f["x"] for f in samples(m, 4, 1)]))
    out = str(tmp_path / "m.kiln")
    assert main(["compile", str(tmp_path / "m.onnx"), "--quantize", "int8", "--calibrate", str(tmp_path / "cal.npz"),
                 "-o", out]) == 0
    assert kiln.load(out).meta["int8"]  # integer anchors were built
    assert main(["compile", str(tmp_path / "m.onnx"), "--quantize", "int8", "-o", out]) == 2
    assert "needs calibration data" in capsys.readouterr().err
    (tmp_path / "bad.npz").write_bytes(b"not an npz")
    assert main(["compile", str(tmp_path / "m.onnx"), "--quantize", "int8", "--calibrate",
                 str(tmp_path / "bad.npz"), "-o", out]) == 2
    assert "bad.npz: not a readable .npz" in capsys.readouterr().err


def qlinear_matmul_model(a: np.ndarray, n: int) -> onnx.ModelProto:
    adt = str(a.dtype)
    b = rand(a.shape[-1], n, lo=-128, hi=127, dtype="int8", seed=2)
    node = helper.make_node("QLinearMatMul", ["a", "as", "az", "b", "bs", "bz", "ys", "yz"], ["y"])
    consts = {"as": np.array(0.02, np.float32), "az": np.array(7, adt), "b": b, "bs": np.array(0.01, np.float32),
              "bz": np.array(0, np.int8), "ys": np.array(0.5, np.float32), "yz": np.array(1, adt)}
    return make_model([node], {"a": a}, ["y"], consts, opset=13)


def built_strategies(model: onnx.ModelProto, width: str, strategy: str) -> dict[str, str]:
    c = lower(model, resolve(width), 2, check_options({}), strategy=strategy, stop_after="object")
    return {node: how for k in c.program.kernels for node, how in k.strategies.items()}


def int8_ukernel_cases() -> list[tuple[str, onnx.ModelProto, dict[str, np.ndarray]]]:
    u8 = rand(1, 8, 9, 7, lo=0, hi=255, dtype="uint8")
    s8 = rand(1, 8, 9, 7, lo=-128, hi=127, dtype="int8")
    wide = rand(2, 32, 10, 12, lo=0, hi=255, dtype="uint8", seed=7)  # batch 2: an outer axis of the nest
    a37 = rand(2, 5, 37, lo=0, hi=255, dtype="uint8", seed=8)       # K % 4 = 1: the epilogue's tail product
    s64 = rand(19, 64, lo=-128, hi=127, dtype="int8", seed=9)       # 19 rows: a partial last row tile
    return [("conv3x3 u8", qlinear_conv_model(u8, 16, 1, "uint8", True), {"x": u8}),   # q rows over padded pixels
            ("conv3x3 s8", qlinear_conv_model(s8, 40, 1, "int8", False), {"x": s8}),  # N edge: 40 channels
            ("conv3x3 stride 2", qlinear_conv_model(wide, 24, 1, "uint8", True, stride=2), {"x": wide}),  # ow rows
            ("matmul K=37 batch 2", qlinear_matmul_model(a37, 21), {"a": a37}),
            ("matmul s8 19x64", qlinear_matmul_model(s64, 48), {"a": s64})]


@pytest.mark.parametrize("case", range(5), ids=[c[0] for c in int8_ukernel_cases()])
@pytest.mark.parametrize("strategy", ["direct", "ukernel"])
def test_word_weights_without_vnni(width: str, case: int, strategy: str) -> None:
    """x86 without VNNI (graph/quant_pack.py dot_group): the dense integer anchors' weights packed as int16 pairs,
    one pmaddwd per pair (kernel/dot.py Dot2, the u8s16 / s8s16 microkernels) — the same integers as with the
    bytes widened in the loop (switch `word_weights` off) and exact against onnxruntime; with VNNI (u8 activations)
    the weights stay bytes. At every width; emitted only where this CPU cannot run it."""
    _, m, feeds = int8_ukernel_cases()[case]
    tgt = resolve(width)
    c = lower(m, tgt, 2, check_options({}), strategy=strategy, stop_after="object")
    packed = [n.inputs[1] for n in c.graph.nodes if n.op in ("QPackedConv", "QPackedMatMul")]
    assert packed and {v.dtype for v in packed} == {"int8" if vnni_widths(tgt) else "int16"}, packed
    assert c.objs and all(o[:4] == b"\x7fELF" for o in c.objs)
    if not vnni_widths(tgt):
        ukr = {name for k in c.program.kernels for name in k.extern_ir if name.startswith("kiln_ukr_")}
        assert strategy == "direct" or (ukr and all("s16_" in name for name in ukr)), ukr
    got = compare(m, feeds, target=width, strategy=strategy)
    if got is not None:
        bytes_ = run_kiln(m, feeds, target=width, strategy=strategy, word_weights=False)
        assert all(np.array_equal(g, b) for g, b in zip(got, bytes_))


@pytest.mark.parametrize("case", range(5), ids=[c[0] for c in int8_ukernel_cases()])
def test_int8_ukernel_strategy(width: str, case: int) -> None:
    """strategy="ukernel": the integer anchors on the 8-bit microkernels (kiln/ukernels/dot.py: vpdpbusd where the
    width has VNNI and A is u8, else vpmaddwd), exact against onnxruntime (integer outputs); every anchor is built
    on them, at every width (emitted for the ones this CPU cannot run)."""
    _, m, feeds = int8_ukernel_cases()[case]
    compare(m, feeds, target=width, strategy="ukernel")
    built = built_strategies(m, width, "ukernel")
    assert built and set(built.values()) == {"ukernel"}, built


def test_int8_ukernels_against_numpy() -> None:
    """Each x86 int8 microkernel alone, against NumPy: three levels of steps at odd strides, rows past `rows`
    repeating the last, K4 odd; the methods this CPU cannot run are only compiled."""
    import ctypes

    import llvmlite.binding as llvm

    from kiln.target import host as host_cpu_target
    from kiln.ukernels.dot import METHODS, dot_ukernel

    rng = np.random.default_rng(0)
    needs = {"vnni512": "avx512vnni", "pmaddwd512": "avx512bw", "vnni256": "avxvnni", "vnni128": "avxvnni",
             "pmaddwd256": "avx2", "pmaddwd128": "sse4.2"}
    host_target = host_cpu_target()   # (KILN_HOST_VECTOR_BITS: the host as narrow as that)
    host = features_on(host_target.features)
    forced = os.environ.get("KILN_TEST_EMIT_ONLY", "")
    feats = "+avx512f,+avx512bw,+avx512vl,+avx512vnni,+avxvnni,+avx2,+fma,+sse4.2"
    for method, feature in needs.items():
        lanes, main_mr = METHODS[method]
        signed = "u8s8" if method.startswith("vnni") else "s8s8"  # vpdpbusd multiplies u8 by s8
        words = [] if method.startswith("vnni") else [("u8s16", main_mr, lanes), ("s8s16", 2, 2 * lanes)]
        for ab, mr, nr in [("u8s8", main_mr, 2 * lanes), (signed, max(1, main_mr - 3), lanes)] + words:
            uk = dot_ukernel(method, ab, mr, nr)
            mod = llvm.parse_assembly(uk.ir_text.replace("define internal", "define"))
            mod.verify()
            # a machine per module: the execution engine takes ownership of its machine. The kernels run here are
            # compiled for this CPU's own features: with +avxvnni on a CPU without it (Zen 4 has AVX512-VNNI only)
            # LLVM encodes a 128/256-bit vpdpbusd in VEX form, an illegal instruction there
            runs = feature in host and not (forced and method.endswith("512"))
            tm = llvm.Target.from_triple("x86_64-unknown-linux-gnu").create_target_machine(
                "x86-64", host_target.features if runs else feats, opt=3)
            if not runs:
                assert tm.emit_object(mod)[:4] == b"\x7fELF"  # compiled for a CPU this one is not
                continue
            ee = llvm.create_mcjit_compiler(mod, tm)
            ee.finalize_object()
            fn = ctypes.CFUNCTYPE(None, *([ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p,
                                           ctypes.c_void_p] + [ctypes.c_int64] * 8))(ee.get_function_address(uk.name))
            (n2, s2), (n1, s1), (n0, s0), k4, rows = (2, 1001), (3, 307), (2, 41), 5, mr - 1 or 1
            g = 2 if ab.endswith("s16") else 4  # int16 weights: a group is a pair (of A's bytes, of B's words)
            lda = g * k4 + 37
            a = rng.integers(0 if ab[0] == "u" else -128, 256 if ab[0] == "u" else 128, rows * lda + 2 * 1001
                             + 64).astype(np.uint8 if ab[0] == "u" else np.int8)
            b = rng.integers(-128, 128, (n2 * n1 * n0, k4, nr, 4)).astype(np.int8) if g == 4 else \
                rng.integers(-32768, 32768, (n2 * n1 * n0, k4, nr, 2)).astype(np.int16)  # the whole int16 range
            c = np.full((mr, nr), 12345, np.int32)
            fn(a.ctypes.data, lda, rows, b.ctypes.data, c.ctypes.data, nr, n2, s2, n1, s1, n0, s0, k4)
            want = np.zeros((mr, nr), np.int64)
            for i in range(mr):
                s = 0
                for i2 in range(n2):
                    for i1 in range(n1):
                        for i0 in range(n0):
                            at = min(i, rows - 1) * lda + i2 * s2 + i1 * s1 + i0 * s0
                            av = a[at:at + g * k4].astype(np.int64).reshape(k4, g)
                            want[i] += np.einsum("qg,qjg->j", av, b[s].astype(np.int64))
                            s += 1
            assert np.array_equal(c, want), (method, ab, mr, nr)
            del ee


@pytest.mark.parametrize("library", ["onednn", "mkl", "openblas"])
def test_int8_library_strategy(library: str) -> None:
    """`library:<name>` on integer anchors: GEMMs on the library's integer GEMM (oneDNN dnnl_gemm_u8s8s32 /
    s8s8s32, MKL cblas_gemm_s8u8s32), convs through an 8-bit im2col and the transposed product (the weights are the
    left operand of an NCHW conv, the GEMM takes the activation first), the requantizing epilogue after — exact
    against onnxruntime; a library without an integer GEMM (OpenBLAS) builds them directly and says why."""
    from kiln.library import available

    ok, why = available(library)
    if not ok:
        pytest.skip(why)
    a = rand(2, 5, 37, lo=0, hi=255, dtype="uint8", seed=8)
    x = rand(2, 32, 10, 11, lo=0, hi=255, dtype="uint8", seed=3)
    s8 = rand(1, 16, 6, 7, lo=-128, hi=127, dtype="int8", seed=4)
    for model, feeds in ((qlinear_matmul_model(a, 21), {"a": a}),
                         (qlinear_conv_model(x, 24, 1, "uint8", True, stride=2), {"x": x}),
                         (qlinear_conv_model(s8, 32, 1, "int8", False), {"x": s8})):
        compare(model, feeds, strategy=f"library:{library}")
        built = set(kiln.compile(model, strategy=f"library:{library}", cache=False).meta["strategies"].values())
        if library == "openblas":
            assert built == {"direct (library:openblas not available: no integer GEMM for uint8 activations in "
                             "library:openblas (library:onednn has u8 and s8, library:mkl u8))"}, built
        else:
            assert built == {f"library:{library}"}, built


# -- cross ISAs (qemu) -----------------------------------------------------------------------------------------------
@pytest.mark.same_under_bounds_check
@pytest.mark.parametrize("features,instr", [("+neon,+fp-armv8,+dotprod", "sdot"),
                                            ("+neon,+fp-armv8,+dotprod,+i8mm", "smmla"),
                                            pytest.param("+neon,+fp-armv8", None, marks=pytest.mark.slow)])
def test_int8_aarch64_under_qemu(tmp_path, features: str, instr: str | None) -> None:  # noqa: ANN001
    """AArch64 with dotprod: SDOT (s8 × s8, activations signed there); with i8mm, direct emission's 2×2-block tile
    (SMMLA); without either: LLVM's widening multiply-adds. Exact against onnxruntime (integer outputs)."""
    import dataclasses

    import kiln.cross as kc
    from kiln.codegen.int8 import dot_method
    from kiln.cross import have_toolchain

    if have_toolchain("aarch64"):
        pytest.skip(have_toolchain("aarch64"))
    t = dataclasses.replace(resolve("aarch64-neon"), features=features)
    assert dot_method(t).startswith(instr or "no 8-bit dot product")
    x = rand(1, 8, 9, 7, lo=-128, hi=127, dtype="int8")
    m = qlinear_conv_model(x, 16, 1, "int8", True)
    b = kc.build_binary(m, t, str(tmp_path / "conv"))
    outs, _ = kc.run_qemu(b, {"x": x})
    assert np.array_equal(outs[0], run_ort(m, {"x": x})[0])
    asm = (tmp_path / "conv" / "model.s").read_text()
    assert (instr in asm) if instr else ("sdot" not in asm)


def _s8_tile_cases(*matmuls: tuple[tuple[int, ...], int]) -> list[tuple[str, onnx.ModelProto, dict]]:
    """(name, model, feeds) with int8 activations for the AArch64 tile tests: a blocked 3×3 QLinearConv and one
    QLinearMatMul per (A shape, N)."""
    x = rand(1, 8, 9, 7, lo=-128, hi=127, dtype="int8")
    cases = [("conv", qlinear_conv_model(x, 16, 1, "int8", True), {"x": x})]
    for shape, n in matmuls:
        a = rand(*shape, lo=-128, hi=127, dtype="int8", seed=8)
        cases.append(("x".join(map(str, shape)), qlinear_matmul_model(a, n), {"a": a}))
    return cases


@pytest.mark.same_under_bounds_check
@pytest.mark.parametrize("bounds_check", [False, True], ids=["fast", "bounds-checked"])
def test_int8_smmla_tile_under_qemu(tmp_path, bounds_check: bool) -> None:  # noqa: ANN001
    """Direct emission's 2×2-block tile (SMMLA, schedule/mmla.py) at its edges: K with an odd last group and a
    tail (37 = 4·9 + 1: one mmla of 5 bytes per row), an odd row count (the pair's second row clamped, its store
    guarded), masked edge columns (21, 13 of panels of 8), a batched matmul merged into one row axis, a blocked conv;
    exact against onnxruntime, as is the same build with the switch mmla off (SDOT). The bounds-checked build reads
    each row's bytes and each column group through checked masked loads: the driver fails on any violation."""
    import dataclasses

    import kiln.cross as kc
    from kiln.compiler import check_options, lower
    from kiln.cross import have_toolchain

    if have_toolchain("aarch64"):
        pytest.skip(have_toolchain("aarch64"))
    t = dataclasses.replace(resolve("aarch64-neon"), features="+neon,+fp-armv8,+dotprod,+i8mm")
    for name, m, feeds in _s8_tile_cases(((2, 5, 37), 21), ((7, 64), 24), ((33, 5), 13)):
        c = lower(m, t, 1, check_options({}), stop_after="schedule")
        assert {how for k in c.program.kernels for how in k.precision.values()} == {"smmla"}, name
        for label, options in (("mmla", None), ("sdot", {"mmla": False})):
            b = kc.build_binary(m, t, str(tmp_path / name / label), options=options, bounds_check=bounds_check)
            outs, _ = kc.run_qemu(b, feeds)
            assert np.array_equal(outs[0], run_ort(m, feeds)[0]), (name, label)
            asm = (tmp_path / name / label / "model.s").read_text()
            # (a bounds-checked build emits Dot4 as plain arithmetic, every byte checked: no sdot there)
            assert ("smmla" in asm, "sdot" in asm) == ((True, False) if label == "mmla" else (False, not bounds_check))


@pytest.mark.same_under_bounds_check
@pytest.mark.parametrize("target", ["aarch64-sve", "aarch64-sme"])
def test_int8_tiles_on_scalable_aarch64_under_qemu(tmp_path, target: str) -> None:  # noqa: ANN001
    """An SVE (or SME) target runs an integer GEMM's packed tile, and an int8 conv in the blocked layout, in 128-bit
    NEON registers — every such CPU has NEON — as a fixed-width loop of the scalable build: SDOT with dotprod, SMMLA
    with i8mm, the int8 microkernel under strategy="ukernel"; without either, the same tile on widening multiply-adds.
    Exact against onnxruntime at VL 128 and 512 (the tile does not depend on VL), edges included."""
    import dataclasses

    import kiln.cross as kc
    from kiln.cross import have_toolchain

    if have_toolchain("aarch64"):
        pytest.skip(have_toolchain("aarch64"))
    base = resolve(target)
    cases = _s8_tile_cases(((2, 5, 37), 21), ((7, 64), 24))
    builds = [("", "direct", None), (",+dotprod", "direct", "sdot"), (",+dotprod,+i8mm", "direct", "smmla"),
              (",+dotprod,+i8mm", "ukernel", "smmla")]
    for extra, strategy, instr in builds:
        t = dataclasses.replace(base, features=base.features + extra)
        for name, m, feeds in cases:
            label = f"{name}-{strategy}{extra.replace(',+', '-')}"
            b = kc.build_binary(m, t, str(tmp_path / label), strategy=strategy)
            assert set(b.strategies.values()) == {strategy}, (label, b.strategies)
            if name == "conv" and strategy == "direct":  # the tile, not a scalable loop over NCHW rows
                assert b.vector_loops["fixed"] > 0, label
            for vlen in (128, 512):
                outs, _ = kc.run_qemu(b, feeds, vlen=vlen)
                assert np.array_equal(outs[0], run_ort(m, feeds)[0]), (label, vlen)
            asm = (tmp_path / label / "model.s").read_text()
            assert (instr in asm) if instr else not re.search(r"\b(sdot|smmla)\b", asm), label
            if instr == "smmla":
                assert "sdot" not in asm, label


def test_cross_bounds_check_refuses_scalable_targets(tmp_path) -> None:  # noqa: ANN001
    """A bounds-checked cross build is for fixed-width targets; a scalable one is a clear error (its strip-mined
    accesses have no checks), before anything is compiled."""
    from kiln.cross.build import compile_object

    a = rand(3, 8, lo=-128, hi=127, dtype="int8")
    with pytest.raises(ValueError, match="aarch64-sve has scalable vectors"):
        compile_object(qlinear_matmul_model(a, 4), "aarch64-sve", str(tmp_path / "m.o"), bounds_check=True)
    assert not (tmp_path / "m.o").exists()


@pytest.mark.same_under_bounds_check
def test_int8_mobilenetv2_on_sve_under_qemu(tmp_path) -> None:  # noqa: ANN001
    """kiln.quantize's int8 mobilenetv2 built for SVE with i8mm (blocked int8 convs, depthwise and 1×1 on the NEON
    tile, SMMLA) gives, under qemu at VL 256, exactly the outputs the host's build of the same model gives (integer
    arithmetic and the same float epilogues: bitwise)."""
    import dataclasses

    import kiln
    import kiln.cross as kc
    from kiln import zoo
    from kiln.cross import have_toolchain

    if have_toolchain("aarch64"):
        pytest.skip(have_toolchain("aarch64"))
    model = kiln.quantize(zoo.build("mobilenetv2"), [zoo.inputs("mobilenetv2")] * 2)
    feeds = zoo.inputs("mobilenetv2")
    host = kiln.compile(model, cache=False).run(feeds)[0]
    base = resolve("aarch64-sve")
    b = kc.build_binary(model, dataclasses.replace(base, features=base.features + ",+dotprod,+i8mm"),
                        str(tmp_path / "sve"))
    out = kc.run_qemu(b, feeds, vlen=256)[0][0]
    if resolve("host").has_fma:  # both contract the epilogues' y·s + z alike: bitwise
        assert np.array_equal(out, host), np.abs(out - host).max()
    else:  # a host without FMA rounds y·s before the add: within float32's rounding of the outputs
        np.testing.assert_allclose(out, host, rtol=0, atol=4 * np.finfo(np.float32).eps * np.abs(host).max())
    assert "smmla" in (tmp_path / "sve" / "model.s").read_text()


@pytest.mark.same_under_bounds_check
@pytest.mark.parametrize("features,method", [("+neon,+fp-armv8,+dotprod", "sdot"),
                                            ("+neon,+fp-armv8,+dotprod,+i8mm", "i8mm")])
def test_int8_ukernel_aarch64_under_qemu(tmp_path, features: str, method: str) -> None:  # noqa: ANN001
    """strategy="ukernel" on AArch64: the SDOT microkernel, or with i8mm the SMMLA one (2×2 blocks of two 4-byte
    groups; K4 odd: its last group with the upper half zero); exact against onnxruntime."""
    import dataclasses

    import kiln.cross as kc
    from kiln.cross import have_toolchain

    if have_toolchain("aarch64"):
        pytest.skip(have_toolchain("aarch64"))
    t = dataclasses.replace(resolve("aarch64-neon"), features=features)
    x = rand(1, 8, 9, 7, lo=-128, hi=127, dtype="int8")
    a = rand(2, 5, 37, lo=-128, hi=127, dtype="int8", seed=8)   # K = 37: 9 groups (odd) and a tail product
    for name, m, feeds in (("conv", qlinear_conv_model(x, 16, 1, "int8", True), {"x": x}),
                           ("matmul", qlinear_matmul_model(a, 21), {"a": a})):
        b = kc.build_binary(m, t, str(tmp_path / name), strategy="ukernel")
        outs, _ = kc.run_qemu(b, feeds)
        assert np.array_equal(outs[0], run_ort(m, feeds)[0]), name
        asm = (tmp_path / name / "model.s").read_text()
        assert f"kiln_ukr_{method}_s8s8_" in asm and ("smmla" in asm) == (method == "i8mm"), name


@pytest.mark.same_under_bounds_check
@pytest.mark.parametrize("vlen", [128, 256])
def test_int8_riscv_under_qemu(tmp_path, vlen: int) -> None:  # noqa: ANN001
    """RVV: the integer anchors on widening multiply-adds (vwmacc.vx / vwmaccsu.vx), requantized to u8 through a 32-bit
    convert (qemu 7.2 asserts on RVV's narrowing float→int converts); exact against onnxruntime at two VLENs."""
    import kiln.cross as kc
    from kiln.cross import have_toolchain

    if have_toolchain("riscv64"):
        pytest.skip(have_toolchain("riscv64"))
    x = rand(1, 8, 9, 7, lo=0, hi=255, dtype="uint8")
    a = rand(2, 5, 37, lo=0, hi=255, dtype="uint8", seed=8)
    for name, m, feeds in (("conv", qlinear_conv_model(x, 16, 1, "uint8", True), {"x": x}),
                           ("matmul", qlinear_matmul_model(a, 21), {"a": a})):
        b = kc.build_binary(m, "riscv64-rvv", str(tmp_path / name))
        outs, _ = kc.run_qemu(b, feeds, vlen=vlen)
        assert np.array_equal(outs[0], run_ort(m, feeds)[0]), name
        assert re.search(r"\bvwmacc(su)?\.vx\b", (tmp_path / name / "model.s").read_text()), name


def test_isa_int8_report() -> None:
    """The int8 ISA table finds each ISA's dot-product hot loop, direct and microkernel; a wider dot product costs
    fewer instructions per multiply-accumulate (VNNI zmm < AVX-VNNI ymm < the SSE pmaddwd fallback; SDOT < NEON
    widening MACs; SMMLA < SDOT)."""
    from kiln.isa.int8 import markdown, report

    rows = {(r.label, r.strategy): r for r in report(32, 128, 64)}
    ipm = {key: r.instructions_per_mac for key, r in rows.items()}
    assert all(r.macs > 0 for r in rows.values()), markdown(list(rows.values()))
    for s in ("direct", "ukernel"):
        assert ipm["x86 AVX-512 VNNI (avx512)", s] < ipm["x86 AVX-VNNI (avx2)", s] < ipm["x86 SSE, no VNNI (sse)", s]
    assert ipm["AArch64 NEON + dotprod", "direct"] < ipm["AArch64 NEON", "direct"]
    assert ("AArch64 NEON", "ukernel") not in rows  # no int8 microkernel without dotprod
    # i8mm, the microkernel and direct emission's block tile: SMMLA's 32 MACs per instruction against SDOT's 16
    assert "i8mm" in rows["AArch64 NEON + i8mm", "ukernel"].method
    assert rows["AArch64 NEON + i8mm", "direct"].method.startswith("smmla")
    for s in ("direct", "ukernel"):
        assert ipm["AArch64 NEON + i8mm", s] < 0.7 * ipm["AArch64 NEON + dotprod", s]


@pytest.mark.slow  # importing NNCF alone takes ~10 s
def test_nncf_qdq_convnet() -> None:
    """NNCF's post-training quantization (QuantizeLinear/DequantizeLinear pairs, Gemm, fast bias correction):
    within 1 step of the last quantized tensor of onnxruntime running the QDQ graph as written."""
    nncf = pytest.importorskip("nncf")
    m = convnet()
    q = nncf.quantize(m, nncf.Dataset(samples(m, 8, 1)), subset_size=8)
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    literal = ort.InferenceSession(q.SerializeToString(), so, providers=["CPUExecutionProvider"])
    exe = kiln.compile(q)
    assert set(exe.meta["strategies"]) and exe.meta["int8"]  # integer anchors were built
    for f in samples(m, 3, 2):
        assert_steps(exe.run(f)[0], literal.run(None, f)[0], last_step(q))


def test_requantize_epilogue_drops_the_second_clamp() -> None:
    """kernel/simplify.py: the Quantize clamp after a ReLU6 folded into the quantized range is dropped; a clamp the
    value can exceed is kept (one side of it, where a zero point shifts the range)."""
    from kiln.kernel.ir import Cast, Const, Load, Un, maximum, minimum
    from kiln.kernel.simplify import drop_satisfied_clamps, float_range

    x = Load("acc", (Const(0, "int64"),), "float32")
    f = lambda v: Const(float(v), "float32")  # noqa: E731

    def clamp(e, lo, hi):  # noqa: ANN001, ANN202
        return minimum(maximum(e, f(lo)), f(hi))
    inner = clamp(x * f(0.5), 0, 255)
    assert float_range(Un("round", inner)) == (0.0, 255.0)
    q = Cast("uint8", clamp(Un("round", inner / f(1.0)), 0, 255))
    assert drop_satisfied_clamps(q) == Cast("uint8", Un("round", inner / f(1.0)))
    shifted = Cast("uint8", clamp(Un("round", inner) + f(3), 0, 255))  # a zero point of 3: ≥ 3 but up to 258
    assert drop_satisfied_clamps(shifted) == Cast("uint8", minimum(Un("round", inner) + f(3), f(255)))
    assert drop_satisfied_clamps(clamp(x, 0, 255)) == clamp(x, 0, 255)
