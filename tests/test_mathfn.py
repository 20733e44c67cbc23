"""The vector exp/erf/tanh/sigmoid that codegen emits, against float64 NumPy, over their whole range."""
from __future__ import annotations

import math

import numpy as np
import pytest
from onnx import TensorProto, helper

import kiln

N = 4096 * 4  # a multiple of every vector width: every element goes through the vector path


def run_unary(op: str, x: np.ndarray) -> np.ndarray:
    g = helper.make_graph([helper.make_node(op, ["x"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(x.shape))])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    return kiln.compile(m, num_threads=1, cache=False).run({"x": x})[0]


def ulp_err(out: np.ndarray, ref: np.ndarray) -> float:
    ulp = np.spacing(np.abs(ref).astype(np.float32)).astype(np.float64)
    return float(np.max(np.abs(out.astype(np.float64) - ref) / np.maximum(ulp, np.finfo(np.float32).tiny)))


def test_exp_within_2_ulp() -> None:
    x = np.linspace(-87, 88, N, dtype=np.float32)
    assert ulp_err(run_unary("Exp", x), np.exp(x.astype(np.float64))) <= 2.0


def test_exp_nan_and_limits() -> None:
    x = np.zeros(64, np.float32)
    x[:3] = [np.nan, -1000.0, 0.0]
    y = run_unary("Exp", x)
    assert np.isnan(y[0]) and 0 <= y[1] < 1e-37 and y[2] == 1.0


def test_erf_absolute_error() -> None:
    x = np.linspace(-6, 6, N, dtype=np.float32)
    ref = np.vectorize(math.erf)(x.astype(np.float64))
    assert np.max(np.abs(run_unary("Erf", x) - ref)) <= 3e-7  # the documented bound: ≈ 2 ulp near ±1


@pytest.mark.parametrize("lo, hi", [(-1e-3, 1e-3), (-0.7, 0.7), (-20, 20)])
def test_tanh_within_3_ulp(lo: float, hi: float) -> None:
    x = np.linspace(lo, hi, N, dtype=np.float32)
    assert ulp_err(run_unary("Tanh", x), np.tanh(x.astype(np.float64))) <= 3.0


def test_sigmoid_relative_error() -> None:
    x = np.linspace(-80, 80, N, dtype=np.float32)
    ref = 1 / (1 + np.exp(-x.astype(np.float64)))
    assert np.max(np.abs(run_unary("Sigmoid", x) - ref) / ref) <= 1e-6


