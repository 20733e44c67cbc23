"""Shared helpers for the per-operator tests: build a small ONNX model, run it in Kiln and onnxruntime,
compare.

    check_op("Add", [x, C(y)], rtol=1e-5)          # x is a graph input, y an initializer
    check(model, feeds, rtol=1e-4, fusion=False)   # any model; extra keywords go to kiln.compile

Float outputs must satisfy max|kiln − ort| ≤ rtol · max(max|ort|, TINY); integer and bool outputs
must be equal. Shapes and dtypes must match exactly."""
from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

import kiln
from kiln.kernel.ir import walk_stmts
from kiln.target import X86_WIDTHS, resolve, runs_here

# the graph is verified after every pass here (a user's compile checks it once, after the last pass): a pass that
# breaks it fails its test by name
os.environ.setdefault("KILN_VERIFY_EACH_PASS", "1")

TINY = 1e-6
T = onnx.TensorProto
NP_TO_ONNX = {np.dtype(k): v for k, v in {"float32": T.FLOAT, "float64": T.DOUBLE, "int64": T.INT64,
                                           "int32": T.INT32, "bool": T.BOOL, "uint8": T.UINT8,
                                           "int8": T.INT8}.items()}


@dataclass
class C:
    """Marks an argument of `op_model`/`check_op` as an initializer (a constant) instead of a graph input."""
    value: np.ndarray


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def rand(*shape: int, lo: float = -2.0, hi: float = 2.0, seed: int = 0, dtype: str = "float32") -> np.ndarray:
    """Uniform random floats (or integers in [lo, hi) when dtype is an int type)."""
    g = rng(seed + 7919 * len(shape) + sum(shape))
    if np.dtype(dtype).kind in "iu":
        return g.integers(int(lo), int(hi), size=shape).astype(dtype)
    if dtype == "bool":
        return g.random(shape) < 0.5
    return g.uniform(lo, hi, size=shape).astype(dtype)


def _ir_version(opset: int) -> int:
    return 8 if opset <= 17 else (9 if opset <= 20 else 10)


