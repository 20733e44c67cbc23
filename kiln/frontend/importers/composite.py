"""ONNX ops that Kiln builds from its core set at import time."""
from __future__ import annotations

import numpy as np

from kiln.frontend.context import Ctx, dtype_of
from kiln.frontend.importers.registry import _axis, _opt, _scalar, fold_with_reference, importer
from kiln.graph import symbolic
from kiln.graph.ir import Value

# -- ops built from the core set at import ------------------------------------------------------------------




@importer("Trilu")
def imp_trilu(cx: Ctx, ins: list[Value | None]) -> list[Value]:
    x = ins[0]
    if len(x.shape) < 2:
        raise cx.unsupported(f"Trilu on rank-{len(x.shape)} input")
    k = int(cx.const(ins[1], "k").reshape(-1)[0]) if _opt(ins, 1) is not None else 0
    n, m = x.shape[-2:]
    # symbolic rows/columns (a causal mask over seq): the mask at the upper bounds, sliced to [n, m] at run time
    hi_n, hi_m = symbolic.upper(n, cx.graph.bounds), symbolic.upper(m, cx.graph.bounds)
    diff = np.arange(hi_m)[None, :] - np.arange(hi_n)[:, None]
    keep = cx.constant(diff >= k if cx.attr("upper", 1) else diff <= k)
    if not (symbolic.is_static(n) and symbolic.is_static(m)):
        keep = cx.add("Slice", [keep], starts=(0, 0), ends=(n, m), steps=(1, 1))
    return [cx.add("Where", [keep, x, _scalar(cx, 0, x)])]


@importer("Hardmax")
def imp_hardmax(cx: Ctx, ins: list[Value | None]) -> list[Value]:
    x = ins[0]
    rank = len(x.shape)
    axis = _axis(cx.attr("axis", -1 if cx.opset >= 13 else 1), rank, cx)
    src = x
    if cx.opset < 13:  # over the flattened [axis:] dims
        src = cx.add("Reshape", [x], shape=(symbolic.prod(x.shape[:axis]), symbolic.prod(x.shape[axis:])))
        axis = 1
    idx = cx.add("ArgReduce", [src], kind="max", axis=axis, keepdims=True, last=False)
    iota = np.arange(src.shape[axis], dtype=np.int64).reshape((-1,) + (1,) * (len(src.shape) - axis - 1))
    y = cx.add("Cast", [cx.add("Equal", [idx, cx.constant(iota)])], to=x.dtype)
    return [cx.add("Reshape", [y], shape=x.shape) if y.shape != x.shape else y]


