"""Kiln's thread pool under concurrent callers: two executables run at once from two Python threads
(ctypes releases the GIL), repeatedly, and every result stays exact."""
from __future__ import annotations

import threading

import numpy as np

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