def make_model(nodes: Sequence[onnx.NodeProto], inputs: dict[str, np.ndarray], outputs: Sequence[str],
               consts: dict[str, np.ndarray] | None = None, opset: int = 17) -> onnx.ModelProto:
    """A model of `nodes` whose graph inputs have the shapes/dtypes of `inputs` (the feeds); output types
    come from ONNX shape inference."""
    ins = [helper.make_tensor_value_info(n, NP_TO_ONNX[a.dtype], list(a.shape)) for n, a in inputs.items()]
    inits = [numpy_helper.from_array(np.asarray(a), n) for n, a in (consts or {}).items()]
    outs = [onnx.ValueInfoProto(name=n) for n in outputs]
    graph = helper.make_graph(list(nodes), "test", ins, outs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = _ir_version(opset)
    inferred = onnx.shape_inference.infer_shapes(model)
    known = {v.name: v for v in list(inferred.graph.value_info) + list(inferred.graph.output)}
    for o in model.graph.output:
        if o.name in known and known[o.name].type.HasField("tensor_type"):
            o.type.CopyFrom(known[o.name].type)
    return model


def op_model(op: str, args: Sequence[np.ndarray | C | None], attrs: dict[str, Any] | None = None,
             opset: int = 17, n_out: int = 1) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """One-node model: arrays become graph inputs x0, x1, ...; `C(array)` initializers; None an omitted
    optional input. Returns the model and its feeds."""
    names, feeds, consts = [], {}, {}
    for i, a in enumerate(args):
        if a is None:
            names.append("")
        elif isinstance(a, C):
            names.append(f"c{i}")
            consts[f"c{i}"] = np.asarray(a.value)
        else:
            names.append(f"x{i}")
            feeds[f"x{i}"] = np.asarray(a)
    while names and names[-1] == "":
        names.pop()
    outs = [f"y{i}" for i in range(n_out)]
    node = helper.make_node(op, names, outs, name=f"{op.lower()}_node", **(attrs or {}))
    return make_model([node], feeds, outs, consts, opset), feeds


def run_ort(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    ort = pytest.importorskip("onnxruntime")
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


# -- x86 vector widths ------------------------------------------------------------------------------------------------
# A test whose code path depends on the vector width (layouts, Winograd, tiles, packs, transposed access groups,
# reorders, microkernels) takes the `width` fixture and passes `target=width` to `check`: it runs once per x86
# width. A width this CPU can execute is compiled, run and compared with onnxruntime; one it cannot (AVX-512 on an
# AVX2 host) is lowered and its object emitted — the id says `-emit-only` — so a compile-time crash on that path
# fails here too. KILN_TEST_EMIT_ONLY=avx512[,avx2] treats widths as not executable (to exercise that path).
WIDTHS: tuple[str, ...] = tuple(X86_WIDTHS) if resolve("host").arch == "x86_64" else ()


nest_stmts = walk_stmts  # every statement of a loop nest in order (kiln/kernel/ir.py)


def width_runs(width: str) -> bool:
    forced = {w.strip() for w in os.environ.get("KILN_TEST_EMIT_ONLY", "").split(",") if w.strip()}
    return width not in forced and runs_here(resolve(width))


@pytest.fixture(params=[pytest.param(w, id=w if width_runs(w) else f"{w}-emit-only") for w in WIDTHS])
def width(request: pytest.FixtureRequest) -> str:
    return request.param


def emit_only(model: onnx.ModelProto, target: str, **compile_kw: Any) -> bytes:
    """Lower `model` for a width this CPU cannot run and emit its object (what `kiln compile --target` writes)."""
    from kiln.compiler import check_options, lower

    kw = dict(compile_kw)
    kw.pop("cache", None)
    threads = int(kw.pop("num_threads", 2))
    strategy, strategies = kw.pop("strategy", "direct"), kw.pop("strategies", None)
    bounds = bool(kw.pop("bounds_check", False))
    precision = kw.pop("precision", "fp32")
    c = lower(model, resolve(target), threads, check_options(kw), strategy=strategy, strategies=strategies,
              bounds_check=bounds, stop_after="object", precision=precision)
    assert c.obj[:4] == b"\x7fELF", f"{target}: no ELF object emitted"
    assert all(f.encode() in c.obj for f in c.kernel_functions), f"{target}: kernel symbols missing from the object"
    return c.obj


def last_step(q: onnx.ModelProto) -> float:
    """The scale of the last quantized tensor before the graph output (one quantization step there)."""
    inits = {t.name: numpy_helper.to_array(t) for t in q.graph.initializer}
    dqs = [n for n in q.graph.node if n.op_type == "DequantizeLinear" and n.input[0] not in inits]
    return float(inits[dqs[-1].input[1]].max())


def run_kiln(model: onnx.ModelProto, feeds: dict[str, np.ndarray], **compile_kw: Any) -> list[np.ndarray] | None:
    """Kiln's outputs; None when `target` is a width this CPU cannot execute (its object is emitted instead)."""
    kw = {"num_threads": 2, "cache": False, **compile_kw}
    if os.environ.get("KILN_BOUNDS_CHECK", "0") not in ("", "0"):  # `pytest --bounds-check`: the debug build
        kw.setdefault("bounds_check", True)
    target = kw.get("target")
    if isinstance(target, str) and target in X86_WIDTHS and not width_runs(target):
        emit_only(model, target, **{k: v for k, v in kw.items() if k != "target"})
        return None
    return kiln.compile(model, **kw).run(feeds)


def assert_close(got: np.ndarray, want: np.ndarray, rtol: float, what: str = "output") -> None:
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, f"{what}: shape {got.shape}, onnxruntime {want.shape}"
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype}, onnxruntime {want.dtype}"
    if want.dtype.kind != "f":
        bad = np.argwhere(got != want)
        first = tuple(bad[0]) if bad.size else ()
        assert bad.size == 0, (f"{what}: {len(bad)} of {want.size} elements differ, first at {first}: "
                               f"kiln {got[first]} vs onnxruntime {want[first]}")
        return
    assert np.array_equal(np.isnan(got), np.isnan(want)), f"{what}: NaNs in different places"
    fin = ~np.isnan(want)
    assert np.array_equal(got[fin & np.isinf(want)], want[fin & np.isinf(want)]), f"{what}: infinities differ"
    ok = fin & ~np.isinf(want)
    if not ok.any():
        return
    err = np.abs(got[ok].astype(np.float64) - want[ok].astype(np.float64))
    scale = max(float(np.abs(want[ok]).max()), TINY)
    worst = float(err.max())
    if worst > rtol * scale:
        i = tuple(np.argwhere(ok)[int(err.argmax())])
        pytest.fail(f"{what}: max|kiln − ort| = {worst:.3g} > {rtol:g} × {scale:.3g}; worst at {i}: "
                    f"kiln {got[i]!r} vs onnxruntime {want[i]!r}")


def check(model: onnx.ModelProto, feeds: dict[str, np.ndarray], rtol: float,
          **compile_kw: Any) -> list[np.ndarray] | None:
    """Compile with Kiln, run both, compare every output. Returns Kiln's outputs (None for an emit-only width)."""
    got = run_kiln(model, feeds, **compile_kw)
    if got is None:
        return None
    want = run_ort(model, feeds)
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        assert_close(g, w, rtol, f"output {i} ({model.graph.output[i].name})")
    return got


def check_op(op: str, args: Sequence[np.ndarray | C | None], rtol: float, attrs: dict[str, Any] | None = None,
             opset: int = 17, n_out: int = 1, **compile_kw: Any) -> list[np.ndarray]:
    model, feeds = op_model(op, args, attrs, opset, n_out)
    return check(model, feeds, rtol, **compile_kw)


def expect_unsupported(op: str, args: Sequence[np.ndarray | C | None], attrs: dict[str, Any] | None = None,
                       opset: int = 17, n_out: int = 1, match: str | None = None) -> None:
    """Kiln must refuse the model at compile time, naming the operator."""
    model, _ = op_model(op, args, attrs, opset, n_out)
    with pytest.raises(kiln.UnsupportedOperator) as info:
        kiln.compile(model, num_threads=2, cache=False)
    assert op in str(info.value) and info.value.op_type == op
    if match:
        assert match in str(info.value)



def check_op_chained(op: str, args: Sequence[np.ndarray | C | None], rtol: float,
                     attrs: dict[str, Any] | None = None, opset: int = 17, n_out: int = 1,
                     **compile_kw: Any) -> list[np.ndarray]:
    """As check_op, but the op reads a computed value (x0 · 2) and its outputs feed an Add (+1): data movement
    and views between two kernels, and fusion with neighbours, instead of graph input → graph output."""
    model, feeds = op_model(op, args, attrs, opset, n_out)
    node = model.graph.node[0]
    dtype = feeds[node.input[0]].dtype
    consts = {n.name: numpy_helper.to_array(n) for n in model.graph.initializer}
    consts.update(two=np.array(2, dtype), one=np.array(1, dtype))
    nodes = [helper.make_node("Mul", [node.input[0], "two"], ["scaled"], name="pre")]
    node.input[0] = "scaled"
    nodes.append(node)
    nodes += [helper.make_node("Add", [o, "one"], [f"z{i}"], name=f"post{i}")
              for i, o in enumerate(node.output)]
    chained = make_model(nodes, feeds, [f"z{i}" for i in range(n_out)], consts, opset)
    return check(chained, feeds, rtol, **compile_kw)
