"""The catalogue of workloads `kiln bench` measures, and the suites that group them.

GEMM convention everywhere: Y[M,N] = A[M,K] @ B[K,N]; M = rows of A (tokens), K = the reduction,
N = columns of B (output features). A is the runtime input "A", B a constant initializer "B".
Shapes are written M x K x N in the names' comments because that is the order the data flows.

Kernel workloads are single-operator ONNX models (opset 17, IR 8 so onnxruntime loads them); the
four names that also live in `kiln.zoo` (gemm_1024, gemm_odd, conv_r50_3x3, conv_dw) are taken from
the zoo so that every part of the project measures the very same bytes. Networks come from the zoo.
Everything is seeded: the same name always gives the same weights and the same inputs.
"""
from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from .workload import GemmSpec, Workload

OPSET = 17
IR_VERSION = 8
WEIGHT_SEED = 0
INPUT_SEED = 1


@dataclass(frozen=True)
class ConvShape:
    """One Conv layer at batch 1: input [1, cin, hw, hw], weight [cout, cin/group, k, k], 'same' pads."""
    cin: int
    cout: int
    hw: int
    k: int
    stride: int = 1
    group: int = 1

    @property
    def out_hw(self) -> int:
        pad = self.k // 2
        return (self.hw + 2 * pad - self.k) // self.stride + 1

    @property
    def flops(self) -> float:
        # 2 * MACs; the bias add is not counted (the usual convention, and what zoo.flops does).
        return 2.0 * self.cout * self.out_hw**2 * (self.cin // self.group) * self.k * self.k


# name -> (M, K, N). Shapes from real networks.
GEMMS: dict[str, tuple[int, int, int]] = {
    "gemm_256": (256, 256, 256),
    "gemm_512": (512, 512, 512),
    "gemm_1024": (1024, 1024, 1024),          # = kiln.zoo gemm_1024
    "gemm_2048": (2048, 2048, 2048),
    "gemm_bert_qkv": (128, 768, 768),          # BERT-base attention projections, seq 128
    "gemm_bert_ffn1": (128, 768, 3072),        # BERT-base FFN up-projection
    "gemm_vit_ffn2": (197, 3072, 768),         # ViT-B/16 FFN down-projection, 197 tokens
    "gemm_gemv": (1, 1024, 4096),              # batch-1 fully connected: GEMV-like, memory bound
    "gemm_odd": (129, 771, 257),               # = kiln.zoo gemm_odd: sizes off every tile and vector
}

# ResNet-50 (v1.5, 224x224) distinct conv layers: the stem, then per stage the 3x3 and both 1x1s.
# MobileNetV2: depthwise 3x3 and pointwise (expand / project) layers across resolutions.
CONVS: dict[str, ConvShape] = {
    "conv_r50_stem": ConvShape(3, 64, 224, 7, stride=2),
    "conv_r50_56_3x3": ConvShape(64, 64, 56, 3),
    "conv_r50_56_1x1_expand": ConvShape(64, 256, 56, 1),
    "conv_r50_56_1x1_reduce": ConvShape(256, 64, 56, 1),
    "conv_r50_28_3x3": ConvShape(128, 128, 28, 3),
    "conv_r50_28_3x3_s2": ConvShape(128, 128, 56, 3, stride=2),
    "conv_r50_28_1x1_expand": ConvShape(128, 512, 28, 1),
    "conv_r50_28_1x1_reduce": ConvShape(512, 128, 28, 1),
    "conv_r50_3x3": ConvShape(256, 256, 14, 3),            # = kiln.zoo conv_r50_3x3 (stage 3)
    "conv_r50_14_1x1_expand": ConvShape(256, 1024, 14, 1),
    "conv_r50_14_1x1_reduce": ConvShape(1024, 256, 14, 1),
    "conv_r50_7_3x3": ConvShape(512, 512, 7, 3),
    "conv_r50_7_1x1_expand": ConvShape(512, 2048, 7, 1),
    "conv_r50_7_1x1_reduce": ConvShape(2048, 512, 7, 1),
    "conv_mnv2_dw_112": ConvShape(32, 32, 112, 3, group=32),
    "conv_dw": ConvShape(144, 144, 56, 3, group=144),      # = kiln.zoo conv_dw
    "conv_mnv2_dw_28": ConvShape(192, 192, 28, 3, group=192),
    "conv_mnv2_dw_14": ConvShape(384, 384, 14, 3, group=384),
    "conv_mnv2_dw_7": ConvShape(960, 960, 7, 3, group=960),
    "conv_mnv2_pw_56_expand": ConvShape(24, 144, 56, 1),
    "conv_mnv2_pw_56_project": ConvShape(144, 24, 56, 1),
    "conv_mnv2_pw_14_expand": ConvShape(64, 384, 14, 1),
    "conv_mnv2_pw_14_project": ConvShape(384, 64, 14, 1),
    "conv_mnv2_pw_7_last": ConvShape(320, 1280, 7, 1),
}

NETWORKS: tuple[str, ...] = ("resnet18", "resnet50", "mobilenetv2", "bert_base", "mlp")
# torch.nn models (kiln/zoo/torch_models.py) for the torch.compile backends, each with its ONNX zoo twin (the same
# architecture: its FLOP count is theirs)
TORCH_NETWORKS: dict[str, str] = {"torch_resnet50": "resnet50", "torch_mobilenetv2": "mobilenetv2",
                                  "torch_bert_base": "bert_base"}
ZOO_KERNELS = frozenset({"gemm_1024", "gemm_odd", "conv_r50_3x3", "conv_dw"})

SUITES: dict[str, tuple[str, ...]] = {
    # < 5 min on 2 cores with ~8 systems: two GEMMs, two convs, one small network, one MLP.
    "quick": ("gemm_1024", "gemm_odd", "conv_r50_3x3", "conv_dw", "resnet18", "mlp"),
    "kernels": (*GEMMS, *CONVS),
    "networks": NETWORKS,
    "full": (*GEMMS, *CONVS, *NETWORKS),
    # `kiln bench --suite torch --systems kiln,inductor,openvino --strategy kiln=torch-compile
    #  --strategy openvino=torch-compile`: the torch.compile backends on torch.nn models
    "torch": tuple(TORCH_NETWORKS),
}


# ---- model builders (module-level functions, so a Workload pickles into the worker processes) ----

def _make_model(name: str, nodes: list, inputs: list, outputs: list, inits: list) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, name, inputs, outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                             ir_version=IR_VERSION, producer_name="kiln.bench")


