"""Kiln's thread pool under concurrent callers: two executables run at once from two Python threads
(ctypes releases the GIL), repeatedly, and every result stays exact."""
from __future__ import annotations

import os
import subprocess
import sys
import threading

import numpy as np
import pytest

import kiln
from kiln import zoo


def test_two_models_in_parallel_threads_stay_correct() -> None:
    names = ["conv_dw", "gemm_odd"]
    exes = {n: kiln.compile(zoo.build(n), num_threads=2, cache=False) for n in names}
    feeds = {n: zoo.inputs(n) for n in names}
    refs = {n: exes[n].run(feeds[n])[0] for n in names}
    errors: list[str] = []

    def hammer(n: str) -> None:
        for _ in range(200):
            out = exes[n].run(feeds[n])[0]
            if not np.array_equal(out, refs[n]):
                errors.append(n)
                return

    threads = [threading.Thread(target=hammer, args=(n,)) for n in names for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a run hung"
    assert not errors, f"results changed under concurrency: {errors}"


def test_more_threads_than_cores_and_then_fewer() -> None:
    model, feeds = zoo.build("conv_r50_3x3"), zoo.inputs("conv_r50_3x3")
    ref = kiln.compile(model, num_threads=1, cache=False).run(feeds)[0]
    for threads in (4, 2, 1, 3):
        out = kiln.compile(model, num_threads=threads, cache=False).run(feeds)[0]
        np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)


def test_pool_stack_slots_are_allocated_once_per_function() -> None:
    """Every alloca of the pool's functions sits in the entry block. One in the worker's endless wait loop was
    taken again for every job: 16 bytes of the worker's stack per parallel loop, never freed, until after about
    half a million parallel loops (a few thousand BERT runs) the worker's 8 MiB stack ran out inside a kernel."""
    from llvmlite import binding as llvm

    from kiln.codegen.module import opaque_pointers
    from kiln.runtime.threadpool import build_module

    with opaque_pointers():
        mod = llvm.parse_assembly(str(build_module()))
    seen = 0
    for fn in mod.functions:
        for i, block in enumerate(fn.blocks):
            allocas = [ins for ins in block.instructions if ins.opcode == "alloca"]
            seen += len(allocas)
            assert i == 0 or not allocas, f"{fn.name}: alloca in block {block.name!r}, not the entry block"
    assert seen >= 4  # the worker's pin mask, its seen/spin counters, kiln_parallel's thread id


def _matmul_chain(n: int, d: int = 64):  # noqa: ANN202 - (model, feeds): n MatMul kernels, each a parallel loop
    from onnx import TensorProto, helper, numpy_helper

    r = np.random.default_rng(0)
    ws = [numpy_helper.from_array((r.standard_normal((d, d)) * 0.1).astype(np.float32), f"w{i}") for i in range(n)]
    nodes = [helper.make_node("MatMul", [f"h{i}" if i else "x", f"w{i}"], [f"h{i + 1}"]) for i in range(n)]
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [d, d])],
                              [helper.make_tensor_value_info(f"h{n}", TensorProto.FLOAT, [d, d])], ws)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), \
        {"x": r.standard_normal((d, d)).astype(np.float32)}


