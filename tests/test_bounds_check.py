"""The bounds-checking debug build (`kiln.compile(model, bounds_check=True)`, kiln/codegen/bounds.py).

Out-of-bounds accesses are made on purpose by shifting one buffer's index in a scheduled kernel (a wrapped
`schedule_kernel`, the way a schedule bug would); every access path is covered: scalar, contiguous vector
(masked tail and full), stride-2 wide load, gather, and the matching stores. The op tests run once more with
checks through `--bounds-check` / KILN_BOUNDS_CHECK=1 (tests/conftest.py)."""
from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

import kiln
import kiln.kernel.build
import kiln.schedule.default as default_schedule
from conftest import C, check, op_model, rand
from kiln.compiler import finish_cache_writes
from kiln.errors import BoundsError
from kiln.kernel.build import Program
from kiln.kernel.ir import Assign, Const, Expr, If, Kernel, Load, Local, Loop, Stmt, Store, substitute, walk


def _shift_last(index: tuple[Expr, ...], by: int) -> tuple[Expr, ...]:
    return index[:-1] + (index[-1] + Const(by, "int64"),)


def _exprs(stmts: list[Stmt]) -> list[Expr]:
    out: list[Expr] = []
    for s in stmts:
        if isinstance(s, Loop):
            out += [s.extent] + _exprs(s.body)
        elif isinstance(s, Store):
            out += list(s.index) + [s.value]
        elif isinstance(s, (Assign, Local)):
            out.append(s.value if isinstance(s, Assign) else s.init)
        elif isinstance(s, If):
            out += [s.cond] + _exprs(s.body) + _exprs(s.orelse)
    return out


def _rewrite(stmts: list[Stmt], fix: Callable[[Expr], Expr], store_buf: str | None, by: int) -> list[Stmt]:
    out: list[Stmt] = []
    for s in stmts:
        if isinstance(s, Loop):
            out.append(Loop(s.var, s.extent, _rewrite(s.body, fix, store_buf, by), s.kind, s.lanes, s.masked))
        elif isinstance(s, Store):
            index = _shift_last(s.index, by) if s.buf == store_buf else s.index
            out.append(Store(s.buf, tuple(fix(i) for i in index), fix(s.value)))
        elif isinstance(s, Assign):
            out.append(Assign(s.name, fix(s.value), s.slot))
        elif isinstance(s, Local):
            out.append(Local(s.name, s.dtype, fix(s.init), s.count))
        elif isinstance(s, If):
            out.append(If(fix(s.cond), _rewrite(s.body, fix, store_buf, by), _rewrite(s.orelse, fix, store_buf, by)))
        else:
            out.append(s)
    return out


def shift_index(monkeypatch: pytest.MonkeyPatch, value: str, by: int = 1, store: bool = False) -> None:
    """After scheduling, every load (or, with `store`, every store) of the buffer bound to graph value `value`
    uses index + `by` along its last (innermost) axis: an off-by-`by` schedule bug."""
    build, schedule = kiln.kernel.build.build_program, default_schedule.schedule_kernel
    local: dict[str, str] = {}  # kernel name → its buffer bound to `value`

    def build_and_remember(*args: object, **kw: object) -> Program:
        prog = build(*args, **kw)
        for k, names in zip(prog.kernels, prog.bindings):
            for buf, bound in zip(k.args, names):
                if bound == value:
                    local[k.name] = buf.name
        return prog

    def buggy(k: Kernel, *args: object, **kw: object) -> None:
        schedule(k, *args, **kw)
        buf = local.get(k.name)
        if buf is None:
            return
        loads = {x for e in _exprs(k.body) for x in walk(e) if isinstance(x, Load) and x.buf == buf}
        mapping: dict[Expr, Expr] = {} if store else {ld: Load(ld.buf, _shift_last(ld.index, by), ld.dtype)
                                                      for ld in loads}
        k.body = _rewrite(k.body, lambda e: substitute(e, mapping), buf if store else None, by)
    monkeypatch.setattr(kiln.kernel.build, "build_program", build_and_remember)
    monkeypatch.setattr(default_schedule, "schedule_kernel", buggy)


def add_model(shape: tuple[int, ...]) -> tuple[object, dict[str, np.ndarray]]:
    return op_model("Add", [rand(*shape, seed=1), rand(*shape, seed=2)])


