"""Calibration: run a float model (compiled by Kiln) on sample feeds and choose each tensor's quantization range.

    instrument   the tensors to quantize become extra graph outputs of a copy of the model
    observe      kiln.compile it once, run it on every feed: min/max (pass 1), then a histogram per tensor over
                 that range (pass 2, only for "percentile" and "entropy")
    choose       minmax      [min, max]
                 percentile  the `percentile`-th quantiles of both tails (ORT/NNCF-style clipping of outliers)
                 entropy     the symmetric threshold T minimizing KL(P ‖ Q) between the |x| histogram and its
                             128-level requantization (TensorRT's calibrator), range [max(min, −T), min(max, T)]
    params       (scale, zero point) of an int8 range: asymmetric zp ∈ [−128, 127], or symmetric zp = 0

The range always contains 0 (a zero point must represent 0 exactly: padding, ReLU)."""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx

from kiln.errors import ModelError

METHODS = ("minmax", "percentile", "entropy")
HIST_BINS = 2048


def check_feeds(model: onnx.ModelProto, feeds: Sequence[dict[str, np.ndarray]]) -> list[dict[str, np.ndarray]]:
    """The calibration feeds as a list, each checked against the model's inputs (names, shapes, dtypes)."""
    from onnx import helper

    if isinstance(feeds, dict) or feeds is None:
        raise ValueError("calibration_feeds must be a sequence of feed dicts ({input name: array}), one per sample")
    feeds = list(feeds)
    if not feeds:
        raise ValueError("kiln.quantize needs calibration data: calibration_feeds is empty")
    inits = {t.name for t in model.graph.initializer}
    inputs = [i for i in model.graph.input if i.name not in inits]
    for k, f in enumerate(feeds):
        for i in inputs:
            if i.name not in f:
                raise ValueError(f"calibration feed {k} lacks input '{i.name}' (has {sorted(f)})")
            t = i.type.tensor_type
            want_dtype = helper.tensor_dtype_to_np_dtype(t.elem_type)
            want = tuple(d.dim_value if d.HasField("dim_value") else None for d in t.shape.dim)
            got = np.asarray(f[i.name])
            if got.dtype != want_dtype or len(got.shape) != len(want) or any(
                    w is not None and w != s for w, s in zip(want, got.shape)):
                raise ValueError(f"calibration feed {k}, input '{i.name}': expected {want_dtype} of shape "
                                 f"{tuple('?' if w is None else w for w in want)}, got {got.dtype} {got.shape}")
    return feeds


def instrumented(model: onnx.ModelProto, tensors: Sequence[str]) -> onnx.ModelProto:
    """A copy of `model` that also outputs `tensors` (their types from ONNX shape inference where it knows them)."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    known = {v.name: v for v in onnx.shape_inference.infer_shapes(model).graph.value_info}
    have = {o.name for o in m.graph.output}
    for t in tensors:
        if t not in have:
            m.graph.output.append(known[t] if t in known else onnx.ValueInfoProto(name=t))
    return m


class Observer:
    """Running statistics of one tensor over the calibration feeds."""

    def __init__(self) -> None:
        self.lo, self.hi = np.inf, -np.inf
        self.hist: np.ndarray | None = None
        self.edges: np.ndarray | None = None

    def minmax(self, x: np.ndarray) -> None:
        self.lo, self.hi = min(self.lo, float(x.min())), max(self.hi, float(x.max()))

    def histogram(self, x: np.ndarray) -> None:
        if self.edges is None:
            self.edges = np.linspace(self.lo, self.hi if self.hi > self.lo else self.lo + 1.0, HIST_BINS + 1)
            self.hist = np.zeros(HIST_BINS, np.int64)
        self.hist += np.histogram(x, bins=self.edges)[0]

    def range(self, method: str, percentile: float) -> tuple[float, float]:
        if method == "minmax" or self.hist is None or not self.hist.any():
            return self.lo, self.hi
        if method == "percentile":
            cdf = np.cumsum(self.hist) / self.hist.sum()
            tail = (100.0 - percentile) / 100.0
            lo = self.edges[int(np.searchsorted(cdf, tail))]
            hi = self.edges[min(HIST_BINS, int(np.searchsorted(cdf, 1.0 - tail)) + 1)]
            return float(lo), float(hi)
        t = entropy_threshold(self.hist, self.edges)
        return max(self.lo, -t), min(self.hi, t)


def entropy_threshold(hist: np.ndarray, edges: np.ndarray, levels: int = 128) -> float:
    """The |x| threshold minimizing KL divergence between the clipped histogram and its `levels`-level version."""
    centres = (edges[:-1] + edges[1:]) / 2
    top = float(np.abs(edges).max())
    bins = HIST_BINS // 2
    ahist = np.histogram(np.abs(centres), bins=bins, range=(0.0, top), weights=hist)[0]
    best, best_t = np.inf, top
    for i in range(levels, bins + 1, max(1, (bins - levels) // 64)):
        p = ahist[:i].astype(np.float64).copy()
        p[i - 1] += ahist[i:].sum()  # outliers clipped into the last bin
        nz = p > 0
        q = np.zeros(i)  # the unclipped bins merged into `levels` levels: clipping costs the outliers' mass
        inside = ahist[:i].astype(np.float64)
        for chunk in np.array_split(np.arange(i), levels):
            used = nz[chunk]
            if used.any():
                q[chunk[used]] = inside[chunk].sum() / used.sum()
        ps, qs = p / p.sum(), q / max(q.sum(), 1e-30)
        kl = float(np.sum(ps[nz] * np.log(ps[nz] / np.maximum(qs[nz], 1e-30))))
        if kl < best:
            best, best_t = kl, top * i / bins
    return best_t


def observe(model: onnx.ModelProto, tensors: Sequence[str], feeds: Sequence[dict[str, np.ndarray]], method: str,
            percentile: float, target: str, **compile_kw: object) -> dict[str, tuple[float, float]]:
    """{tensor: (lo, hi)} from running the float model, compiled by Kiln, on the feeds."""
    from kiln.compiler import compile as kiln_compile

    if method not in METHODS:
        raise ValueError(f"calibration method must be one of {METHODS}, got {method!r}")
    m = instrumented(model, tensors)
    exe = kiln_compile(m, target=target, **compile_kw)
    names = [o["name"] for o in exe.meta["outputs"]]
    missing = [t for t in tensors if t not in names]
    if missing:
        raise ModelError(f"calibration: tensors {missing} are not outputs of the instrumented model")
    obs = {t: Observer() for t in tensors}
    passes = ["minmax"] + ([] if method == "minmax" else ["histogram"])
    for step in passes:
        for f in feeds:
            outs = dict(zip(names, exe.run(f)))
            for t, o in obs.items():
                getattr(o, step)(np.asarray(outs[t], np.float32))
    return {t: o.range(method, percentile) for t, o in obs.items()}


def qparams(lo: float, hi: float, symmetric: bool) -> tuple[np.float32, np.int8]:
    """int8 (scale, zero point) of the range [lo, hi] widened to contain 0."""
    lo, hi = min(lo, 0.0), max(hi, 0.0)
    if symmetric:
        scale = max(-lo, hi) / 127.0
        return np.float32(scale if scale > 0 else 1.0), np.int8(0)
    scale = (hi - lo) / 255.0
    if scale <= 0:
        return np.float32(1.0), np.int8(0)
    zp = int(np.clip(np.round(-128.0 - lo / scale), -128, 127))
    return np.float32(scale), np.int8(zp)
