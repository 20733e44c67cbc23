"""Resize / Upsample: per resized axis, gathers of constant taps times constant weights."""
from __future__ import annotations

import numpy as np

from kiln.frontend.context import Ctx
from kiln.frontend.importers.registry import _axis, _opt, _scalar, importer
from kiln.graph.ir import Value


# -- Resize / Upsample: per resized axis, gathers of constant taps times constant weights ---------------------
def _resize_taps(mode: str, coord: str, nearest: str, in_w: int, out_w: int, scale: float,
                 roi: tuple[float, float] | None, cubic_a: float, exclude_outside: bool,
                 antialias: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Source indices [out, taps] (clamped), weights [out, taps] and the extrapolated rows (tf_crop_and_resize)
    of one axis — the interpolation of ONNX's Resize, which is separable along axes."""
    y = np.arange(out_w, dtype=np.float64)
    length = scale * in_w
    extrap = None
    if coord == "align_corners":
        x = np.zeros(out_w) if length == 1 else y * (in_w - 1) / (length - 1)
    elif coord == "asymmetric":
        x = y / scale
    elif coord == "tf_crop_and_resize":
        lo, hi = roi
        x = (np.full(out_w, (hi - lo) * (in_w - 1) / 2) if length == 1
             else y * (hi - lo) * (in_w - 1) / (length - 1)) + lo * (in_w - 1)
        extrap = (x < 0) | (x > in_w - 1)
    elif coord == "pytorch_half_pixel":
        x = np.zeros(out_w) if out_w == 1 else (y + 0.5) / scale - 0.5  # the spec's 0 (ONNX's reference: -0.5)
    elif coord == "half_pixel":
        x = (y + 0.5) / scale - 0.5
    elif coord == "half_pixel_symmetric":
        x = in_w / 2 * (1 - out_w / length) + (y + 0.5) / scale - 0.5
    else:
        raise ValueError(f"coordinate_transformation_mode {coord!r}")
    base = np.floor(x)
    ratio = np.where(x == base, 1.0, x - base)
    a = cubic_a
    if mode == "nearest":
        pick = {"round_prefer_floor": lambda r: r > 0.5, "round_prefer_ceil": lambda r: r >= 0.5,
                "floor": lambda r: np.zeros_like(r, bool), "ceil": lambda r: np.ones_like(r, bool),
                "simple": lambda r: np.ones_like(r, bool) if scale < 1 else np.zeros_like(r, bool)}[nearest]
        up = np.where(ratio == 1.0, True, pick(ratio))  # an integer coordinate is itself
        coeffs = np.stack([~up, up], axis=1).astype(np.float64)
    elif mode == "linear":
        if antialias and scale < 1:
            start = int(np.floor(-1 / scale) + 1)
            args = (np.arange(start, 2 - start)[None, :] - ratio[:, None]) * scale
            coeffs = np.clip(1 - np.abs(args), 0, 1)
            coeffs /= coeffs.sum(axis=1, keepdims=True)
        else:
            coeffs = np.stack([1 - ratio, ratio], axis=1)
    elif mode == "cubic":
        s = min(scale, 1.0) if antialias else 1.0
        start = int(np.floor(-2 / s) + 1)
        d = np.abs((np.arange(start, 2 - start)[None, :] - ratio[:, None]) * s)
        coeffs = np.where(d <= 1, (a + 2) * d ** 3 - (a + 3) * d ** 2 + 1,
                          np.where(d < 2, a * d ** 3 - 5 * a * d ** 2 + 8 * a * d - 4 * a, 0.0))
        if antialias:
            coeffs /= coeffs.sum(axis=1, keepdims=True)
    else:
        raise ValueError(f"mode {mode!r}")
    n = coeffs.shape[1]
    pad = int(np.ceil(n / 2))
    xp = x + pad
    p = np.floor(xp)
    frac = xp - p
    if n % 2 == 0:
        off = np.where(frac == 0, -(n // 2), -(n // 2) + 1)
    else:
        off = np.where(frac <= 0.5, -((n - 1) // 2), -((n - 1) // 2) + 1)
    idx = (p + off).astype(np.int64)[:, None] + np.arange(n)[None, :] - pad
    if exclude_outside:
        coeffs = np.where((idx < 0) | (idx >= in_w), 0.0, coeffs)
        total = coeffs.sum(axis=1, keepdims=True)
        coeffs = coeffs / np.where(total == 0, 1.0, total)
    return np.clip(idx, 0, in_w - 1), coeffs, extrap


def _resize(cx: Ctx, x: Value, scales: list[float], sizes: list[int], mode: str, coord: str, nearest: str,
            roi: list[float] | None, cubic_a: float = -0.75, exclude_outside: bool = False,
            antialias: bool = False, extrapolation_value: float = 0.0) -> Value:
    rank = len(x.shape)
    if mode not in ("nearest", "linear", "cubic"):
        raise cx.unsupported(f"mode {mode!r}")
    extrapolated = np.zeros(tuple(sizes), dtype=bool)
    for ax in range(rank):
        in_w, out_w, s = x.shape[ax], sizes[ax], scales[ax]
        r = (roi[ax], roi[ax + rank]) if roi is not None else (0.0, 1.0)
        if np.isclose(s, 1.0) and out_w == in_w and np.isclose(r[0], 0.0) and np.isclose(r[1], 1.0):
            continue
        try:
            idx, w, ext = _resize_taps(mode, coord, nearest, in_w, out_w, s, r, cubic_a, exclude_outside, antialias)
        except (ValueError, KeyError) as e:
            raise cx.unsupported(str(e)) from None
        if ext is not None:
            extrapolated |= ext.reshape((-1,) + (1,) * (rank - ax - 1))
        wshape = (out_w,) + (1,) * (rank - ax - 1)
        acc = None
        for t in range(idx.shape[1]):
            if not w[:, t].any():
                continue
            g = cx.add("Gather", [x, cx.constant(idx[:, t].copy())], axis=ax)
            if not np.all(w[:, t] == 1.0):
                g = cx.add("Mul", [g, cx.constant(w[:, t].astype(x.dtype).reshape(wshape))])
            acc = g if acc is None else cx.add("Add", [acc, g])
        x = acc if acc is not None else cx.add("Mul", [cx.add("Gather", [x, cx.constant(idx[:, 0].copy())], axis=ax),
                                                       _scalar(cx, 0, x)])
    if extrapolated.any():
        x = cx.add("Where", [cx.constant(extrapolated), _scalar(cx, extrapolation_value, x), x])
    return x


@importer("Resize", "Upsample")
def imp_resize(cx: Ctx, ins: list[Value | None]) -> list[Value]:
    x = ins[0]
    rank = len(x.shape)
    mode = cx.attr("mode", "nearest")
    if cx.node.op_type == "Upsample" or cx.opset < 11:  # asymmetric coordinates, scales only
        if cx.node.op_type == "Upsample" and cx.opset < 9:
            scales = list(cx.attr("scales"))
        else:
            scales = cx.const(ins[1], "scales").astype(np.float64).tolist()
        mode = {"bilinear": "linear", "trilinear": "linear"}.get(mode, mode)
        sizes = [int(d * s) for d, s in zip(x.shape, scales)]
        return [_resize(cx, x, scales, sizes, mode, "asymmetric", "floor" if cx.node.op_type == "Upsample"
                        else "simple", None)]
    roi_v, scales_v, sizes_v = _opt(ins, 1), _opt(ins, 2), _opt(ins, 3)
    axes = [_axis(a, rank, cx) for a in cx.attr("axes", list(range(rank)))]
    roi = cx.const(roi_v, "roi").astype(np.float64).tolist() if roi_v is not None and roi_v.type.size else None
    if roi is not None and len(roi) == 2 * len(axes) and len(axes) < rank:
        full = [0.0] * rank + [1.0] * rank
        for i, a in enumerate(axes):
            full[a], full[a + rank] = roi[i], roi[i + len(axes)]
        roi = full
    scales, sizes = [1.0] * rank, list(x.shape)
    if sizes_v is not None and sizes_v.type.size:
        given = cx.const(sizes_v, "sizes").tolist()
        for a, s in zip(axes, given):
            sizes[a] = int(s)
        scales = [sizes[i] / x.shape[i] for i in range(rank)]
        policy = cx.attr("keep_aspect_ratio_policy", "stretch")
        if policy != "stretch":
            pick = {"not_larger": min, "not_smaller": max}.get(policy)
            if pick is None:
                raise cx.unsupported(f"keep_aspect_ratio_policy {policy!r}")
            s = pick(scales[a] for a in axes)
            scales = [s if i in axes else 1.0 for i in range(rank)]
            sizes = [int(s * x.shape[i] + 0.5) if i in axes else x.shape[i] for i in range(rank)]
    elif scales_v is not None and scales_v.type.size:
        given = cx.const(scales_v, "scales").astype(np.float64).tolist()
        for a, s in zip(axes, given):
            scales[a] = s
        sizes = [int(d * s) for d, s in zip(x.shape, scales)]
    else:
        raise cx.unsupported("neither scales nor sizes given")
    if any(s <= 0 for s in scales):
        raise cx.unsupported(f"scales {scales} must be positive")
    return [_resize(cx, x, scales, sizes, mode, cx.attr("coordinate_transformation_mode", "half_pixel"),
                    cx.attr("nearest_mode", "round_prefer_floor"), roi, float(cx.attr("cubic_coeff_a", -0.75)),
                    bool(cx.attr("exclude_outside", 0)), bool(cx.attr("antialias", 0)),
                    float(cx.attr("extrapolation_value", 0.0)))]
