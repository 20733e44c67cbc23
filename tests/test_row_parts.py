"""Each thread reads and writes the rows it wrote itself: a dense conv's padded input copy and a pooling layer run
their parallel loop over rows (kernel/lower.py: rows_outermost), as the conv tiles around them split their output
rows (schedule/tile.py: image_thread_parts) — they split by channel blocks, and when the host put the two vCPUs on two
L3s every handoff crossed between them. Structure at every x86 width, outputs against onnxruntime (rtol 1e-5)."""
from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper

import kiln
from conftest import assert_close, last_step, nest_stmts, run_ort, width_runs
from kiln.compiler import check_options, lower
from kiln.kernel.ir import Const, Loop, Store, Var, substitute, value_at, walk
from kiln.target import resolve


def conv_pool_model():  # noqa: ANN201 - onnx.ModelProto
    r = np.random.default_rng(3)
    w1 = (r.standard_normal((64, 32, 3, 3)) * 0.1).astype(np.float32)
    w2 = (r.standard_normal((64, 64, 3, 3)) * 0.05).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1], strides=[2, 2]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("MaxPool", ["r1"], ["p1"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
             helper.make_node("AveragePool", ["p1"], ["p2"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["p2", "w2"], ["y"], pads=[1, 1, 1, 1], strides=[2, 2])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 32, 40, 40])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_padded_copies_and_pools_split_by_rows(width: str) -> None:
    model = conv_pool_model()
    prog = lower(model, resolve(width), 2, check_options({}), stop_after="kernels").program
    checked, split = 0, 0
    for k in prog.kernels:
        # a conv's computes before its anchor (the padded copy, the kernel's first nest), a pool's one compute
        for c in k.computes[:-1] if k.name.endswith("conv") else k.computes if k.name.endswith("_pool") else []:
            rows = c.axes[0]  # the row axis first, storing where it did
            assert c.store is not None and c.store.index(rows) == 2, (k.name, c)
            checked += 1
            par = [s for s in nest_stmts(k.body[:1]) if isinstance(s, Loop) and s.kind == "parallel"]
            assert all(s.var.name.split("_")[0] == rows.name for s in par), (k.name, str(k))
            split += bool(par)  # (a copy below PARALLEL_MIN_WORK runs on one thread)
    assert checked == 4 and split >= 3, (checked, split)  # two padded copies, two pools
    if width_runs(width):
        x = np.random.default_rng(4).standard_normal((1, 32, 40, 40)).astype(np.float32)
        exe = kiln.compile(model, target=width, num_threads=2, cache=False)
        assert_close(exe.run({"x": x})[0], run_ort(model, {"x": x})[0], 1e-5, width)


def test_dot_tiles_split_by_rows(width: str) -> None:
    """The int8 anchors' dot tile (schedule/int8.py dot_tile — bf16's vdpbf16ps tile is the same nest) splits the
    image's rows into one part per thread, outermost, like the float tile: the first half of its parallel loop
    stores only rows above those of the second half (a split by output-channel blocks stored every row in each
    half). Two 1×1 convs and a 3×3 one, 64 channels, 24×24 (whose row tiles divide in two at every width); outputs
    against onnxruntime's run of the same QDQ model (kiln.quantize) within one step of the last quantized activation."""
    r = np.random.default_rng(5)
    ws = {f"w{i}": (r.standard_normal(s) * 0.1).astype(np.float32)
          for i, s in enumerate([(64, 32, 1, 1), (64, 64, 3, 3), (64, 64, 1, 1)])}
    nodes = [helper.make_node("Conv", ["x", "w0"], ["a"]), helper.make_node("Relu", ["a"], ["ar"]),
             helper.make_node("Conv", ["ar", "w1"], ["b"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["b"], ["br"]),
             helper.make_node("Conv", ["br", "w2"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 32, 24, 24])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(w, n) for n, w in ws.items()])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    feeds = [{"x": r.standard_normal((1, 32, 24, 24)).astype(np.float32)} for _ in range(3)]
    qmodel = kiln.quantize(model, feeds)
    prog = lower(qmodel, resolve(width), 2, check_options({"amx": False}), stop_after="kernels").program
    anchors = 0
    for k in prog.kernels:
        if not k.name.endswith("qpackedconv"):
            continue
        par = [s for s in nest_stmts(k.body) if isinstance(s, Loop) and s.kind == "parallel"][-1]  # the tile's
        stores = [s for s in nest_stmts(par.body) if isinstance(s, Store)]  # (a padded copy's: its own nest)
        assert stores, (k.name, str(k))
        row = stores[0].index[2]  # [N, C/cb, H, W, cb]; every loop but the parallel one at its first iteration
        first = {v: Const(0, "int64") for v in walk(row) if isinstance(v, Var) and v != par.var}
        rows = np.array([value_at(substitute(row, {**first, par.var: Const(f, "int64")}), {})
                         for f in range(int(par.extent.value))])
        half = len(rows) // 2
        assert rows[:half].max() <= rows[half:].min(), (k.name, sorted(set(rows[:half])), sorted(set(rows[half:])))
        anchors += 1
    assert anchors == 3, [k.name for k in prog.kernels]
    if width_runs(width):
        got = kiln.compile(qmodel, target=width, num_threads=2, cache=False).run(feeds[0])[0]
        want = run_ort(qmodel, feeds[0])[0]
        step = last_step(qmodel)
        assert np.abs(got - want).max() <= step * (1 + 1e-6), (np.abs(got - want).max(), step)
