"""ONNX Runtime peer: an InferenceSession on the CPU execution provider, all graph optimizations on.

Threads: `intra_op_num_threads = threads` (ORT's own pool; the calling thread counts as one of them),
`inter_op_num_threads = 1`, sequential execution mode. Spinning is left at ORT's default (on), thread
placement to the OS. Inputs are passed as the workload's numpy arrays (ORT reads them without copy).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from kiln.bench.peers.base import FeedRunner, Peer, PeerError, Runner, dist_version, try_import
from kiln.bench.workload import Workload


class OnnxRuntimePeer(Peer):
    name = "onnxruntime"
    kinds = frozenset({"gemm", "conv", "network"})
    requirement = "onnxruntime"
    approach = "runtime with vendor kernels"

    def available(self) -> tuple[bool, str]:
        return try_import("onnxruntime", pip=self.requirement)

    def version(self) -> str:
        return dist_version("onnxruntime", "onnxruntime-openvino", "ort-nightly")

    precisions = ("fp32", "int8")

    def prepare(self, workload: Workload, threads: int, strategy: str = "default") -> Runner:
        self.check(workload, threads, strategy)
        run = session(workload.build_model(), threads)
        feeds = {k: np.ascontiguousarray(v) for k, v in workload.inputs.items()}
        return lambda: run(feeds)

    def prepare_precision(self, workload: Workload, threads: int, strategy: str, precision: str,
                          calibration: list[dict[str, np.ndarray]]) -> FeedRunner:
        """int8: the QDQ model of `quantize_static` (S8S8, per-channel) calibrated on `calibration`."""
        self.check(workload, threads, strategy)
        model = workload.build_model()
        if precision == "int8":
            from kiln.bench.precision import ort_qdq_model
            model = ort_qdq_model(model, calibration)
        elif precision != "fp32":
            raise PeerError(f"onnxruntime has no {precision} path on CPUs in kiln bench")
        return session(model, threads)


def session(model: Any, threads: int) -> FeedRunner:
    """An InferenceSession as the module docstring says, as a callable on feeds (extra feeds are dropped)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.log_severity_level = 3
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    names = [i.name for i in sess.get_inputs()]

    def run(feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        return sess.run(None, {n: feeds[n] for n in names})

    return run
