"""Tuning a model with symbolic dims once, for every size (issue 15, DietCode's way; kiln/tune/sizes.py): each
shape-generic kernel is measured at a distribution of sizes drawn from its bounds, its time their geometric mean,
its outputs checked at every size; the cost model is the f_MK × f_spatial split; kiln.compile applies the records
to the dynamic build, whose outputs match onnxruntime at every size (max|Δ| ≤ 1e-4 · max|ref|, as everywhere).

Budgets are trials and kernels tiny: these tests check behaviour, never speed (benchmarks/dynamic_report.py)."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper, numpy_helper

import kiln
from conftest import assert_close, run_ort, width_runs
from kiln import zoo
from kiln.cli import parse_bounds
from kiln.compiler import check_options, lower
from kiln.target import resolve
from kiln.tune.cost import FEATURES, LearnedModel, features_of, raw_sums, spearman
from kiln.tune.database import TuningDatabase
from kiln.tune.measure import Measurer, build_candidate, make_buffers
from kiln.tune.sizes import iterations_at, size_distribution, symbol_points
from kiln.tune.space import Space
from kiln.tune.tuner import kernels_of, tune
from kiln.tune.workload import definition, target_description, target_key, workloads_of

BOUNDS = {"rows": (1, 64)}
K, N = 64, 48


def dynamic_gemm(k: int = K, n: int = N) -> onnx.ModelProto:
    """y[rows, n] = relu(x[rows, k] @ w): one packed-weight GEMM over a run-time number of rows."""
    w = (np.random.default_rng(2).standard_normal((k, n)) * 0.2).astype(np.float32)
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["t"]), helper.make_node("Relu", ["t"], ["y"])],
                          "dyn_gemm", [helper.make_tensor_value_info("x", T.FLOAT, ["rows", k])],
                          [helper.make_tensor_value_info("y", T.FLOAT, ["rows", n])], [numpy_helper.from_array(w, "w")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def gemm_workload(target):  # noqa: ANN001, ANN201
    (w,) = [w for w in workloads_of(kernels_of(dynamic_gemm(), target, 2, {}, dynamic_bounds=BOUNDS))
            if w.klass == "matmul"]
    return w


def test_sizes_span_each_symbols_bounds() -> None:
    assert symbol_points(1, 512) == [1, 3, 8, 23, 64, 181, 512]
    assert symbol_points(1, 512, 5) == [1, 5, 23, 108, 512]
    assert symbol_points(1, 4) == [1, 2, 3, 4]
    assert symbol_points(7, 7) == [7]
    w = gemm_workload(resolve("host"))
    assert size_distribution(w.kernel) == [{"rows": r} for r in (1, 2, 4, 8, 16, 32, 64)]
    assert "sizes [{'rows': 1}" in definition(w.kernel)  # part of the signature: comparable measurements only
    # two symbols: the diagonal, and one long dim with the others short
    (attn,) = [w for w in workloads_of(kernels_of(zoo.build("gpt_decoder"), resolve("host"), 2, {},
                                                  dynamic_bounds={"batch": (1, 4), "seq": (1, 512)}))
               if len(size_distribution(w.kernel)) > 5][:1]
    sizes = size_distribution(attn.kernel)
    assert sizes[0] == {"batch": 1, "seq": 1} and {"batch": 4, "seq": 512} in sizes
    assert {"batch": 4, "seq": 1} in sizes and {"batch": 1, "seq": 512} in sizes
    # a kernel of constant extents has no distribution
    static = kernels_of(dynamic_gemm(), resolve("host"), 2, {}, input_shapes={"x": [8, K]})
    assert all(size_distribution(k) == [] for k in static)


def test_a_symbolic_kernel_is_measured_and_checked_at_every_size(width: str) -> None:
    """The child runs the kernel at each size of its distribution (its module's dims array set to it): each size's
    outputs are relu(x[:m] @ w) in the first m rows — and the seeded fill beyond them (nothing written past the
    run-time extent) —, one median per size, the time their geometric mean."""
    t = resolve(width)
    w = gemm_workload(t)
    built = build_candidate(w.kernel, t, 2, {}, {})
    assert built.status == "ok" and built.obj[:4] == b"\x7fELF"
    sizes = [m["rows"] for m in size_distribution(w.kernel)]
    assert [v for (_, v), in built.sizes] == sizes
    if not width_runs(width):
        return  # emitted for the width; this CPU cannot run it
    with Measurer() as meas:
        r = meas.measure(built, t, 2)
    assert r.status == "ok" and len(r.samples) == len(sizes)
    assert r.seconds == pytest.approx(float(np.exp(np.mean(np.log(r.samples)))))
    bufs = dict(zip([b[0] for b in built.buffers], make_buffers(built.buffers, 0)))
    (out_name,) = {b[0] for b in built.buffers if b[3] == "out"}
    (x,) = [bufs[b.name].reshape(b.shape) for b in w.kernel.args if b.name != out_name and len(b.shape) == 2]
    (panels,) = [bufs[b.name].reshape(b.shape) for b in w.kernel.args if len(b.shape) == 3]
    from kiln.graph.passes.pack_weights import unpack
    want = np.maximum(x @ unpack(panels, N), 0)
    fill = bufs[out_name].reshape(64, N)
    for i, m in enumerate(sizes):
        got = r.outputs[f"{out_name}@{i}"]
        np.testing.assert_allclose(got[:m], want[:m], rtol=1e-4, atol=1e-4)
        np.testing.assert_array_equal(got[m:], fill[m:])


def test_tune_a_symbolic_model_once_then_compile_it_with_its_records(width: str, tmp_path) -> None:
    """`tune(dynamic_bounds=…)`: the shape-generic kernels are tuned (every measurement has one time per size);
    a record (another full tile) is applied by kiln.compile to the dynamic build,
    which then matches onnxruntime at every size."""
    model, path = dynamic_gemm(), str(tmp_path / "d.db")
    t = resolve(width)
    w = gemm_workload(t)
    sizes = size_distribution(w.kernel)
    if width_runs(width):
        report = tune(model, budget_s=60, db=path, per_kernel_s=60, target=width, workers="local", progress=False,
                      max_trials=4, verify=False, dynamic_bounds=BOUNDS)
        (res,) = [r for r in report.results if r.klass == "matmul"]
        assert res.trials == 4 and res.statuses.get("ok", 0) >= 2, res.statuses
        db = TuningDatabase(path, create=False)
        rows = [m for m in db.measurements(w.sig) if m.status == "ok"]
        assert rows and all(len(m.samples) == len(sizes) for m in rows)
        assert w.sig in db.symbolic_sigs()
        db.close()
    # a record that is not the default (a shorter register tile), written as the best: applied, and correct
    space = Space(w.kernel, t, 2, {})
    mr = space.knobs["0:mr"]
    other = next(v for v in mr.domain if v != mr.default and v >= 4)
    cfg = space.realize({**space.default, "0:mr": other}).config
    assert cfg["0:mr"] == other
    db = TuningDatabase(str(tmp_path / "r.db"))
    tkey = target_key(t, 2)
    db.add_target(tkey, target_description(t, 2))
    db.add_workload(w.sig, w.klass, definition(w.kernel), w.flops)
    db.set_best(w.sig, tkey, cfg, 1e-3, 2e-3)
    db.close()
    if not width_runs(width):
        c = lower(model, t, 2, check_options({}), tuning=TuningDatabase(str(tmp_path / "r.db"), create=False),
                  dynamic_bounds=BOUNDS)
        assert c.obj[:4] == b"\x7fELF" and c.tuned
        return
    exe = kiln.compile(model, target=width, num_threads=2, cache=False, tuning=str(tmp_path / "r.db"),
                       dynamic_bounds=BOUNDS)
    assert exe.meta["compilations"] == 1 and [v["config"]["0:mr"] for v in exe.meta["tuned"].values()] == [other]
    for m in (1, 3, 17, 64):
        feeds = {"x": np.random.default_rng(m).standard_normal((m, K)).astype(np.float32)}
        (got,), (want,) = exe.run(feeds), run_ort(model, feeds)
        assert got.shape == (m, N)
        assert_close(got, want, 1e-4, f"rows={m}")


def test_step_5_compares_a_symbolic_model_at_sizes_across_its_bounds(tmp_path) -> None:
    """A record with one-row register tiles (one broadcast per FMA: as fast at one row, several times slower at
    many) written as the best of a symbolic GEMM: step 5 compares the model at sizes across its bounds, the geometric
    mean of the ratios is slower, the record goes back to the default, and the model compiles without it."""
    from kiln.tune.database import Measurement
    from kiln.tune.verify import model_builder, model_sizes, verify_in_model
    model, bounds, t = dynamic_gemm(512, 256), {"rows": (1, 192)}, resolve("host")
    (w,) = [w for w in workloads_of(kernels_of(model, t, 2, {}, dynamic_bounds=bounds)) if w.klass == "matmul"]
    space = Space(w.kernel, t, 2, {})
    path, tkey = str(tmp_path / "v.db"), target_key(t, 2)
    db = TuningDatabase(path)
    db.add_target(tkey, target_description(t, 2))
    db.add_workload(w.sig, w.klass, definition(w.kernel), w.flops)
    db.set_best(w.sig, tkey, space.realize({**space.default, "0:mr": 1}).config, 1e-3, 2e-3)
    db.add(Measurement(w.sig, tkey, space.default, "ok", 1e-3, is_default=True))
    build = model_builder(model, target="host", num_threads=2, dynamic_bounds=bounds)
    assert build(path).meta["tuned"], "the one-row record should apply before step 5"
    assert model_sizes(build("off")) == [{"rows": r} for r in (1, 6, 33, 192)]
    res = verify_in_model(build, db, tkey, "test")
    assert res.states.startswith("sizes rows 1: ") and res.states.count(": ") == 4, res.states
    assert res.first_tuned_s > res.default_s * 1.01 and res.reverted == [w.sig], res.line()
    assert db.best(w.sig, tkey).config == space.default
    exe = build(path)
    assert not exe.meta["tuned"]
    feeds = {"x": np.random.default_rng(0).standard_normal((50, 512)).astype(np.float32)}
    assert_close(exe.run(feeds)[0], run_ort(model, feeds)[0], 1e-4, "y")
    db.close()


def test_features_of_a_symbolic_kernel_follow_its_regime_dispatch() -> None:
    """The cost model walks the kernel at each size: the run-time branches taken there (a 1-row tail tile for one
    row, not the full tile's 8 rows of FMAs; a tail weighed by its share of the row blocks), and the lanes a partial
    tile wastes there, which `log_spatial` — the analytic f_spatial — averages over the sizes."""
    from kiln.schedule.config import Decisions
    from kiln.schedule.default import schedule_kernel
    from kiln.tune.workload import fresh
    t = resolve("avx512")
    w = gemm_workload(t)

    def scheduled(config: dict):  # noqa: ANN202
        k = fresh(w.kernel)
        schedule_kernel(k, t, 2, {}, Decisions(config))
        return k
    k = scheduled({})
    one = raw_sums(k, t, 2, {"rows": 1})["slots"] / iterations_at(k, {"rows": 1})
    full = raw_sums(k, t, 2, {})["slots"] / iterations_at(k, {})
    assert one < 2 * full, (one, full)  # the 1-row tail tile, not the 8-row tile for one row
    # the last row block on its tail tile, weighed by its share of the row blocks: 6-row tiles (tails of 4, 3 and 1
    # rows) waste no row at 64 rows (10 whole tiles and the 4-row tail), 1 of 3 at 2 rows (the 3-row tail), and 1 of
    # 6 at 5 rows (the 6-row tile clamped)
    six = scheduled({"0:mr": 6})
    per_row = {m: raw_sums(six, t, 2, {"rows": m})["slots"] / iterations_at(six, {"rows": m}) for m in (2, 5, 64)}
    assert per_row[2] / per_row[64] == pytest.approx(3 / 2, rel=0.1), per_row
    assert per_row[5] / per_row[64] == pytest.approx(6 / 5, rel=0.1), per_row
    spatial = FEATURES.index("log_spatial")
    assert features_of(scheduled({"0:mr": 3}), t, 2)[spatial] > 0.01  # 2 of 8, 23, 64 … rows on 3-row tiles waste


def test_split_cost_model_learns_the_micro_kernel_and_adds_the_spatial_part() -> None:
    """LearnedModel(split=True): trained where log time = f(micro-kernel features) + log_spatial, it ranks unseen
    candidates of both parts; untrained, it ranks by the analytic estimate. Rows recorded before log_spatial
    existed (one feature fewer) train it as kernels of constant extents."""
    rng = np.random.default_rng(0)
    spatial = FEATURES.index("log_spatial")

    def group(n: int) -> tuple[list, list]:
        f = rng.random((n, len(FEATURES)))
        f[:, spatial] = rng.random(n) * 1.5
        secs = np.exp(2 * f[:, 3] - f[:, 7] + f[:, spatial] + 0.05 * rng.standard_normal(n))
        return f.tolist(), secs.tolist()
    m = LearnedModel(split=True)
    old = [(list(r[:-1]) for r in rng.random((10, len(FEATURES))).tolist()), list(np.exp(rng.random(10)))]
    assert m.fit([group(40) for _ in range(4)] + [([list(x) for x in old[0]], old[1])])
    f, secs = group(60)
    assert spearman(-m.score(f), secs) > 0.8
    analytic = np.asarray(f)[:, FEATURES.index("log_analytic")]
    assert np.array_equal(LearnedModel(split=True).score(f), -analytic.astype(np.float32))


def test_bounds_flag() -> None:
    assert parse_bounds("batch=1:4,seq=1:512") == {"batch": (1, 4), "seq": (1, 512)}
    assert parse_bounds(None) is None
    with pytest.raises(ValueError, match="NAME=LO:HI"):
        parse_bounds("seq=512")


def batched_gemm() -> onnx.ModelProto:
    """y[batch, seq, 48] = x[batch, seq, 64] @ w + b: row blocks (batch entries) that are not one affine axis."""
    r = np.random.default_rng(3)
    w, b = (r.standard_normal((K, N)) * 0.2).astype(np.float32), r.standard_normal(N).astype(np.float32)
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["t"]), helper.make_node("Add", ["t", "b"], ["y"])],
                          "batched", [helper.make_tensor_value_info("x", T.FLOAT, ["batch", "seq", K])],
                          [helper.make_tensor_value_info("y", T.FLOAT, ["batch", "seq", N])],
                          [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@pytest.mark.parametrize("eighths,rows", [(0, 3), (1 << 20, 1 << 20), (1 << 20, 3)])
def test_row_blocks_in_either_order_at_run_time(width: str, eighths: int, rows: int, tmp_path) -> None:
    """Over several run-time row blocks the tile loop runs the weight panels outermost while the rows of every batch
    entry fit in L2 — and, for weights that fit in L2, while each entry has at most `panel_outer_rows` rows —, else
    the batch entries outermost (one flattened loop, its indices decoded by a run-time select). The knobs force
    either (panel_outer_l2 0: always batch entries; both 1<<20: always panels) or leave it to the rows (1<<20, 3):
    each matches onnxruntime at every size."""
    model, bounds, t = batched_gemm(), {"batch": (1, 4), "seq": (1, 64)}, resolve(width)
    (w,) = [w for w in workloads_of(kernels_of(model, t, 2, {}, dynamic_bounds=bounds)) if w.klass == "matmul"]
    space = Space(w.kernel, t, 2, {})
    assert space.knobs["0:panel_outer_l2"].default == 4 and space.knobs["0:panel_outer_rows"].default == 3
    cfg = space.realize({**space.default, "0:panel_outer_l2": eighths, "0:panel_outer_rows": rows}).config
    path, tkey = str(tmp_path / "o.db"), target_key(t, 2)
    db = TuningDatabase(path)
    db.add_target(tkey, target_description(t, 2))
    db.add_workload(w.sig, w.klass, definition(w.kernel), w.flops)
    db.set_best(w.sig, tkey, cfg, 1e-3, 2e-3)
    db.close()
    if not width_runs(width):
        c = lower(model, t, 2, check_options({}), tuning=TuningDatabase(path, create=False), dynamic_bounds=bounds)
        assert c.obj[:4] == b"\x7fELF" and c.tuned
        return
    exe = kiln.compile(model, target=width, num_threads=2, cache=False, tuning=path, dynamic_bounds=bounds)
    assert [(v["config"]["0:panel_outer_l2"], v["config"]["0:panel_outer_rows"])
            for v in exe.meta["tuned"].values()] == [(eighths, rows)]
    for b, s in ((1, 1), (3, 17), (4, 64), (2, 5)):
        feeds = {"x": np.random.default_rng(b * s).standard_normal((b, s, K)).astype(np.float32)}
        (got,), (want,) = exe.run(feeds), run_ort(model, feeds)
        assert_close(got, want, 1e-4, f"{b}x{s}")
