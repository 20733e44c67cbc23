"""XNNPACK peer, through ExecuTorch's XNNPACK delegate: the microkernel library behind mobile inference.

XNNPACK is a library of hand-written microkernels (GEMM, IGEMM convolution, depthwise, vector ops: one per ISA,
generated from templates, picked at run time by CPU features) under a small operator runtime. The packages that
ship it: ExecuTorch (`executorch`, whose wheel installs beside torch==2.13.0 without pulling another torch; its
XNNPACK is built into the pybindings) and LiteRT (`ai-edge-litert`, TFLite's interpreter with XNNPACK as its
default CPU delegate — but it reads .tflite models, and converting ONNX or torch to .tflite needs TensorFlow or
litert-torch). ExecuTorch is used: it lowers from torch.export, the path the torch peers already take.

Pipeline: the ONNX model → the torch peer's fx.GraphModule (`module_and_inputs`) → `torch.export` →
`to_edge_transform_and_lower(..., XnnpackPartitioner())` → an ExecuTorch program (in memory) → the runtime's
`forward`. Operators XNNPACK does not take stay in ExecuTorch's portable CPU kernels: `run.note` counts them,
so a row that is only partly XNNPACK says so.

Threads: ExecuTorch's process-wide pthreadpool, resized with `_unsafe_reset_threadpool(threads)` at prepare
(checked with `_threadpool_get_thread_count`); XNNPACK parallelizes each operator on it. Placement is the OS's.
"""
from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np

from kiln.bench.peers.base import Peer, PeerError, Runner, dist_version, try_import
from kiln.bench.workload import Workload

DELEGATE = "executorch_call_delegate"


def set_threads(threads: int) -> None:
    from executorch.extension.pybindings import portable_lib

    if portable_lib._threadpool_get_thread_count() != threads:
        portable_lib._unsafe_reset_threadpool(threads)
    got = portable_lib._threadpool_get_thread_count()
    if got != threads:
        raise PeerError(f"ExecuTorch's threadpool runs {got} threads, not {threads}")


def as_linear(gm: Any) -> Any:
    """addmm(b, x, t(W)) → linear(x, W, b) and mm(x, t(W)) → linear(x, W): the translated module is traced to aten,
    where F.linear became t + addmm, which the XNNPACK partitioner leaves to the portable kernels; linear (what an
    nn.Linear exports as) it takes."""
    import torch

    aten = torch.ops.aten
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target not in (aten.addmm.default, aten.mm.default):
            continue
        x, w = node.args[-2:]
        if node.kwargs or getattr(w, "target", None) not in (aten.t.default, aten.permute.default):
            continue
        bias = (node.args[0],) if node.target == aten.addmm.default else ()
        with gm.graph.inserting_before(node):
            node.replace_all_uses_with(gm.graph.call_function(aten.linear.default, (x, w.args[0], *bias)))
        gm.graph.erase_node(node)
    gm.graph.eliminate_dead_code()
    gm.recompile()
    return gm


def lower(workload: Workload) -> tuple[bytes, list, str]:
    """(ExecuTorch program bytes, the feeds as tensors, a note on what XNNPACK did not take)."""
    import torch
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower

    from kiln.bench.peers.torch import module_and_inputs

    gm, xs = module_and_inputs(workload)
    gm = as_linear(gm).eval()
    with torch.no_grad():
        exported = torch.export.export(gm, tuple(xs))
    edge = to_edge_transform_and_lower(exported, partitioner=[XnnpackPartitioner()])
    names = (getattr(n.target, "__name__", str(n.target)).split(".")
             for n in edge.exported_program().graph.nodes if n.op == "call_function")
    ops = Counter(parts[1] if parts[0] == "aten" and len(parts) > 1 else parts[0] for parts in names)
    delegated = ops.pop(DELEGATE, 0)
    ops.pop("getitem", None)
    rest = ", ".join(f"{k}×{v}" for k, v in ops.most_common())
    note = (f"{delegated} XNNPACK partition(s)" + (f"; outside XNNPACK (portable kernels): {rest}" if rest else ""))
    return edge.to_executorch().buffer, xs, note


class XnnpackPeer(Peer):
    name = "xnnpack"
    kinds = frozenset({"gemm", "conv", "network"})
    requirement = "executorch (its XNNPACK delegate; installs beside torch==2.13.0)"
    approach = "hand-written microkernels"

    def available(self) -> tuple[bool, str]:
        return try_import("torch", "executorch.runtime", "executorch.backends.xnnpack.partition.xnnpack_partitioner",
                          pip="executorch")

    def version(self) -> str:
        return f"executorch {dist_version('executorch')} (XNNPACK delegate)"

    def prepare(self, workload: Workload, threads: int, strategy: str = "default") -> Runner:
        self.check(workload, threads, strategy)
        from executorch.runtime import Runtime

        set_threads(threads)
        program_bytes, xs, note = lower(workload)
        program = Runtime.get().load_program(program_bytes)
        method = program.load_method("forward")

        def run() -> list[np.ndarray]:
            return [o.numpy() for o in method.execute(xs)]

        run.keepalive = (program, method, xs)  # type: ignore[attr-defined]
        run.note = note  # type: ignore[attr-defined]
        return run
