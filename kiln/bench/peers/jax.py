"""JAX/XLA peer: the ONNX model interpreted under `jax.jit` (see `_jax_ops`), compiled by XLA:CPU.

Threads: XLA:CPU sizes its intra-op (Eigen) thread pool once, when the CPU backend starts, from the
CPUs the process may run on; it has no thread-count option. So the first prepare() narrows the
calling thread's CPU affinity to `threads` CPUs, starts the backend, and restores the affinity (pool
threads keep the narrow mask; the count is what matters). The count is then fixed for the process:
a later prepare() with another count raises PeerError (measure it in a fresh process, or start it
under `taskset`). Placement within the mask is the OS's.
The feeds are put on the device once in prepare(); each run calls the jitted function, waits for it
and converts the outputs with `np.asarray`.
"""
from __future__ import annotations

import os

import numpy as np

from kiln.bench.peers.base import Peer, PeerError, Runner, dist_version, try_import
from kiln.bench.workload import Workload

_backend_threads: list[int] = []  # threads the XLA CPU pool was started with (empty until started)


def start_backend(threads: int) -> None:
    """Start XLA:CPU with a `threads`-wide pool, or check that it was started with that many."""
    import jax

    if not _backend_threads:
        from jax._src import xla_bridge

        already = bool(getattr(xla_bridge, "_backends", {}))
        old = os.sched_getaffinity(0)
        if already:
            _backend_threads.append(len(old))  # started by someone else: best guess is the current mask
        else:
            if threads > len(old):
                raise PeerError(f"threads={threads} but only {len(old)} CPUs are usable")
            os.sched_setaffinity(0, sorted(old)[:threads])
            try:
                jax.config.update("jax_platforms", "cpu")
                jax.devices("cpu")
            finally:
                os.sched_setaffinity(0, old)
            _backend_threads.append(threads)
    if _backend_threads[0] != threads:
        raise PeerError(f"XLA:CPU was started with {_backend_threads[0]} threads in this process; "
                        f"threads={threads} needs a fresh process")


class JaxPeer(Peer):
    name = "jax"
    kinds = frozenset({"gemm", "conv", "network"})
    requirement = "jax jaxlib"
    approach = "compiler"

    def available(self) -> tuple[bool, str]:
        return try_import("jax", "jaxlib", pip=self.requirement)

    def version(self) -> str:
        return f"jax {dist_version('jax')}, jaxlib {dist_version('jaxlib')}"

    def prepare(self, workload: Workload, threads: int, strategy: str = "default") -> Runner:
        self.check(workload, threads, strategy)
        start_backend(threads)
        import jax

        from kiln.bench.peers._jax_ops import to_jax_function

        fn, names = to_jax_function(workload.build_model())
        xs = [jax.device_put(np.ascontiguousarray(workload.inputs[n]), jax.devices("cpu")[0]) for n in names]
        jax.block_until_ready(fn(*xs))  # trace + XLA compile happen here, inside compile time

        def run() -> list[np.ndarray]:
            return [np.asarray(o) for o in jax.block_until_ready(fn(*xs))]

        return run
