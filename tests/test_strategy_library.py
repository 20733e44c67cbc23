"""The `library` strategy (kiln/library, kiln/schedule/library.py): MatMul/Gemm/Conv built on OpenBLAS, MKL and
oneDNN SGEMM calls match onnxruntime (≤ 1e-3 relative), `exe.meta["strategies"]` proves the call was made, what
does not fit a GEMM (grouped, depthwise conv) falls back to direct and says why, a missing library is a clear
error, and a saved executable with library calls runs in a fresh process. Each library's tests skip with the
install hint when its wheel is missing (`pip install 'kiln[library]'`)."""
from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap

import numpy as np
import onnx
import pytest
from onnx import helper

import kiln
import kiln.library as library
import kiln.zoo as zoo
from conftest import C, assert_close, check, make_model, op_model, rand, run_ort
from kiln.strategy import LIBRARIES

RTOL = 1e-3


@pytest.fixture(params=LIBRARIES)
def lib(request: pytest.FixtureRequest) -> str:
    ok, why = library.available(request.param)
    if not ok:
        pytest.skip(why)
    return request.param


def built_with(model: onnx.ModelProto, feeds: dict[str, np.ndarray], lib: str, **kw: object) -> dict[str, str]:
    """Check the model on library `lib` against onnxruntime; return how each anchor was built."""
    check(model, feeds, RTOL, strategy=f"library:{lib}", **kw)
    return kiln.compile(model, num_threads=2, strategy=f"library:{lib}", **kw).meta["strategies"]


# -- MatMul / Gemm -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("m,k,n", [(1, 1, 2), (3, 1, 4), (1, 64, 33), (17, 5, 1), (7, 300, 3), (33, 47, 29),
                                   (129, 771, 257)])
@pytest.mark.parametrize("b_const", [True, False], ids=["B-const", "B-input"])
def test_matmul_edge_shapes(lib: str, m: int, k: int, n: int, b_const: bool) -> None:
    a, b = rand(m, k, seed=m), rand(k, n, seed=n)
    model, feeds = op_model("MatMul", [a, C(b) if b_const else b])
    assert built_with(model, feeds, lib) == {"matmul_node": f"library:{lib}"}


@pytest.mark.parametrize("sa,sb", [((3, 2, 17, 33), (33, 9)),       # A batched, B shared
                                   ((4, 17, 33), (4, 33, 9)),       # both batched
                                   ((17, 33), (2, 33, 9)),          # A shared: one call per B
                                   ((2, 1, 5, 8), (3, 8, 6))])      # broadcast batch dims
def test_batched_matmul(lib: str, sa: tuple[int, ...], sb: tuple[int, ...]) -> None:
    model, feeds = op_model("MatMul", [rand(*sa, seed=1), rand(*sb, seed=2)])
    assert built_with(model, feeds, lib) == {"matmul_node": f"library:{lib}"}


@pytest.mark.parametrize("attrs,c_shape", [({}, None), ({"transA": 1}, (29,)), ({"transB": 1}, (33, 29)),
                                           ({"transA": 1, "transB": 1, "alpha": 0.5, "beta": -2.0}, (1, 29)),
                                           ({"alpha": 3.0}, (29,))])
@pytest.mark.parametrize("b_const", [True, False], ids=["B-const", "B-input"])
def test_gemm(lib: str, attrs: dict[str, object], c_shape: tuple[int, ...] | None, b_const: bool) -> None:
    a = rand(*((47, 33) if attrs.get("transA") else (33, 47)), seed=3)
    b = rand(*((29, 47) if attrs.get("transB") else (47, 29)), seed=4)
    args = [a, C(b) if b_const else b] + ([C(rand(*c_shape, seed=5))] if c_shape else [])
    model, feeds = op_model("Gemm", args, attrs)
    assert set(built_with(model, feeds, lib).values()) == {f"library:{lib}"}


def test_matmul_bias_gelu_epilogue(lib: str) -> None:
    """The epilogue (bias + GELU) runs as its own elementwise pass over the library's product."""
    x, w, bias = rand(24, 64, seed=6), rand(64, 80, seed=7), rand(80, seed=8)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
             helper.make_node("Add", ["h", "bias"], ["hb"], name="bias"),
             helper.make_node("Gelu", ["hb"], ["y"], name="gelu")]
    model = make_model(nodes, {"x": x}, ["y"], {"w": w, "bias": bias}, opset=20)
    assert built_with(model, {"x": x}, lib) == {"mm": f"library:{lib}"}


