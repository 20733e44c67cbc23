"""kiln.zoo: the built-in models, generated in code with seeded random weights.

    >>> model = build("resnet50")          # onnx.ModelProto, opset 17, float32
    >>> feeds = inputs("resnet50")         # {"input": float32 [1, 3, 224, 224]}
    >>> flops("resnet50")                  # 2 * MACs of one inference

Nothing is downloaded and nothing is cached on disk; weights are scaled so activations stay O(1)
through every network, which keeps relative-error comparisons between compilers meaningful.
"""
from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import onnx

from kiln.blas import one_blas_thread

from . import bert, gpt, kernels, vision
from .flops import count_flops

__all__ = ["names", "dynamic_names", "build", "inputs", "flops", "input_shapes", "count_flops"]


@dataclass(frozen=True)
class _Entry:
    build: Callable[[int], onnx.ModelProto]
    inputs: dict[str, tuple[int, ...]]  # the feeds' shapes (for a dynamic model: one size within its bounds)
    feeds: Callable[[tuple[int, ...], int], np.ndarray] | None = None  # non-float inputs (token ids)


_IMAGE = {"input": vision.IMAGE_SHAPE}

_REGISTRY: dict[str, _Entry] = {
    "resnet18": _Entry(vision.resnet18, _IMAGE),
    "resnet50": _Entry(vision.resnet50, _IMAGE),
    "mobilenetv2": _Entry(vision.mobilenetv2, _IMAGE),
    "bert_base": _Entry(bert.bert_base, {"embeddings": (1, bert.SEQ, bert.HIDDEN)}),
    "mlp": _Entry(kernels.mlp, {"input": (1, 1024)}),
    "gemm_1024": _Entry(kernels.gemm_1024, {"A": (1024, 1024)}),
    "gemm_odd": _Entry(kernels.gemm_odd, {"A": (129, 771)}),
    "conv_r50_3x3": _Entry(kernels.conv_r50_3x3, {"input": (1, 256, 14, 14)}),
    "conv_dw": _Entry(kernels.conv_dw, {"input": (1, 144, 56, 56)}),
}


# models with symbolic input dims (dim_param): same builders as their static twins, `batch` / `seq` symbolic.
# Kept out of names() (which the static tests and benchmarks iterate: each compiles for its one shape).
_DYNAMIC: dict[str, _Entry] = {
    "gpt_decoder": _Entry(gpt.gpt_decoder, {"input_ids": (1, gpt.SEQ)}, gpt.token_ids),
    "bert_base_dynamic": _Entry(bert.bert_base_dynamic, {"embeddings": (1, bert.SEQ, bert.HIDDEN)}),
    "resnet18_dynamic": _Entry(vision.resnet18_dynamic, _IMAGE),
    "resnet50_dynamic": _Entry(vision.resnet50_dynamic, _IMAGE),
}


def names() -> list[str]:
    """The static models."""
    return list(_REGISTRY)


def dynamic_names() -> list[str]:
    """The models with symbolic dims (symbolic batch and/or sequence)."""
    return list(_DYNAMIC)


def _entry(name: str) -> _Entry:
    try:
        return _REGISTRY[name] if name in _REGISTRY else _DYNAMIC[name]
    except KeyError:
        raise KeyError(f"unknown zoo model {name!r}; valid names: {', '.join([*_REGISTRY, *_DYNAMIC])}") from None


def build(name: str, seed: int = 0) -> onnx.ModelProto:
    """A fresh ModelProto; the same (name, seed) always serializes to the same bytes."""
    with one_blas_thread():  # (the calibration's matmuls: kiln/blas.py)
        return _entry(name).build(seed)


def input_shapes(name: str) -> dict[str, tuple[int, ...]]:
    return dict(_entry(name).inputs)


def inputs(name: str, seed: int = 1, shapes: dict[str, tuple[int, ...]] | None = None) -> dict[str, np.ndarray]:
    """Standard-normal float32 feeds for every graph input, in graph-input order (token ids for a decoder).
    `shapes`: other sizes for a dynamic model's inputs."""
    entry = _entry(name)
    rng = np.random.default_rng(seed)
    sizes = {**entry.inputs, **(shapes or {})}
    if entry.feeds is not None:
        return {k: entry.feeds(shape, seed) for k, shape in sizes.items()}
    return {k: rng.standard_normal(shape, dtype=np.float32) for k, shape in sizes.items()}


@functools.cache
def _flops(name: str) -> float:
    # FLOPs do not depend on the weights, so any seed will do; cached in memory only.
    return count_flops(build(name))


def flops(name: str) -> float:
    """Floating-point operations of one inference: 2 * MACs of Conv/MatMul/Gemm only."""
    _entry(name)  # raise the helpful KeyError before building anything
    return _flops(name)