def gemm_model(name: str, m: int, k: int, n: int, seed: int = WEIGHT_SEED) -> onnx.ModelProto:
    """Y = A @ B with B constant, He-scaled so |Y| stays O(1) whatever K is."""
    rng = np.random.default_rng(seed)
    b = rng.standard_normal((k, n), dtype=np.float32) * np.float32(np.sqrt(2.0 / k))
    return _make_model(
        name, [helper.make_node("MatMul", ["A", "B"], ["Y"], name="matmul")],
        [helper.make_tensor_value_info("A", TensorProto.FLOAT, [m, k])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [m, n])],
        [numpy_helper.from_array(b, "B")])


def conv_model(name: str, s: ConvShape, seed: int = WEIGHT_SEED) -> onnx.ModelProto:
    """One Conv with bias, pads k//2 (as in both networks)."""
    rng = np.random.default_rng(seed)
    fan_in = (s.cin // s.group) * s.k * s.k
    w = rng.standard_normal((s.cout, s.cin // s.group, s.k, s.k), dtype=np.float32)
    w *= np.float32(np.sqrt(2.0 / fan_in))
    bias = rng.standard_normal((s.cout,), dtype=np.float32) * np.float32(0.1)
    p = s.k // 2
    node = helper.make_node("Conv", ["input", "weight", "bias"], ["output"], name="conv",
                            kernel_shape=[s.k, s.k], pads=[p, p, p, p], strides=[s.stride, s.stride],
                            dilations=[1, 1], group=s.group)
    return _make_model(
        name, [node],
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, s.cin, s.hw, s.hw])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, s.cout, s.out_hw, s.out_hw])],
        [numpy_helper.from_array(w, "weight"), numpy_helper.from_array(bias, "bias")])


def _zoo_build(name: str) -> onnx.ModelProto:
    import kiln.zoo
    return kiln.zoo.build(name)


