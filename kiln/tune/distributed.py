"""Where candidates are compiled: Ray (the default), or this process.

Compilation — scheduling, code generation and LLVM -O3 of one candidate kernel — is CPU-bound and independent
per candidate, so it fans out: `RayPool` submits one task per candidate to a Ray cluster, `ray.init()` on this
machine by default (127.0.0.1, no dashboard), or an existing cluster with `address="HOST:PORT"` (`kiln tune
--ray-address`), whose workers get this Kiln as a runtime-environment module. The kernel of a workload is put in
Ray's object store once and shared by its candidates' tasks. The target is passed explicitly, so a worker on
another x86 machine compiles for *this* machine's target.

Measurement never runs here: it stays on the machine being tuned, one candidate at a time (tune/measure.py),
and a compile batch finishes before its candidates are timed — on two cores, compiling beside a measurement
would corrupt it.

`LocalPool` compiles in this process, one candidate after another (tests, or `compile_workers="local"`)."""
from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from kiln.kernel.ir import Kernel
from kiln.target import Target
from kiln.tune.measure import Built, build_candidate


class LocalPool:
    name = "local"

    def build_jobs(self, jobs: Sequence[tuple[str, Kernel, dict[str, Any]]], target: Target, threads: int,
                   options: dict[str, bool]) -> list[Built]:
        return [build_candidate(kernel, target, threads, options, c) for _, kernel, c in jobs]

    def build(self, key: str, kernel: Kernel, target: Target, threads: int, options: dict[str, bool],
              configs: Sequence[dict[str, Any]]) -> list[Built]:
        return self.build_jobs([(key, kernel, c) for c in configs], target, threads, options)

    def close(self) -> None:
        pass


def _kiln_root() -> str:
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class RayPool:
    """Candidates compiled as Ray tasks (see the module doc)."""

    name = "ray"

    def __init__(self, address: str | None = None, num_cpus: int | None = None):
        import ray

        self.ray = ray
        self.started_here = False
        if not ray.is_initialized():
            if address:
                # another machine's workers import this Kiln from the uploaded package (the kiln directory)
                ray.init(address=address, log_to_driver=False, configure_logging=False,
                         runtime_env={"py_modules": [os.path.join(_kiln_root(), "kiln")]})
            else:
                os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
                ray.init(num_cpus=num_cpus or os.cpu_count(), include_dashboard=False, log_to_driver=False,
                         configure_logging=False, _node_ip_address="127.0.0.1",
                         runtime_env={"env_vars": {"PYTHONPATH": _kiln_root()}})
            self.started_here = True
        self._task = ray.remote(num_cpus=1, max_retries=0)(_build_task)
        self._kernels: dict[str, Any] = {}

    def build_jobs(self, jobs: Sequence[tuple[str, Kernel, dict[str, Any]]], target: Target, threads: int,
                   options: dict[str, bool]) -> list[Built]:
        """Build (workload key, kernel, config) jobs in parallel; results in order."""
        futures = []
        for key, kernel, c in jobs:
            ref = self._kernels.get(key)
            if ref is None:
                ref = self._kernels[key] = self.ray.put(kernel)
            futures.append(self._task.remote(ref, target, threads, options, c))
        out = []
        for (_, _, c), f in zip(jobs, futures):
            try:
                out.append(self.ray.get(f))
            except Exception as e:  # a worker that died compiling (LLVM abort): that candidate failed
                out.append(Built(dict(c), status="error", detail=f"compile task: {type(e).__name__}: {e}"[:500]))
        return out

    def build(self, key: str, kernel: Kernel, target: Target, threads: int, options: dict[str, bool],
              configs: Sequence[dict[str, Any]]) -> list[Built]:
        return self.build_jobs([(key, kernel, c) for c in configs], target, threads, options)

    def nodes(self) -> int:
        return len([n for n in self.ray.nodes() if n.get("Alive")])

    def close(self) -> None:
        self._kernels.clear()
        if self.started_here:
            self.ray.shutdown()


def _build_task(kernel: Kernel, target: Target, threads: int, options: dict[str, bool],
                config: dict[str, Any]) -> Built:
    return build_candidate(kernel, target, threads, options, config)


def make_pool(workers: str = "ray", address: str | None = None) -> LocalPool | RayPool:
    """"ray" (a local Ray instance, or the cluster at `address`) or "local" (this process)."""
    if workers == "local" and not address:
        return LocalPool()
    if workers not in ("ray", "local"):
        raise ValueError(f"compile workers must be 'ray' or 'local', not {workers!r}")
    return RayPool(address)
