"""The host JIT's compile units (kiln/codegen/split.py): a model built as several objects over forked processes
computes exactly what the single module computes (and what onnxruntime computes), saves and loads as several
objects, and survives a worker that dies."""
from __future__ import annotations

import os

import numpy as np
import onnxruntime as ort
import pytest

import kiln
from kiln.codegen import split
from kiln.compiler import check_options, executable_of, lower
from kiln.runtime.executable import Executable
from kiln.target import host
from kiln.zoo import build, inputs


@pytest.fixture
def split_small(monkeypatch: pytest.MonkeyPatch) -> None:
    """Split even a model of a few kernels, over two processes."""
    monkeypatch.setattr(split, "MIN_KERNELS", 1)
    monkeypatch.setenv(split.JOBS_ENV, "2")


def _ort(name: str, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    return ort.InferenceSession(build(name).SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)


@pytest.mark.parametrize("name,strategy", [("mlp", "direct"), ("mlp", "ukernel"), ("gpt_decoder", "direct")])
def test_split_matches_one_module(split_small: None, name: str, strategy: str) -> None:
    tgt = host()
    one = lower(build(name), tgt, 2, check_options({}), strategy=strategy, jobs=1)
    many = lower(build(name), tgt, 2, check_options({}), strategy=strategy, jobs=2)
    assert len(one.objs) == 1 and len(many.objs) > 2, "the split path was not taken"  # entry + ≥ 2 units
    assert many.kernel_functions == one.kernel_functions and not many.llvm_ir
    feeds = inputs(name)
    a = executable_of(one, tgt, 2).run(feeds)
    b = executable_of(many, tgt, 2).run(feeds)
    for x, y, r in zip(a, b, _ort(name, feeds)):
        np.testing.assert_array_equal(x, y)
        np.testing.assert_allclose(y, r, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("jobs", [2, 3])
def test_units_share_the_work(jobs: int) -> None:
    """Each distinct kernel in exactly one unit, and the units' estimated work within one kernel of each other
    (largest first, to the lightest unit)."""
    prog = lower(build("resnet18"), host(), 2, check_options({}), stop_after="kernels").program
    distinct, _ = split.distinct_kernels(prog)
    units = split.split_kernels(prog, jobs)
    families = {split.family_key(prog.kernels[i]) for i in distinct}  # dealt whole (codegen/families.py)
    assert len(units) == min(len(families), jobs * split.UNITS_PER_JOB)
    assert sorted(i for u in units for i in u) == sorted(distinct)
    size = {i: split.KERNEL_OVERHEAD + split.emitted_size(prog.kernels[i]) for i in distinct}
    work = [sum(size[i] for i in u) for u in units]
    assert max(work) - min(work) <= max(size.values()), work


def test_multi_object_save_load_round_trip(split_small: None, tmp_path) -> None:  # noqa: ANN001
    exe = kiln.compile(build("mlp"), num_threads=2, cache=False)
    assert len(exe.objs) > 2
    feeds = inputs("mlp")
    path = str(tmp_path / "m.kiln")
    exe.save(path)
    loaded = kiln.load(path)
    assert loaded.objs == exe.objs
    np.testing.assert_array_equal(loaded.run(feeds)[0], exe.run(feeds)[0])


def test_cache_serves_split_build(split_small: None, tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path))
    cold = kiln.compile(build("mlp"), num_threads=2)
    warm = kiln.compile(build("mlp"), num_threads=2)
    assert not cold.cached and warm.cached and len(warm.objs) == len(cold.objs) > 2
    feeds = inputs("mlp")
    np.testing.assert_array_equal(warm.run(feeds)[0], cold.run(feeds)[0])


def test_format_2_single_object_still_loads(tmp_path) -> None:  # noqa: ANN001
    """A file saved before compile units (format 2: one `module.o`, no object list) loads and runs."""
    import json
    import zipfile

    exe = kiln.compile(build("mlp"), num_threads=2, cache=False)
    path = str(tmp_path / "old.kiln")
    meta = {**exe.meta, "format": 2, "target_key": exe.target.key}
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("meta.json", json.dumps(meta))
        z.writestr("module.o", exe.objs[0] if len(exe.objs) == 1 else lower(
            build("mlp"), host(), 2, check_options({}), jobs=1).obj)
        z.writestr("weights.bin", exe._weights.tobytes())
    feeds = inputs("mlp")
    np.testing.assert_allclose(Executable.load(path).run(feeds)[0], exe.run(feeds)[0], rtol=1e-6, atol=1e-6)


def test_a_dead_worker_units_are_rebuilt(split_small: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker that dies (an LLVM abort, the OOM killer) loses only time: this process builds its units."""
    parent, real = os.getpid(), split.build_unit_text

    def dies_in_child(*args, **kw):  # noqa: ANN002, ANN003, ANN202
        if os.getpid() != parent:
            os._exit(9)
        return real(*args, **kw)

    monkeypatch.setattr(split, "build_unit_text", dies_in_child)
    c = lower(build("mlp"), host(), 2, check_options({}), jobs=2)
    assert len(c.objs) > 2
    feeds = inputs("mlp")
    np.testing.assert_allclose(executable_of(c, host(), 2).run(feeds)[0], _ort("mlp", feeds)[0], rtol=1e-4,
                               atol=1e-4)


def test_an_error_here_stops_the_workers(split_small: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """An error in this process's share surfaces as itself, and leaves no worker behind."""
    def broken(*args, **kw):  # noqa: ANN002, ANN003, ANN202
        raise RuntimeError("codegen broke")

    pids, fork = [], split.jit.fork

    def recorded() -> int:
        pid = fork()
        pids.append(pid)
        return pid

    monkeypatch.setattr(split, "build_module_text", broken)
    monkeypatch.setattr(split.jit, "fork", recorded)
    with pytest.raises(RuntimeError, match="codegen broke"):
        lower(build("mlp"), host(), 2, check_options({}), jobs=2)
    assert pids
    for pid in pids:
        with pytest.raises(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)  # stopped and reaped


def test_fork_waits_for_a_thread_inside_llvmlite() -> None:
    """A thread holding llvmlite's own lock (inside a binding call) when the compile units fork: jit.fork waits for
    it, so the child's first LLVM call does not hang on a copy of the lock that no thread of the child will release
    (CI hung so once). Without the wait the child below never exits."""
    import threading
    import time

    import llvmlite.binding as llvm

    from kiln.codegen import jit
    held, release = threading.Event(), threading.Event()

    def inside_llvmlite() -> None:
        with llvm.ffi.lib._lock:
            held.set()
            release.wait(10)
    t = threading.Thread(target=inside_llvmlite)
    t.start()
    held.wait(10)
    threading.Timer(0.3, release.set).start()
    pid = jit.fork()
    if pid == 0:
        try:
            llvm.Target.from_triple(host().triple)  # takes llvmlite's lock
        finally:
            os._exit(0)
    t.join(10)
    deadline = time.monotonic() + 20
    while (done := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    if done[0] == 0:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
    assert done[0] == pid and os.waitstatus_to_exitcode(done[1]) == 0, "the forked child hung in llvmlite"