def _normal(shape: tuple[int, ...], seed: int = INPUT_SEED) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape, dtype=np.float32)


def gemm_spec_of(model: onnx.ModelProto, a: np.ndarray) -> GemmSpec:
    """Read B back from the model, so the spec is the model whoever built it."""
    node = next(n for n in model.graph.node if n.op_type == "MatMul")
    inits = {t.name: t for t in model.graph.initializer}
    b = np.ascontiguousarray(numpy_helper.to_array(inits[node.input[1]]), dtype=np.float32)
    m, k = a.shape
    return GemmSpec(m=m, n=b.shape[1], k=k, a=np.ascontiguousarray(a), b=b)


# ---- workload factories -----------------------------------------------------------------------

def gemm_workload(name: str, m: int, k: int, n: int) -> Workload:
    if name in ZOO_KERNELS and _zoo_has(name):
        build = functools.partial(_zoo_build, name)
    else:
        build = functools.partial(gemm_model, name, m, k, n)
    a = _normal((m, k))
    return Workload(name=name, kind="gemm", flops=2.0 * m * n * k, build_model=build,
                    inputs={"A": a}, gemm=gemm_spec_of(build(), a), tags=_tags(name))


def conv_workload(name: str, s: ConvShape) -> Workload:
    if name in ZOO_KERNELS and _zoo_has(name):
        build = functools.partial(_zoo_build, name)
    else:
        build = functools.partial(conv_model, name, s)
    return Workload(name=name, kind="conv", flops=s.flops, build_model=build,
                    inputs={"input": _normal((1, s.cin, s.hw, s.hw))}, tags=_tags(name))


def network_workload(name: str) -> Workload:
    import kiln.zoo
    return Workload(name=name, kind="network", flops=float(kiln.zoo.flops(name)),
                    build_model=functools.partial(_zoo_build, name), inputs=kiln.zoo.inputs(name),
                    tags=_tags(name))


def _torch_build(name: str) -> tuple[Any, tuple[Any, ...]]:
    from kiln.zoo import torch_models
    return torch_models.build(name)


def _no_onnx(name: str) -> onnx.ModelProto:
    raise ValueError(f"{name} is a torch.nn workload: it has no ONNX model (systems that take torch modules run it)")


def torch_workload(name: str) -> Workload:
    import kiln.zoo
    from kiln.zoo import torch_models

    xs = torch_models.example_inputs(name)
    return Workload(name=name, kind="torch", flops=float(kiln.zoo.flops(TORCH_NETWORKS[name])),
                    build_model=functools.partial(_no_onnx, name), inputs=xs, tags=_tags(name),
                    build_torch=functools.partial(_torch_build, name))


def _zoo_has(name: str) -> bool:
    try:
        import kiln.zoo
        return name in kiln.zoo.names()
    except Exception:  # the zoo is optional for kernels: fall back to our own identical builder
        return False


def _tags(name: str) -> set[str]:
    return {suite for suite, names in SUITES.items() if name in names}


def factories() -> dict[str, Callable[[], Workload]]:
    """name -> zero-arg factory; building is lazy because a 2048 GEMM or a network costs memory."""
    out: dict[str, Callable[[], Workload]] = {}
    for name, (m, k, n) in GEMMS.items():
        out[name] = functools.partial(gemm_workload, name, m, k, n)
    for name, shape in CONVS.items():
        out[name] = functools.partial(conv_workload, name, shape)
    for name in NETWORKS:
        out[name] = functools.partial(network_workload, name)
    for name in TORCH_NETWORKS:
        out[name] = functools.partial(torch_workload, name)
    return out


def names(suite: str = "full") -> list[str]:
    if suite not in SUITES:
        raise KeyError(f"unknown suite {suite!r}; valid: {', '.join(SUITES)}")
    return list(SUITES[suite])


def get(name: str) -> Workload:
    table = factories()
    if name not in table:
        raise KeyError(f"unknown workload {name!r}; valid: {', '.join(table)}")
    return table[name]()


def kind_of(name: str) -> str:
    return "gemm" if name in GEMMS else "conv" if name in CONVS else "torch" if name in TORCH_NETWORKS else "network"