def run_checked(model: object, feeds: dict[str, np.ndarray], **kw: object) -> BoundsError:
    exe = kiln.compile(model, num_threads=2, cache=False, bounds_check=True, **kw)
    with pytest.raises(BoundsError) as info:
        exe.run(feeds)
    return info.value


@pytest.mark.parametrize("shape, options", [
    ((3, 37), {}),                                   # vector main loop + masked tail
    ((3, 37), {"vectorize": False}),                 # scalar loads
    ((4, 64), {}),                                   # whole vectors, no tail
    ((256, 300), {}),                                # parallel over both threads
], ids=["masked-tail", "scalar", "full-vectors", "parallel"])
def test_off_by_one_load_is_caught(monkeypatch: pytest.MonkeyPatch, shape: tuple[int, ...], options: dict) -> None:
    model, feeds = add_model(shape)
    shift_index(monkeypatch, "x1", 1)
    err = run_checked(model, feeds, **options)
    size = int(np.prod(shape))
    assert (err.index, err.size, err.count) == (size, size, 1)
    assert "'x1'" in err.buffer and err.kernel.startswith("k")
    assert str(size) in str(err) and "x1" in str(err)


def test_skipped_load_reads_zero_and_the_rest_is_right(monkeypatch: pytest.MonkeyPatch) -> None:
    """The run finishes: in-bounds lanes computed as the (shifted) kernel says, the skipped lane read 0.0."""
    model, feeds = add_model((3, 37))
    shift_index(monkeypatch, "x1", 1)
    err = run_checked(model, feeds)
    x0, x1 = feeds["x0"].ravel(), feeds["x1"].ravel()
    want = x0 + np.append(x1[1:], np.float32(0))
    np.testing.assert_array_equal(err.outputs[0].ravel(), want)


def test_negative_index_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every element reads the one 5 before it: only the first vectors of the buffer leave it (lane 0 first)."""
    model, feeds = add_model((256, 300))
    shift_index(monkeypatch, "x0", -5)
    err = run_checked(model, feeds)
    from kiln.target import host
    vectors = -(-5 // host().lanes(32))   # those holding an index < 0: one of 8 or 16 lanes, two of 4 (SSE)
    assert (err.index, err.size, err.count) == (-5, 256 * 300, vectors) and "'x0'" in err.buffer


def test_racing_threads_record_one_violation_and_count_all(monkeypatch: pytest.MonkeyPatch) -> None:
    """Half the buffer reads before its start, on both threads at once: the first writer wins the record
    (a consistent index/size pair), every violating access is counted."""
    model, feeds = add_model((256, 300))
    size = 256 * 300
    shift_index(monkeypatch, "x0", -size // 2)
    for _ in range(3):
        err = run_checked(model, feeds)
        assert err.size == size and -size // 2 <= err.index < 0 and "'x0'" in err.buffer
        assert err.count >= size // 2 // 16


def test_off_by_one_store_is_caught_and_writes_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    model, feeds = add_model((3, 37))
    shift_index(monkeypatch, "add_node.0", 1, store=True)
    err = run_checked(model, feeds)
    assert (err.index, err.size) == (111, 111) and "'add_node.0'" in err.buffer


def test_scalar_store_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    model, feeds = add_model((3, 37))
    shift_index(monkeypatch, "add_node.0", 2, store=True)
    err = run_checked(model, feeds, vectorize=False)
    assert (err.index, err.size) == (111, 111) and "'add_node.0'" in err.buffer


def test_strided_load_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """x[2i]: a stride-2 wide load; reading x[2i + 2] leaves the buffer on the last lane."""
    x = rand(1, 2, 8, 64, seed=3)
    model, feeds = op_model("Slice", [x, C(np.array([0])), C(np.array([64])), C(np.array([3])), C(np.array([2]))])
    shift_index(monkeypatch, "x0", 2)
    err = run_checked(model, feeds)
    assert err.index == x.size and err.size == x.size and "'x0'" in err.buffer


def test_gather_load_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Transpose reads its input with a gather (lanes far apart) when vectorized along the output row."""
    x = rand(33, 40, seed=4)
    model, feeds = op_model("Transpose", [x], {"perm": [1, 0]})
    shift_index(monkeypatch, "x0", 1)
    err = run_checked(model, feeds)
    assert err.index == x.size and err.size == x.size and "'x0'" in err.buffer


