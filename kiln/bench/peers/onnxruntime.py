"""ONNX Runtime peer: an InferenceSession on the CPU execution provider, all graph optimizations on.

Threads: `intra_op_num_threads = threads` (ORT's own pool; the calling thread counts as one of them),
`inter_op_num_threads = 1`, sequential execution mode. Spinning is left at ORT's default (on), thread
placement to the OS. Inputs are passed as the workload's numpy arrays (ORT reads them without copy).
"""
from __future__ import annotations

import numpy as np

from kiln.bench.peers.base import Peer, Runner, dist_version, try_import
from kiln.bench.workload import Workload


class OnnxRuntimePeer(Peer):
    name = "onnxruntime"
    kinds = frozenset({"gemm", "conv", "network"})
    requirement = "onnxruntime"

    def available(self) -> tuple[bool, str]:
        return try_import("onnxruntime", pip=self.requirement)

    def version(self) -> str:
        return dist_version("onnxruntime", "onnxruntime-openvino", "ort-nightly")

    def prepare(self, workload: Workload, threads: int, strategy: str = "default") -> Runner:
        self.check(workload, threads, strategy)
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
        so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        so.log_severity_level = 3
        sess = ort.InferenceSession(workload.build_model().SerializeToString(), so,
                                    providers=["CPUExecutionProvider"])
        feeds = {i.name: np.ascontiguousarray(workload.inputs[i.name]) for i in sess.get_inputs()}

        def run() -> list[np.ndarray]:
            return sess.run(None, feeds)

        return run
