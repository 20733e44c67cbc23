"""NumPy's BLAS on one thread while the zoo calibrates a model's weights (kiln/zoo/calib.py's matmuls).

A multi-threaded OpenBLAS call leaves its helper thread spinning on the other core for a while after it returns — the
core Kiln's pool worker is pinned to (runtime/threadpool.py). The first runs after loading a model from the cache
then stalled: a kernel waited 4 ms (one scheduler tick) for the chunk the descheduled worker held (mobilenetv2: 6 ms
runs among 1.8 ms ones, two to four of the first ten). Not around `kiln.compile`: a compile that forks its LLVM
workers shuts OpenBLAS's threads down (its fork handler), and restoring the thread count afterwards started a fresh
spinning one right before the first runs (the same stalls, every other run)."""
from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator


@contextlib.contextmanager
def one_blas_thread() -> Iterator[None]:
    """NumPy's own BLAS only (the library in its wheel's `numpy.libs`): the BLAS that `strategy="library:…"` binds
    (kiln/library: scipy-openblas32, MKL) keeps the thread count Kiln set — a limit on every BLAS in the process
    restored MKL's to 2 behind the binding's back."""
    import numpy as np
    from threadpoolctl import ThreadpoolController

    home = os.path.realpath(os.path.dirname(np.__file__)) + ".libs"
    mine = [c for c in ThreadpoolController().select(user_api="blas").lib_controllers
            if os.path.dirname(os.path.realpath(c.filepath)) == home]
    before = [c.num_threads for c in mine]
    for c in mine:
        c.set_num_threads(1)
    try:
        yield
    finally:
        for c, n in zip(mine, before):
            c.set_num_threads(n)