def test_transposed_operand_uses_trans_flag(lib: str) -> None:
    """x·Wᵀ with W a constant stored [N, K]: the load pattern is a transposed B, passed with transB, no copy."""
    from kiln.compiler import check_options, lower
    from kiln.target import resolve

    x, w = rand(16, 40, seed=9), rand(24, 40, seed=10)
    model, feeds = op_model("Gemm", [x, C(w)], {"transB": 1})
    check(model, feeds, RTOL, strategy=f"library:{lib}")
    out = lower(model, resolve("host"), 2, check_options({}), strategy=f"library:{lib}", stop_after="kernels")
    calls = [s for k in out.program.kernels for s in nested(k.body) if type(s).__name__ == "Call"]
    assert len(calls) == 1 and not any(b.name.endswith(("_a0", "_b0")) for k in out.program.kernels
                                       for b in k.scratch), "the transposed operand was copied"


def nested(stmts: list) -> list:
    """Every statement of a loop nest (a single-threaded library's call sits in Kiln's parallel slab loop)."""
    return [x for s in stmts for x in (s, *nested(getattr(s, "body", [])))]


# -- Conv ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("shape,w_shape,attrs", [
    ((1, 16, 12, 12), (24, 16, 3, 3), {"pads": [1, 1, 1, 1]}),
    ((1, 16, 13, 11), (8, 16, 3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 2]}),
    ((1, 32, 9, 9), (40, 32, 1, 1), {}),
    ((1, 32, 9, 9), (40, 32, 1, 1), {"strides": [2, 2]}),
    ((2, 3, 20, 20), (8, 3, 7, 7), {"pads": [3, 3, 3, 3], "strides": [2, 2]}),
    ((1, 8, 10, 10), (8, 8, 3, 3), {"dilations": [2, 2], "pads": [2, 2, 2, 2]}),
], ids=["3x3-pad", "3x3-stride2", "1x1", "1x1-stride2", "7x7-batch2", "3x3-dilated"])
def test_conv_im2col_sgemm(lib: str, shape: tuple[int, ...], w_shape: tuple[int, ...], attrs: dict) -> None:
    x, w, bias = rand(*shape, seed=11), rand(*w_shape, seed=12, lo=-0.5, hi=0.5), rand(w_shape[0], seed=13)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", **attrs),
             helper.make_node("Relu", ["c"], ["y"], name="relu")]
    model = make_model(nodes, {"x": x}, ["y"], {"w": w, "b": bias})
    assert built_with(model, {"x": x}, lib) == {"conv": f"library:{lib}"}


@pytest.mark.parametrize("group,w_shape", [(2, (12, 4, 3, 3)), (8, (8, 1, 3, 3))], ids=["grouped", "depthwise"])
def test_conv_that_is_no_gemm_falls_back_and_says_so(lib: str, group: int, w_shape: tuple[int, ...],
                                                     caplog: pytest.LogCaptureFixture) -> None:
    x, w = rand(1, 8, 10, 10, seed=14), rand(*w_shape, seed=15)
    model, feeds = op_model("Conv", [x, C(w)], {"group": group, "pads": [1, 1, 1, 1]})
    with caplog.at_level(logging.INFO, logger="kiln.library"):
        assert built_with(model, feeds, lib) == {"conv_node": "direct"}
    why = "not affine" if group < 8 else "matrix-vector products"
    assert any("conv_node" in r.getMessage() and why in r.getMessage() for r in caplog.records), caplog.text


# -- whole models --------------------------------------------------------------------------------------------
FAST_MODELS = ["gemm_odd", "conv_r50_3x3", "conv_dw", "mlp", "gemm_1024"]
SLOW_MODELS = ["resnet18", "mobilenetv2", "resnet50", "bert_base"]


def check_zoo(name: str, lib: str) -> None:
    model, feeds = zoo.build(name), zoo.inputs(name)
    want = run_ort(model, feeds)
    exe = kiln.compile(model, num_threads=2, strategy=f"library:{lib}", cache=False)
    for i, (g, w) in enumerate(zip(exe.run(feeds), want)):
        assert_close(g, w, RTOL, f"{name} output {i}")
    built = exe.meta["strategies"]
    if name == "conv_dw":  # depthwise: a batch of matrix-vector products, built directly
        assert set(built.values()) == {"direct"}
    elif name == "mobilenetv2":  # its depthwise convs fall back, every other anchor is a library call
        assert {n for n, s in built.items() if s == "direct"} == {n for n in built if ".dw." in n}
    else:
        assert set(built.values()) == {f"library:{lib}"}, built


