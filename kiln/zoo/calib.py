"""Minimal numpy CNN ops, used to run a calibration image through a network while it is built.

BatchNormalization needs running statistics. Random ones (mean ~ 0, var ~ 1) normalise nothing:
every residual Add then roughly doubles the variance, and ResNet-50's logits come out near 1e4.
A trained network's running stats are the statistics of real data at that point, so we do the
same: push one seeded standard-normal image through the network as it is being built and read
the per-channel mean/variance of each BN input. Float64 everywhere, so the result does not hinge
on BLAS rounding, and the stats are cast to float32 only when stored.

Tensors are [C, H, W] (batch 1, batch dimension dropped).
"""
from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view


def _windows(x: np.ndarray, k: int, stride: int, pad: int, fill: float = 0.0) -> np.ndarray:
    """[C, Ho, Wo, k, k] strided view of the padded input (no copy yet)."""
    xp = np.pad(x, ((0, 0), (pad, pad), (pad, pad)), constant_values=fill)
    return sliding_window_view(xp, (k, k), axis=(1, 2))[:, ::stride, ::stride]


def conv2d(x: np.ndarray, w: np.ndarray, stride: int, pad: int, group: int) -> np.ndarray:
    """Conv without bias; supports dense (group=1) and depthwise (group=C) only, all the zoo needs."""
    w = w.astype(np.float64)
    cout, cin_g, k, _ = w.shape
    if group == 1 and k == 1:
        # Pointwise: a plain matrix product, skipping the im2col copy.
        xs = x[:, ::stride, ::stride]
        return (w.reshape(cout, cin_g) @ xs.reshape(cin_g, -1)).reshape(cout, *xs.shape[1:])
    win = _windows(x, k, stride, pad)
    if group == 1:
        return np.tensordot(w, win, axes=([1, 2, 3], [0, 3, 4]))
    if group == x.shape[0] == cout and cin_g == 1:
        return np.einsum("chwij,cij->chw", win, w[:, 0])
    raise NotImplementedError(f"grouped conv with group={group} (only dense and depthwise)")


def batchnorm(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray, mean: np.ndarray, var: np.ndarray,
              eps: float) -> np.ndarray:
    scale = gamma / np.sqrt(var.astype(np.float64) + eps)
    return (x - mean[:, None, None]) * scale[:, None, None] + beta[:, None, None]


def maxpool(x: np.ndarray, k: int, stride: int, pad: int) -> np.ndarray:
    return _windows(x, k, stride, pad, fill=-np.inf).max(axis=(3, 4))


def channel_stats(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-channel mean and variance over the spatial positions."""
    return x.mean(axis=(1, 2)), x.var(axis=(1, 2))