def test_the_process_survives_and_clean_runs_stay_clean(monkeypatch: pytest.MonkeyPatch) -> None:
    model, feeds = add_model((3, 37))
    with monkeypatch.context() as m:
        shift_index(m, "x1", 1000)  # far past the end: unchecked, this could fault
        bad = kiln.compile(model, num_threads=2, cache=False, bounds_check=True)
    for _ in range(2):  # the record is cleared before every run
        with pytest.raises(BoundsError):
            bad.run(feeds)
    good = kiln.compile(model, num_threads=2, cache=False, bounds_check=True)
    for _ in range(2):
        (y,) = good.run(feeds)
        np.testing.assert_array_equal(y, feeds["x0"] + feeds["x1"])


@pytest.mark.parametrize("case", ["gemm", "conv", "pool", "softmax"])
def test_in_bounds_models_give_identical_outputs(case: str) -> None:
    if case == "gemm":
        model, feeds = op_model("MatMul", [rand(37, 29, seed=5), C(rand(29, 45, seed=6))])
    elif case == "conv":
        model, feeds = op_model("Conv", [rand(1, 5, 11, 13, seed=7), C(rand(7, 5, 3, 3, seed=8))],
                                {"pads": [1, 1, 1, 1], "strides": [2, 1]})
    elif case == "pool":  # regression: a masked stride-2 tail read one element past the padded input
        model, feeds = op_model("MaxPool", [rand(1, 3, 15, 17, seed=9)],
                                {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]})
    else:
        model, feeds = op_model("Softmax", [rand(5, 77, seed=10)], {"axis": -1})
    plain = kiln.compile(model, num_threads=2, cache=False).run(feeds)
    checked = check(model, feeds, 1e-4, bounds_check=True)
    for p, c in zip(plain, checked):
        np.testing.assert_array_equal(p, c)


def test_option_is_in_the_cache_key_the_meta_and_saved_files(tmp_path: object, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path))
    model, feeds = add_model((3, 37))
    plain = kiln.compile(model, num_threads=2)
    checked = kiln.compile(model, num_threads=2, bounds_check=True)
    assert plain.meta["bounds_check"] is False and checked.meta["bounds_check"] is True
    assert checked.meta["bounds_buffers"] and not plain.meta["bounds_buffers"]
    finish_cache_writes()
    assert len(list(tmp_path.iterdir())) == 2  # two cache entries, not one served for both
    assert kiln.compile(model, num_threads=2, bounds_check=True).meta["bounds_check"] is True  # from the cache
    path = str(tmp_path / "checked.kiln")
    checked.save(path)
    with monkeypatch.context() as m:
        shift_index(m, "x1", 1)
        buggy = kiln.compile(model, num_threads=2, cache=False, bounds_check=True)
    buggy.save(path)
    with pytest.raises(BoundsError):
        kiln.load(path).run(feeds)


def test_ir_without_the_option_has_no_checks() -> None:
    from kiln.compiler import lower
    from kiln.target import host

    model, _ = add_model((3, 37))
    plain = lower(model, host(), 2, {}, stop_after="llvm").llvm_ir
    checked = lower(model, host(), 2, {}, stop_after="llvm", bounds_check=True).llvm_ir
    assert "kiln.bounds" not in plain and "kiln_bounds_record" not in plain
    assert "kiln.bounds.report" in checked and "kiln_bounds_record" in checked


def test_cli_bounds_check(tmp_path: object, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    import onnx

    from kiln.cli import main

    model, _ = add_model((3, 37))
    path = str(tmp_path / "add.onnx")
    onnx.save(model, path)
    assert main(["run", path, "--bounds-check", "--no-cache", "--repeat", "1", "--threads", "2"]) == 0
    shift_index(monkeypatch, "x1", 1)
    assert main(["run", path, "--bounds-check", "--no-cache", "--repeat", "1", "--threads", "2"]) == 2
    err = capsys.readouterr().err
    assert "out-of-bounds" in err and "index 111" in err and "'x1'" in err
    assert main(["compile", path, "--bounds-check", "--no-cache", "-o", str(tmp_path / "add.kiln")]) == 0
    with pytest.raises(BoundsError):
        kiln.load(str(tmp_path / "add.kiln")).run(add_model((3, 37))[1])