@importer("DepthToSpace", "SpaceToDepth")
def imp_depth_space(cx: Ctx, ins: list[Value | None]) -> list[Value]:
    x = ins[0]
    if len(x.shape) != 4:
        raise cx.unsupported(f"{cx.node.op_type} on rank-{len(x.shape)} input")
    b, c, h, w = x.shape
    bs = int(cx.attr("blocksize"))
    mode = cx.attr("mode", "DCR")
    if mode not in ("DCR", "CRD"):
        raise cx.unsupported(f"mode {mode!r}")
    if cx.node.op_type == "DepthToSpace":
        if c % (bs * bs):
            raise cx.unsupported(f"{c} channels do not split into blocks of {bs}x{bs}")
        if mode == "DCR":
            t = cx.add("Reshape", [x], shape=(b, bs, bs, c // (bs * bs), h, w))
            t = cx.add("Transpose", [t], perm=(0, 3, 4, 1, 5, 2))
        else:
            t = cx.add("Reshape", [x], shape=(b, c // (bs * bs), bs, bs, h, w))
            t = cx.add("Transpose", [t], perm=(0, 1, 4, 2, 5, 3))
        return [cx.add("Reshape", [t], shape=(b, c // (bs * bs), h * bs, w * bs))]
    if h % bs or w % bs:
        raise cx.unsupported(f"spatial size {h}x{w} is not a multiple of blocksize {bs}")
    t = cx.add("Reshape", [x], shape=(b, c, h // bs, bs, w // bs, bs))
    t = cx.add("Transpose", [t], perm=(0, 3, 5, 1, 2, 4) if mode == "DCR" else (0, 1, 3, 5, 2, 4))
    return [cx.add("Reshape", [t], shape=(b, c * bs * bs, h // bs, w // bs))]


def _rsqrt(cx: Ctx, v: Value, eps: float) -> Value:
    return cx.add("Div", [_scalar(cx, 1.0, v), cx.add("Sqrt", [cx.add("Add", [v, _scalar(cx, eps, v)])])])


@importer("LpNormalization")
def imp_lp_normalization(cx: Ctx, ins: list[Value | None]) -> list[Value]:
    x = ins[0]
    p = int(cx.attr("p", 2))
    if p not in (1, 2):
        raise cx.unsupported(f"p={p}")
    axis = _axis(cx.attr("axis", -1), len(x.shape), cx)
    norm = cx.add("Reduce", [x], kind="l1" if p == 1 else "l2", axes=(axis,), keepdims=True)
    zero = _scalar(cx, 0, x)
    return [cx.add("Where", [cx.add("Equal", [norm, zero]), zero, cx.add("Div", [x, norm])])]


@importer("MeanVarianceNormalization")
def imp_mvn(cx: Ctx, ins: list[Value | None]) -> list[Value]:
    x = ins[0]
    axes = tuple(sorted(_axis(a, len(x.shape), cx) for a in cx.attr("axes", [0, 2, 3])))
    mean = cx.add("Reduce", [x], kind="mean", axes=axes, keepdims=True)
    d = cx.add("Sub", [x, mean])
    std = cx.add("Sqrt", [cx.add("Reduce", [cx.add("Mul", [d, d])], kind="mean", axes=axes, keepdims=True)])
    return [cx.add("Div", [d, cx.add("Add", [std, _scalar(cx, 1e-9, x)])])]


@importer("GroupNormalization")
def imp_group_norm(cx: Ctx, ins: list[Value | None]) -> list[Value]:
    x, scale, bias = ins[:3]
    g, eps = int(cx.attr("num_groups")), float(cx.attr("epsilon", 1e-5))
    n, c = x.shape[:2]
    if c % g:
        raise cx.unsupported(f"{c} channels do not split into {g} groups")
    xr = cx.add("Reshape", [x], shape=(n, g, x.type.size // max(n * g, 1)))
    mean = cx.add("Reduce", [xr], kind="mean", axes=(2,), keepdims=True)
    d = cx.add("Sub", [xr, mean])
    var = cx.add("Reduce", [cx.add("Mul", [d, d])], kind="mean", axes=(2,), keepdims=True)
    y = cx.add("Mul", [d, _rsqrt(cx, var, eps)])
    if scale.shape == (g,) and g != c:  # opset 18: one scale and bias per group
        y = cx.add("Add", [cx.add("Mul", [y, cx.add("Reshape", [scale], shape=(g, 1))]),
                           cx.add("Reshape", [bias], shape=(g, 1))])
        return [cx.add("Reshape", [y], shape=x.shape)]
    y = cx.add("Reshape", [y], shape=x.shape)
    cshape = (c,) + (1,) * (len(x.shape) - 2)
    return [cx.add("Add", [cx.add("Mul", [y, cx.add("Reshape", [scale], shape=cshape)]),
                           cx.add("Reshape", [bias], shape=cshape)])]


@importer("RMSNormalization")
def imp_rms_norm(cx: Ctx, ins: list[Value | None]) -> list[Value]:
    x, scale = ins[:2]
    axis = _axis(cx.attr("axis", -1), len(x.shape), cx)
    axes = tuple(range(axis, len(x.shape)))
    ms = cx.add("Reduce", [x], kind="sumsquare", axes=axes, keepdims=True)
    count = float(np.prod([x.shape[a] for a in axes]))
    ms = cx.add("Mul", [ms, _scalar(cx, 1.0 / count, x)])
    return [cx.add("Mul", [cx.add("Mul", [x, _rsqrt(cx, ms, float(cx.attr("epsilon", 1e-5)))]), scale])]


@importer("OneHot")
def imp_one_hot(cx: Ctx, ins: list[Value | None]) -> list[Value]:
    idx, depth_v, values = ins[:3]
    depth = int(cx.const(depth_v, "depth").reshape(-1)[0])
    rank = len(idx.shape) + 1
    axis = _axis(cx.attr("axis", -1), rank, cx)
    k = cx.add("Cast", [idx], to="int64") if idx.dtype != "int64" else idx
    k = cx.add("Where", [cx.add("Less", [k, cx.constant(np.array(0, np.int64))]),
                         cx.add("Add", [k, cx.constant(np.array(depth, np.int64))]), k])
    shape = list(idx.shape)
    shape.insert(axis, 1)
    k = cx.add("Reshape", [k], shape=tuple(shape))
    iota = cx.constant(np.arange(depth, dtype=np.int64).reshape((depth,) + (1,) * (rank - axis - 1)))
    hit = cx.add("Equal", [k, iota])
    off = cx.add("Slice", [values], starts=(0,), ends=(1,), steps=(1,))
    on = cx.add("Slice", [values], starts=(1,), ends=(2,), steps=(1,))
    return [cx.add("Where", [hit, on, off])]


@importer("EyeLike")
def imp_eye_like(cx: Ctx, ins: list[Value | None]) -> list[Value]:
    x = ins[0]
    if len(x.shape) != 2:
        raise cx.unsupported(f"EyeLike on rank-{len(x.shape)} input")
    dt = dtype_of(cx.attr("dtype"), cx.name) if cx.attr("dtype") is not None else x.dtype
    dt = "float32" if dt == "float16" else dt
    return [cx.constant(np.eye(x.shape[0], x.shape[1], k=int(cx.attr("k", 0)), dtype=dt))]


@importer("NonZero")
def imp_nonzero(cx: Ctx, ins: list[Value | None]) -> list[Value]:
    x = cx.const(ins[0], "X")  # the output's shape depends on the values: only constants
    return [cx.constant(np.array(np.nonzero(x), dtype=np.int64).reshape(x.ndim, -1))]


@importer("Compress")
def imp_compress(cx: Ctx, ins: list[Value | None]) -> list[Value]:
    x = ins[0]
    cond = cx.const(ins[1], "condition").astype(bool).reshape(-1)
    axis = cx.attr("axis")
    if axis is None:
        x = cx.add("Reshape", [x], shape=(x.type.size,))
        axis = 0
    axis = _axis(axis, len(x.shape), cx)
    keep = np.nonzero(cond[:x.shape[axis]])[0].astype(np.int64)
    return [cx.add("Gather", [x, cx.constant(keep)], axis=axis)]


@importer("CenterCropPad")
def imp_center_crop_pad(cx: Ctx, ins: list[Value | None]) -> list[Value]:
    x = ins[0]
    rank = len(x.shape)
    target = cx.const(ins[1], "shape").tolist()
    axes = [_axis(a, rank, cx) for a in cx.attr("axes", list(range(rank)))]
    starts, ends, pads = [0] * rank, list(x.shape), [0] * (2 * rank)
    for a, t in zip(axes, target):
        d = x.shape[a]
        if t < d:
            starts[a] = (d - t) // 2
            ends[a] = starts[a] + t
        elif t > d:
            pads[a] = (t - d) // 2
            pads[a + rank] = t - d - pads[a]
    y = cx.add("Slice", [x], starts=tuple(starts), ends=tuple(ends), steps=(1,) * rank)
    return [cx.add("Pad", [y], pads=tuple(pads), mode="constant", value=0.0) if any(pads) else y]


@importer("HannWindow", "HammingWindow", "BlackmanWindow")
def imp_window(cx: Ctx, ins: list[Value | None]) -> list[Value]:
    cx.const(ins[0], "size")
    return fold_with_reference(cx, ins)
