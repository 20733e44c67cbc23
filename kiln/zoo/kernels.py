"""Single-operator models and a small MLP: micro-benchmarks for the GEMM and conv code paths."""
from __future__ import annotations

import onnx

from .builder import GraphBuilder
from .vision import conv


def mlp(seed: int = 0) -> onnx.ModelProto:
    b = GraphBuilder(seed)
    x = b.input("input", (1, 1024))
    x = b.op("Relu", "relu1", [b.linear_gemm(x, "fc1", 1024, 4096)])
    x = b.op("Relu", "relu2", [b.linear_gemm(x, "fc2", 4096, 4096)])
    b.linear_gemm(x, "fc3", 4096, 1000, out="logits")
    b.output("logits", (1, 1000))
    return b.model("mlp")


def matmul_const(seed: int, name: str, m: int, k: int, n: int) -> onnx.ModelProto:
    """Y[M,N] = A[M,K] @ B[K,N] with B a constant: the shape kiln.bench's GemmSpec describes."""
    b = GraphBuilder(seed)
    a = b.input("A", (m, k))
    w = b.kaiming("B", (k, n), k)
    b.op("MatMul", "matmul", [a, w], out="Y")
    b.output("Y", (m, n))
    return b.model(name)


def gemm_1024(seed: int = 0) -> onnx.ModelProto:
    return matmul_const(seed, "gemm_1024", 1024, 1024, 1024)


def gemm_odd(seed: int = 0) -> onnx.ModelProto:
    # Sizes prime-ish and off every vector width / tile size, to exercise remainder handling.
    return matmul_const(seed, "gemm_odd", 129, 771, 257)


def single_conv(seed: int, name: str, c: int, hw: int, group: int) -> onnx.ModelProto:
    b = GraphBuilder(seed)
    x = b.input("input", (1, c, hw, hw))
    conv(b, x, "conv", c, c, 3, group=group, bias=True, out="output")
    b.output("output", (1, c, hw, hw))
    return b.model(name)


def conv_r50_3x3(seed: int = 0) -> onnx.ModelProto:
    # The 3x3 conv of ResNet-50's layer3 bottlenecks: 256 -> 256 channels at 14x14.
    return single_conv(seed, "conv_r50_3x3", 256, 14, group=1)


def conv_dw(seed: int = 0) -> onnx.ModelProto:
    # A MobileNetV2 depthwise 3x3 (the 144-channel expansion at 56x56).
    return single_conv(seed, "conv_dw", 144, 56, group=144)
