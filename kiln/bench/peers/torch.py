"""PyTorch eager peer: the ONNX model translated to an fx.GraphModule of aten ops and run eagerly (a torch
workload's own nn.Module as it is).

Translation (`_torch_ops.to_torch_module`) runs the shared ONNX interpreter once under `make_fx`, so
what runs is a straight list of aten calls with shapes resolved and weights as constant buffers: the
Python cost per op is that of any nn.Module forward. Runs under `torch.inference_mode()`.

Threads: `torch.set_num_threads(threads)` (ATen's OpenMP intra-op pool) before every run and
`torch.set_num_interop_threads(1)` once (only allowed before any inter-op work; ignored after).
oneDNN/MKL inside torch follow the OpenMP setting. Placement is left to libgomp and the OS.
Inputs are wrapped with `torch.from_numpy` once (no copy); outputs are returned with `.numpy()`.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from kiln.bench.peers.base import Peer, Runner, dist_version, try_import
from kiln.bench.workload import Workload


def set_threads(threads: int) -> None:
    """Fix ATen's intra-op threads (and inter-op to 1 when torch still allows it)."""
    import torch

    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:  # already set or inter-op work already started
        pass


def module_and_inputs(workload: Workload) -> tuple[Any, list[Any]]:
    """The module and the feeds as tensors in input order: a torch workload's own nn.Module, or the ONNX model
    translated into a GraphModule of aten ops."""
    import torch

    from kiln.bench.peers._torch_ops import to_torch_module

    if workload.build_torch is not None:
        module, _ = workload.build_torch()
        return module.eval(), [torch.from_numpy(np.ascontiguousarray(a)) for a in workload.inputs.values()]
    gm, names = to_torch_module(workload.build_model(), workload.inputs)
    return gm, [torch.from_numpy(np.ascontiguousarray(workload.inputs[n])) for n in names]


def outputs_to_numpy(outs: Any) -> list[np.ndarray]:
    return [o.numpy() for o in (outs if isinstance(outs, (tuple, list)) else [outs])]


class TorchPeer(Peer):
    name = "torch"
    kinds = frozenset({"gemm", "conv", "network", "torch"})
    requirement = "torch==2.13.0"
    approach = "runtime with vendor kernels"

    def available(self) -> tuple[bool, str]:
        return try_import("torch", "torch.fx.experimental.proxy_tensor", pip=self.requirement)

    def version(self) -> str:
        return dist_version("torch")

    def prepare(self, workload: Workload, threads: int, strategy: str = "default") -> Runner:
        self.check(workload, threads, strategy)
        import torch

        set_threads(threads)
        gm, xs = module_and_inputs(workload)
        gm.eval()

        def run() -> list[np.ndarray]:
            if torch.get_num_threads() != threads:
                torch.set_num_threads(threads)
            with torch.inference_mode():
                return outputs_to_numpy(gm(*xs))

        return run
