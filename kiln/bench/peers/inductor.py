"""TorchInductor peer: `torch.compile` of the translated module with weight freezing.

`torch._inductor.config.freezing = True` (patched in for the compiling call only) makes the weights
compile-time constants (constant folding, oneDNN weight prepacking for conv/linear); without it
inductor on CPU is slower than eager. Strategies:
"default" (mode=None) and "max-autotune" (also benchmarks GEMM templates; minutes of compile).
Compilation happens in prepare() with a first call under `torch.no_grad()` (freezing applies only
to inference graphs), so compile_s includes it.

Threads: as the torch peer, `torch.set_num_threads(threads)` before compile and before every run;
inductor's generated C++ runs on ATen's OpenMP pool and bakes the thread count of compile time into
its kernels, hence the call before compiling. Placement is left to libgomp and the OS.
"""
from __future__ import annotations

import numpy as np

from kiln.bench.peers.base import Peer, Runner, dist_version, try_import
from kiln.bench.peers.torch import module_and_inputs, outputs_to_numpy, set_threads
from kiln.bench.workload import Workload


class InductorPeer(Peer):
    name = "inductor"
    kinds = frozenset({"gemm", "conv", "network"})
    strategies = ("default", "max-autotune")
    requirement = "torch==2.13.0"
    approach = "compiler"

    def available(self) -> tuple[bool, str]:
        ok, why = try_import("torch", "torch._inductor.config", pip=self.requirement)
        if ok:
            import shutil

            if not (shutil.which("c++") or shutil.which("g++")):
                return False, "inductor needs a C++ compiler (apt-get install g++)"
        return ok, why

    def version(self) -> str:
        return dist_version("torch")

    def prepare(self, workload: Workload, threads: int, strategy: str = "default") -> Runner:
        strategy = self.check(workload, threads, strategy)
        import torch
        import torch._inductor.config as cfg

        set_threads(threads)
        gm, xs = module_and_inputs(workload)
        gm.eval()
        compiled = torch.compile(gm, mode=None if strategy == "default" else strategy, fullgraph=True)
        with cfg.patch(freezing=True), torch.no_grad():  # compilation happens at this first call
            compiled(*xs)

        def run() -> list[np.ndarray]:
            if torch.get_num_threads() != threads:
                torch.set_num_threads(threads)
            with torch.no_grad():
                return outputs_to_numpy(compiled(*xs))

        return run
