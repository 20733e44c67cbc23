"""TorchInductor peer: `torch.compile` of the translated module (a torch workload's own nn.Module) with weight
freezing.

`torch._inductor.config.freezing = True` (patched in for the compiling call only) makes the weights
compile-time constants (constant folding, oneDNN weight prepacking for conv/linear); without it
inductor on CPU is slower than eager. Strategies:
"default" (mode=None) and "max-autotune" (also benchmarks GEMM templates; minutes of compile).
Compilation happens in prepare() with a first call under `torch.no_grad()` (freezing applies only
to inference graphs), so compile_s includes it.

Precision int8 (`kiln bench --precision int8`): PyTorch's CPU int8 path, PT2E post-training quantization with
the X86 inductor quantizer (`torch.export` → `prepare_pt2e(X86InductorQuantizer)` with its default static config:
int8 activations per tensor, per-channel int8 weights → calibration runs → `convert_pt2e` → `torch.compile` with
freezing, which lowers the quantize/dequantize patterns into oneDNN int8 kernels). From torchao (where PT2E lives
since torch 2.8) or, when torchao is not installed, torch.ao.quantization.

Threads: as the torch peer, `torch.set_num_threads(threads)` before compile and before every run;
inductor's generated C++ runs on ATen's OpenMP pool and bakes the thread count of compile time into
its kernels, hence the call before compiling. Placement is left to libgomp and the OS.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from kiln.bench.peers.base import FeedRunner, Peer, Runner, dist_version, try_import
from kiln.bench.peers.torch import module_and_inputs, outputs_to_numpy, set_threads
from kiln.bench.workload import Workload


class InductorPeer(Peer):
    name = "inductor"
    kinds = frozenset({"gemm", "conv", "network", "torch"})
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

    precisions = ("fp32", "int8")

    def precision_available(self, precision: str) -> tuple[bool, str]:
        ok, why = super().precision_available(precision)
        if ok and precision == "int8":
            try:
                _pt2e()
            except ImportError as e:
                return False, f"no PT2E quantization ({e}); pip install torchao"
        return ok, why

    def prepare_precision(self, workload: Workload, threads: int, strategy: str, precision: str,
                          calibration: list[dict[str, np.ndarray]]) -> FeedRunner:
        strategy = self.check(workload, threads, strategy)
        import torch
        import torch._inductor.config as cfg

        from kiln.bench.peers._torch_ops import to_torch_module

        set_threads(threads)
        gm, names = to_torch_module(workload.build_model(), workload.inputs)
        gm.eval()

        def tensors(feeds: dict[str, np.ndarray]) -> list:
            return [torch.from_numpy(np.ascontiguousarray(feeds[n])) for n in names]

        xs = tensors(workload.inputs)
        module = gm
        if precision == "int8":
            prepare_pt2e, convert_pt2e, xiq = _pt2e()
            quantizer = xiq.X86InductorQuantizer()
            quantizer.set_global(xiq.get_default_x86_inductor_quantization_config())
            with torch.no_grad():
                prepared = prepare_pt2e(torch.export.export(gm, tuple(xs)).module(), quantizer)
                for feeds in calibration:
                    prepared(*tensors(feeds))
                module = convert_pt2e(prepared)
        compiled = torch.compile(module, mode=None if strategy == "default" else strategy)
        with cfg.patch(freezing=True), torch.no_grad():
            compiled(*xs)

        def run(feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
            if torch.get_num_threads() != threads:
                torch.set_num_threads(threads)
            with torch.no_grad():
                return outputs_to_numpy(compiled(*tensors(feeds)))

        return run

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


def _pt2e() -> tuple[Any, Any, Any]:
    """(prepare_pt2e, convert_pt2e, the x86_inductor_quantizer module): torchao's, else torch.ao's."""
    try:
        import torchao.quantization.pt2e.quantizer.x86_inductor_quantizer as xiq
        from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
    except ImportError:
        import torch.ao.quantization.quantizer.x86_inductor_quantizer as xiq
        from torch.ao.quantization.quantize_pt2e import convert_pt2e, prepare_pt2e
    return prepare_pt2e, convert_pt2e, xiq