def test_a_million_parallel_loops_on_one_worker() -> None:
    """The leak above, end to end: twice as many parallel loops as it took to exhaust the worker's stack (the
    old pool crashed this test about halfway)."""
    model, feeds = _matmul_chain(64)
    exe = kiln.compile(model, num_threads=2, cache=False)
    ref = exe.run(feeds)[0]
    for _ in range(1_100_000 // 64):
        exe.run(feeds)
    assert np.array_equal(exe.run(feeds)[0], ref)


def test_the_pool_object_is_cached_and_a_damaged_one_rebuilt(tmp_path) -> None:  # noqa: ANN001
    """A process JITs the pool once into the cache directory; the next one loads it; a damaged file is compiled
    again and rewritten, and the model still runs correctly."""
    import glob
    import hashlib
    import os
    import subprocess
    import sys

    script = ("import numpy as np, kiln; from kiln import zoo\n"
              "m, f = zoo.build('gemm_odd'), zoo.inputs('gemm_odd')\n"
              "a = kiln.compile(m, num_threads=2, cache=False).run(f)[0]\n"
              "b = kiln.compile(m, num_threads=1, cache=False).run(f)[0]\n"
              "assert np.allclose(a, b, rtol=1e-5, atol=1e-5), abs(a - b).max()\n")
    env = {**os.environ, "KILN_CACHE_DIR": str(tmp_path)}
    for damage in (False, False, True):
        if damage:
            for p in glob.glob(str(tmp_path / "threadpool-*.o")):
                with open(p, "r+b") as f:
                    f.write(b"\0" * 64)
        r = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        (path,) = glob.glob(str(tmp_path / "threadpool-*.o"))
        with open(path, "rb") as f:
            digest, obj = f.read(32), f.read()
        assert hashlib.sha256(obj).digest() == digest  # (after the damage: rebuilt and rewritten)


def test_each_chunk_runs_once_and_threads_start_on_their_own_segments() -> None:
    """kiln_parallel hands participant p the p-th contiguous segment of the chunks first and lets it steal the others'
    from their back: every chunk runs exactly once for any chunk and thread count; and with chunks that take a while,
    the caller runs the first chunks and the worker the first of the second half (so a thread computes the same part
    of an image in every layer, schedule/tile.py `image_thread_parts`)."""
    import ctypes
    import time

    from kiln.runtime.threadpool import PARALLEL_T, pool_address

    parallel = PARALLEL_T(pool_address())
    chunk_fn = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64)
    for threads in (1, 2, 3, 5, 2):
        for chunks in (0, 1, 2, 3, 7, 64, 257):
            ran: list[tuple[int, int]] = []
            lock = threading.Lock()

            def record(ctx: int, c: int, ran: list = ran, lock: threading.Lock = lock, slow: bool = chunks == 64) \
                    -> None:
                with lock:
                    ran.append((c, threading.get_ident()))
                if slow:
                    time.sleep(1e-3)
            fn = chunk_fn(record)
            parallel(ctypes.cast(fn, ctypes.c_void_p), None, chunks, threads)
            assert sorted(c for c, _ in ran) == list(range(chunks)), (threads, chunks)
            if threads == 2 and chunks == 64:
                by = dict(ran)
                assert by[0] == threading.get_ident() and by[32] != by[0], "segments not taken by their owners"


MOVES_OFF = r"""
import os, threading, time
import numpy as np
import kiln
from kiln import zoo

def pinned():  # this process's threads but the caller that may run on one CPU only: the pool's workers
    out = {}
    for tid in map(int, os.listdir("/proc/self/task")):
        if tid != threading.get_native_id():
            with open(f"/proc/self/task/{tid}/status") as f:
                allowed = next(line.split(":")[1].strip() for line in f if line.startswith("Cpus_allowed_list"))
            if allowed.isdigit():
                out[tid] = int(allowed)
    return out

os.sched_setaffinity(0, set(range(os.cpu_count())))  # (an earlier test may have left its parent on one CPU)
model, feeds = zoo.build("conv_dw"), zoo.inputs("conv_dw")
exe = kiln.compile(model, num_threads=2, cache=False)
ref = exe.run(feeds)[0]

def run_until(done, seconds=20.0):  # a worker starts, pins itself and joins jobs when the OS runs it: under load, later
    end = time.monotonic() + seconds
    while not done() and time.monotonic() < end:
        assert np.array_equal(exe.run(feeds)[0], ref)
    return done()

assert run_until(lambda: len(pinned()) == 1), pinned()
(cpu,) = pinned().values()  # one worker
mine = os.sched_getaffinity(0)
os.sched_setaffinity(0, {cpu})  # this thread onto the worker's CPU
moved = run_until(lambda: list(pinned().values()) != [cpu])
after = pinned()
os.sched_setaffinity(0, mine)
assert moved, (cpu, after)
print("moved", cpu, "->", list(after.values()))
"""


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity") or (os.cpu_count() or 1) < 2,
                    reason="pinning needs two CPUs")
def test_a_worker_pinned_to_the_callers_cpu_moves_off_it() -> None:
    """The pool pins its workers; the caller is the user's thread, not pinned, and the kernel may put it on a
    worker's CPU (after a compile it often did, for 4–6 runs at half speed). A worker that joins a job published from
    its own CPU moves to the caller's slot: with the caller held on the worker's CPU, the worker leaves it. In a
    fresh interpreter: one pool, one worker."""
    out = subprocess.run([sys.executable, "-c", MOVES_OFF], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and "moved" in out.stdout, out.stderr[-2000:]