@pytest.mark.parametrize("name", FAST_MODELS)
def test_zoo_model(lib: str, name: str) -> None:
    check_zoo(name, lib)


@pytest.mark.slow
@pytest.mark.parametrize("name", SLOW_MODELS)
def test_zoo_model_slow(lib: str, name: str) -> None:
    check_zoo(name, lib)


# -- binding, errors, persistence ----------------------------------------------------------------------------
def test_plain_library_means_the_first_available() -> None:
    name = next((n for n in LIBRARIES if library.available(n)[0]), None)
    if name is None:
        pytest.skip("no library installed: pip install 'kiln[library]'")
    assert library.default_library() == name
    model, feeds = op_model("MatMul", [rand(5, 6), C(rand(6, 7))])
    exe = kiln.compile(model, num_threads=2, strategy="library", cache=False)
    assert exe.meta["symbols"] == [library.MODULES[name].SGEMM]
    assert exe.meta["strategies"] == {"matmul_node": f"library:{name}"}
    assert_close(exe.run(feeds)[0], run_ort(model, feeds)[0], RTOL)


def test_missing_library_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing() -> None:
        raise OSError("libmkl_rt.so not found in the interpreter's lib dir")
    monkeypatch.setattr(library.mkl, "load", missing)
    assert library.available("mkl") == (False, "mkl is not available (libmkl_rt.so not found in the interpreter's "
                                        "lib dir); pip install 'kiln[library]' (or just the mkl wheel: pip install "
                                        "mkl)")
    model, _ = op_model("MatMul", [rand(5, 6), C(rand(6, 7))])
    with pytest.raises(library.LibraryUnavailable, match=r"pip install 'kiln\[library\]'.*pip install mkl"):
        kiln.compile(model, num_threads=2, strategy="library:mkl", cache=False)
    with pytest.raises(kiln.errors.KilnError, match="mkl is not available"):
        library.bind_symbols(["cblas_sgemm"], 2)
    for name in ("openblas", "onednn", "blis"):
        monkeypatch.setattr(library.MODULES[name], "load", missing)
    with pytest.raises(library.LibraryUnavailable, match="needs one of mkl, openblas, onednn, blis, and none loads"):
        kiln.compile(model, num_threads=2, strategy="library", cache=False)


def test_unknown_symbol_is_a_clear_error() -> None:
    with pytest.raises(kiln.errors.KilnError, match="'cblas_dgemm', which no library"):
        library.bind_symbols(["cblas_dgemm"], 2)


def test_binding_sets_the_library_thread_count() -> None:
    if not library.available("mkl")[0]:
        pytest.skip(library.available("mkl")[1])
    model, feeds = op_model("MatMul", [rand(5, 6), C(rand(6, 7))])
    for threads in (1, 2):
        kiln.compile(model, num_threads=threads, strategy="library:mkl", cache=False)
        assert library.mkl.load().MKL_Get_Max_Threads() == threads


def test_saved_executable_runs_in_a_fresh_process(lib: str, tmp_path: os.PathLike) -> None:
    x, w, bias = rand(1, 8, 9, 9, seed=16), rand(16, 8, 3, 3, seed=17), rand(16, seed=18)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("Flatten", ["r"], ["f"], name="flat"),
             helper.make_node("MatMul", ["f", "fc"], ["y"], name="fc")]
    model = make_model(nodes, {"x": x}, ["y"], {"w": w, "b": bias, "fc": rand(16 * 81, 10, seed=19)})
    exe = kiln.compile(model, num_threads=2, strategy=f"library:{lib}", cache=False)
    assert exe.meta["strategies"] == {"conv": f"library:{lib}", "fc": f"library:{lib}"}
    path = os.path.join(tmp_path, "model.kiln")
    exe.save(path)
    np.save(os.path.join(tmp_path, "x.npy"), x)
    script = textwrap.dedent(f"""
        import numpy as np, kiln
        exe = kiln.load({path!r})
        np.save({os.path.join(tmp_path, 'y.npy')!r}, exe.run({{"x": np.load({os.path.join(tmp_path, 'x.npy')!r})}})[0])
    """)
    env = {**os.environ, "KILN_CACHE_DIR": str(tmp_path)}
    subprocess.run([sys.executable, "-c", script], check=True, env=env, timeout=120)
    assert_close(np.load(os.path.join(tmp_path, "y.npy")), run_ort(model, {"x": x})[0], RTOL)
