"""The unit of measurement: one workload, the same inputs for every system."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx


@dataclass
class GemmSpec:
    """Y[M,N] = A[M,K] @ B[K,N]; A is the runtime input, B a constant weight (packed ahead by who can)."""
    m: int
    n: int
    k: int
    a: np.ndarray  # float32 [M, K], C-contiguous
    b: np.ndarray  # float32 [K, N], C-contiguous


@dataclass
class Workload:
    name: str                                  # e.g. "gemm_1024", "conv_r50_3x3", "resnet50"
    kind: str                                  # "gemm" | "conv" | "network" | "torch" (a torch.nn model)
    flops: float                               # floating-point operations of one run (2*M*N*K for GEMM)
    build_model: Callable[[], onnx.ModelProto]  # ONNX model, opset 17, random seeded weights
    inputs: dict[str, np.ndarray]              # the feeds, identical for every system
    gemm: GemmSpec | None = None               # set for GEMM workloads (library/halide/naive-c peers use it)
    tags: set[str] = field(default_factory=set)  # e.g. {"quick"}
    # kind "torch": builds (nn.Module in eval(), example inputs); its inputs are `inputs` (same values, by name)
    build_torch: Callable[[], tuple[Any, tuple[Any, ...]]] | None = None
