"""NumPy's BLAS on one thread while the zoo calibrates a model's weights (kiln/zoo/calib.py's matmuls).

A multi-threaded OpenBLAS call leaves its helper thread spinning on the other core for a while after it returns — the
core Kiln's pool worker is pinned to (runtime/threadpool.py). The first runs after loading a model from the cache
then stalled: a kernel waited 4 ms (one scheduler tick) for the chunk the descheduled worker held (mobilenetv2: 6 ms
runs among 1.8 ms ones, two to four of the first ten). Not around `kiln.compile`: a compile that forks its LLVM
workers shuts OpenBLAS's threads down (its fork handler), and restoring the thread count afterwards started a fresh
spinning one right before the first runs (the same stalls, every other run)."""
from __future__ import annotations

import contextlib
from collections.abc import Iterator


@contextlib.contextmanager
def one_blas_thread() -> Iterator[None]:
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=1, user_api="blas"):
        yield
