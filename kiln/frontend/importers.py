"""One import function per ONNX op type, registered in IMPORTERS.

Each takes the import context and the node's input Values (None for an omitted optional input) and
returns the Values of the node's outputs, built from Kiln core ops with every attribute normalized
(explicit axes, pads, shapes; opset differences resolved here and nowhere else)."""
from __future__ import annotations

from collections.abc import Callable

import numpy as np

from kiln.frontend.onnx import Ctx, dtype_of
from kiln.graph.ir import Value
from kiln.graph.ops import conv_out

Importer = Callable[[Ctx, list[Value | None]], list[Value]]
IMPORTERS: dict[str, Importer] = {}


def importer(*names: str) -> Callable[[Importer], Importer]:
    def reg(fn: Importer) -> Importer:
        for n in names:
            IMPORTERS[n] = fn
        return fn
    return reg


def fold_with_reference(cx: Ctx, ins: list[Value | None]) -> list[Value]:
    """Evaluate an all-constant node with ONNX's reference implementation (ops Kiln only meets in
    shape arithmetic: Range, NonZero, ...)."""
    from onnx.reference import ReferenceEvaluator

    try:
        feeds = {n: v.const for n, v in zip(cx.node.input, ins) if v is not None}
        outs = ReferenceEvaluator(cx.node, opsets={"": cx.opset}).run(None, feeds)
    except Exception as e:
        raise cx.unsupported(f"constant evaluation failed: {e}") from None
    return [cx.constant(np.asarray(o)) for o in outs]


def _axis(ax: int, rank: int, cx: Ctx) -> int:
    if not -rank <= ax < max(rank, 1):
        raise cx.unsupported(f"axis {ax} is out of range for rank {rank}")
    return ax % max(rank, 1)


# -- elementwise ---------------------------------------------------------------------------------------------
_UNARY = ["Relu", "Sigmoid", "Tanh", "Exp", "Log", "Sqrt", "Neg", "Abs", "Erf", "Reciprocal", "Floor", "Ceil",
          "Round", "Sin", "Cos", "Softplus", "Sign", "Not", "HardSwish", "Mish"]


@importer(*_UNARY)
def imp_unary(cx: Ctx, ins: list[Value | None]) -> list[Value]:
    return [cx.add(cx.node.op_type, ins[:1])]


@importer("Identity", "Dropout")
def imp_identity(cx: Ctx, ins: list[Value | None]) -> list[Value]:
    training = len(ins) > 2 and ins[2] is not None and cx.const(ins[2], "training_mode").any()
    if cx.node.op_type == "Dropout" and training:
        raise cx.unsupported("training_mode=True (random dropout)")
    if cx.node.op_type == "Dropout" and len(cx.node.output) > 1:  # inference: the mask is all true
        return [ins[0], cx.constant(np.ones(ins[0].shape, dtype=bool))]
    return [ins[0]]


@importer("LeakyRelu", "Elu", "HardSigmoid", "Selu", "Gelu", "ThresholdedRelu", "Celu")
def imp_param_unary(cx: Ctx, ins: list[Value | None]) -> list[Value]:
    op = cx.node.op_type
    if op == "LeakyRelu":
        return [cx.add(op, ins[:1], alpha=float(cx.attr("alpha", 0.01)))]
    if op in ("Elu", "Celu", "ThresholdedRelu"):
        return [cx.add(op, ins[:1], alpha=float(cx.attr("alpha", 1.0)))]
    if op == "HardSigmoid":
        return [cx.add(op, ins[:1], alpha=float(cx.attr("alpha", 0.2)), beta=float(cx.attr("beta", 0.5)))]
    if op == "Selu":
        return [cx.add(op, ins[:1], alpha=float(cx.attr("alpha", 1.67326319217681884765625)),
                       gamma=float(cx.attr("gamma", 1.05070102214813232421875)))]
    return [cx.add(op, ins[:1], approximate=cx.attr("approximate", "none"))]  # Gelu


@importer("Clip")
def imp_clip(cx: Ctx, ins: list[Value | None]) -> list[Value]:
    if cx.opset < 11:
        lo, hi = cx.attr("min", -np.inf), cx.attr("max", np.inf)
    else:
        lo = float(cx.const(ins[1], "min").reshape(-1)[0]) if len(ins) > 1 and ins[1] is not None else -np.inf
        hi = float(cx.const(ins[2], "max").reshape(-1)[0]) if len(ins) > 2 and ins[2] is not None else np.inf
    return [cx.add("Clip", ins[:1], min=float(lo), max=float(hi))]


@importer("Cast")
def imp_cast(cx: Ctx, ins: list[Value | None]) -> list[Value]:
    return [cx.add("Cast", ins[:1], to=dtype_of(cx.attr("to"), cx.name))]


@importer("Add", "Sub", "Mul", "Div", "Pow", "PRelu", "Equal", "Less", "Greater", "LessOrEqual",
          "GreaterOrEqual", "And", "Or", "Xor", "Mod")
def imp_binary(cx: Ctx, ins: list[Value | None]) -> list[Value]:
    a, b = ins[0], ins[1]
    if cx.node.op_type == "Mod":
        fmod = int(cx.attr("fmod", 0))
        if fmod == 0 and a.dtype.startswith("float"):  # ONNX requires fmod=1 for floats
            raise cx.unsupported("Mod with fmod=0 on floats is not supported")
        return [cx.add("Mod", [a, b], fmod=fmod)]
    if cx.node.op_type == "PRelu" and len(b.shape) < len(a.shape) and b.shape and b.shape[-1] == a.shape[1] \
            and len(b.shape) == 1 and a.shape[-1] != b.shape[-1]:
        b = cx.add("Reshape", [b], shape=(b.shape[0],) + (1,) * (len(a.shape) - 2))  # opset-7 style slope
    return [cx.add(cx.node.op_type, [a, b])]


@importer("Where")
def imp_where(cx: Ctx, ins: list[Value | None]) -> list[Value]:
    return [cx.add("Where", ins[:3])]


@importer("Sum", "Max", "Min", "Mean")
def imp_variadic(cx: Ctx, ins: list[Value | None]) -> list[Value]:
    op = {"Sum": "Add", "Mean": "Add", "Max": "Max", "Min": "Min"}[cx.node.op_type]
    acc = ins[0]
    for v in ins[1:]:
        acc = cx.add(op, [acc, v])
    if cx.node.op_type == "Mean" and len(ins) > 1:
        acc = cx.add("Mul", [acc, cx.constant(np.array(1.0 / len(ins), dtype=acc.dtype))])
    return [acc]


# -- matrix products ----------------------------------------------------------------------------------------
@importer("MatMul")
def imp_matmul(cx: Ctx, ins: list[Value | None]) -> list[Value]:
    a, b = ins[0], ins[1]
    batch_a, batch_b = a.shape[:-2] if len(a.shape) > 1 else (), b.shape[:-2] if len(b.shape) > 1 else ()
    out_shape = np.broadcast_shapes(batch_a, batch_b)
    a2 = cx.add("Reshape", [a], shape=(1, a.shape[0])) if len(a.shape) == 1 else a
    b2 = cx.add("Reshape", [b], shape=(b.shape[0], 1)) if len(b.shape) == 1 else b
    y = cx.add("MatMul", [a2, b2])
    if len(a.shape) == 1 or len(b.shape) == 1:  # numpy's vector rules: drop the added unit dimension
        final = (tuple(out_shape) + ((a.shape[-2],) if len(a.shape) > 1 else ())
                 + ((b.shape[-1],) if len(b.shape) > 1 else ()))
        y = cx.add("Reshape", [y], shape=final)
    return [y]


@importer("Gemm")
def imp_gemm(cx: Ctx, ins: list[Value | None]) -> list[Value]:
    a, b, c = ins[0], ins[1], ins[2] if len(ins) > 2 else None
    alpha, beta = float(cx.attr("alpha", 1.0)), float(cx.attr("beta", 1.0))
    if cx.attr("transA", 0):
        a = cx.add("Transpose", [a], perm=(1, 0))
    if cx.attr("transB", 0):
        b = cx.add("Transpose", [b], perm=(1, 0))
    y = cx.add("MatMul", [a, b])
    if alpha != 1.0:
        y = cx.add("Mul", [y, cx.constant(np.array(alpha, dtype=y.dtype))])
    if c is not None and beta != 0.0:
        if beta != 1.0:
            c = cx.add("Mul", [c, cx.constant(np.array(beta, dtype=c.dtype))])
        y = cx.add("Add", [y, c])
    return [y]


# -- convolution and pooling ---------------------------------------------------------------------------------
def _window(cx: Ctx, in_shape: tuple[int, ...], kernel: tuple[int, ...], ceil: bool = False) -> dict:
    nd = len(kernel)
    strides = tuple(cx.attr("strides", [1] * nd))
    dil = tuple(cx.attr("dilations", [1] * nd))
    pads = list(cx.attr("pads", [0] * (2 * nd)))
    auto = cx.attr("auto_pad", "NOTSET")
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        for i in range(nd):
            out = -(-in_shape[2 + i] // strides[i])
            total = max(0, (out - 1) * strides[i] + dil[i] * (kernel[i] - 1) + 1 - in_shape[2 + i])
            lo = total // 2 if auto == "SAME_UPPER" else total - total // 2
            pads[i], pads[i + nd] = lo, total - lo
    elif auto == "VALID":
        pads = [0] * (2 * nd)
    elif auto != "NOTSET":
        raise cx.unsupported(f"auto_pad={auto!r}")
    count_pads = tuple(pads)
    if ceil:  # grow the high pads so the floor formula gives ceil_mode's size (window must start inside)
        for i in range(nd):
            size, k, s = in_shape[2 + i], dil[i] * (kernel[i] - 1) + 1, strides[i]
            want = -(-(size + pads[i] + pads[i + nd] - k) // s) + 1
            if (want - 1) * s >= size + pads[i]:
                want -= 1
            while conv_out(size, kernel[i], s, pads[i], pads[i + nd], dil[i]) < want:
                pads[i + nd] += 1
    return {"strides": strides, "pads": tuple(pads), "dilations": dil, "count_pads": count_pads}


@importer("Conv")
def imp_conv(cx: Ctx, ins: list[Value | None]) -> list[Value]:
    x, w = ins[0], ins[1]
    if len(x.shape) not in (3, 4, 5):
        raise cx.unsupported(f"Conv on rank-{len(x.shape)} input")
    win = _window(cx, x.shape, tuple(w.shape[2:]))
    win.pop("count_pads")
    args = [x, w] + ([ins[2]] if len(ins) > 2 and ins[2] is not None else [])
    return [cx.add("Conv", args, group=int(cx.attr("group", 1)), **win)]


@importer("ConvTranspose")
def imp_conv_transpose(cx: Ctx, ins: list[Value | None]) -> list[Value]:
    x, w = ins[0], ins[1]
    nd = len(w.shape) - 2
    if cx.attr("output_shape") is not None or cx.attr("auto_pad", "NOTSET") != "NOTSET":
        raise cx.unsupported("output_shape / auto_pad on ConvTranspose")
    attrs = dict(group=int(cx.attr("group", 1)), strides=tuple(cx.attr("strides", [1] * nd)),
                 pads=tuple(cx.attr("pads", [0] * 2 * nd)), dilations=tuple(cx.attr("dilations", [1] * nd)),
                 output_padding=tuple(cx.attr("output_padding", [0] * nd)))
    args = [x, w] + ([ins[2]] if len(ins) > 2 and ins[2] is not None else [])
    return [cx.add("ConvTranspose", args, **attrs)]


@importer("MaxPool", "AveragePool", "LpPool")
def imp_pool(cx: Ctx, ins: list[Value | None]) -> list[Value]:
    x = ins[0]
    if len([o for o in cx.node.output if o]) > 1:
        raise cx.unsupported("MaxPool's Indices output is not supported")
    kernel = tuple(cx.attr("kernel_shape"))
    win = _window(cx, x.shape, kernel, ceil=bool(cx.attr("ceil_mode", 0)))
    kind = {"MaxPool": "max", "AveragePool": "avg", "LpPool": "lp"}[cx.node.op_type]
    if kind == "avg" and any(d != 1 for d in win["dilations"]):
        raise cx.unsupported("AveragePool with dilations")
    return [cx.add("Pool", [x], kind=kind, kernel=kernel, include_pad=bool(cx.attr("count_include_pad", 0)),
                   p=int(cx.attr("p", 2)), **win)]


@importer("GlobalAveragePool", "GlobalMaxPool")
def imp_global_pool(cx: Ctx, ins: list[Value | None]) -> list[Value]:
    x = ins[0]
    kind = "mean" if cx.node.op_type == "GlobalAveragePool" else "max"
    return [cx.add("Reduce", [x], kind=kind, axes=tuple(range(2, len(x.shape))), keepdims=True)]


# -- normalizations ------------------------------------------------------------------------------------------
@importer("BatchNormalization")
def imp_batchnorm(cx: Ctx, ins: list[Value | None]) -> list[Value]:
    if len([o for o in cx.node.output if o]) > 1 or cx.attr("training_mode", 0):
        raise cx.unsupported("training-mode BatchNormalization")
    return [cx.add("BatchNormalization", ins[:5], epsilon=float(cx.attr("epsilon", 1e-5)))]


@importer("LayerNormalization")
def imp_layernorm(cx: Ctx, ins: list[Value | None]) -> list[Value]:
    if len([o for o in cx.node.output if o]) > 1:
        raise cx.unsupported("LayerNormalization's Mean/InvStdDev outputs")
    x = ins[0]
    args = [x, ins[1]] + ([ins[2]] if len(ins) > 2 and ins[2] is not None else [])
    return [cx.add("LayerNormalization", args, axis=_axis(cx.attr("axis", -1), len(x.shape), cx),
                   epsilon=float(cx.attr("epsilon", 1e-5)))]


@importer("InstanceNormalization")
def imp_instancenorm(cx: Ctx, ins: list[Value | None]) -> list[Value]:
    return [cx.add("InstanceNormalization", ins[:3], epsilon=float(cx.attr("epsilon", 1e-5)))]


@importer("LRN")
def imp_lrn(cx: Ctx, ins: list[Value | None]) -> list[Value]:
    return [cx.add("LRN", ins[:1], size=int(cx.attr("size")), alpha=float(cx.attr("alpha", 1e-4)),
                   beta=float(cx.attr("beta", 0.75)), bias=float(cx.attr("bias", 1.0)))]


@importer("Softmax", "LogSoftmax")
def imp_softmax(cx: Ctx, ins: list[Value | None]) -> list[Value]:
    x, op = ins[0], cx.node.op_type
    rank = len(x.shape)
    axis = _axis(cx.attr("axis", -1 if cx.opset >= 13 else 1), rank, cx)
    if cx.opset >= 13 or axis == rank - 1:
        return [cx.add(op, [x], axis=axis)]
    # opset < 13: softmax over all dims from `axis` on, as one flattened row
    rows = int(np.prod(x.shape[:axis], dtype=np.int64))
    flat = cx.add("Reshape", [x], shape=(rows, int(np.prod(x.shape[axis:], dtype=np.int64))))
    return [cx.add("Reshape", [cx.add(op, [flat], axis=1)], shape=x.shape)]


# -- reductions ----------------------------------------------------------------------------------------------
_REDUCE_KIND = {"ReduceSum": "sum", "ReduceMean": "mean", "ReduceMax": "max", "ReduceMin": "min",
                "ReduceProd": "prod", "ReduceL1": "l1", "ReduceL2": "l2", "ReduceSumSquare": "sumsquare",
                "ReduceLogSumExp": "logsumexp", "ReduceLogSum": "logsum"}


@importer(*_REDUCE_KIND)
def imp_reduce(cx: Ctx, ins: list[Value | None]) -> list[Value]:
    x = ins[0]
    rank = len(x.shape)
    axes_from_input = cx.opset >= 18 or (cx.node.op_type == "ReduceSum" and cx.opset >= 13)
    if axes_from_input:
        axes = cx.const(ins[1], "axes").tolist() if len(ins) > 1 and ins[1] is not None else None
    else:
        axes = cx.attr("axes")
    if not axes:
        if axes_from_input and cx.attr("noop_with_empty_axes", 0):  # over no axes: only the per-element term
            kind = _REDUCE_KIND[cx.node.op_type]
            if kind in ("l1", "l2"):
                return [cx.add("Abs", [x])]
            return [cx.add("Mul", [x, x]) if kind == "sumsquare" else cx.add("Log", [x]) if kind == "logsum"
                    else x]
        axes = list(range(rank))
    axes = tuple(sorted(_axis(int(a), rank, cx) for a in axes))
    return [cx.add("Reduce", [x], kind=_REDUCE_KIND[cx.node.op_type], axes=axes,
                   keepdims=bool(cx.attr("keepdims", 1)))]


@importer("ArgMax", "ArgMin")
def imp_argreduce(cx: Ctx, ins: list[Value | None]) -> list[Value]:
    if cx.attr("select_last_index", 0):
        raise cx.unsupported("select_last_index=1")
    x = ins[0]
    return [cx.add("ArgReduce", [x], kind=cx.node.op_type[3:].lower(),
                   axis=_axis(cx.attr("axis", 0), len(x.shape), cx), keepdims=bool(cx.attr("keepdims", 1)))]


# -- shapes and data movement --------------------------------------------------------------------------------
@importer("Shape")
def imp_shape(cx: Ctx, ins: list[Value | None]) -> list[Value]:
    shape = np.array(ins[0].shape, dtype=np.int64)
    rank = len(shape)
    start, end = cx.attr("start", 0), cx.attr("end", rank)
    return [cx.constant(shape[start:end])]


@importer("Size")
def imp_size(cx: Ctx, ins: list[Value | None]) -> list[Value]:
    return [cx.constant(np.array(ins[0].type.size, dtype=np.int64))]


@importer("Constant")
def imp_constant(cx: Ctx, ins: list[Value | None]) -> list[Value]:
    for key in ("value", "value_float", "value_floats", "value_int", "value_ints"):
        v = cx.attr(key)
        if v is not None:
            dtype = np.float32 if "float" in key else (np.int64 if "int" in key else None)
            return [cx.constant(np.asarray(v, dtype=dtype) if dtype else np.asarray(v))]
    raise cx.unsupported("Constant without a numeric value")


@importer("ConstantOfShape")
def imp_constant_of_shape(cx: Ctx, ins: list[Value | None]) -> list[Value]:
    shape = cx.const(ins[0], "shape").astype(np.int64)
    value = cx.attr("value")
    fill = np.zeros(1, np.float32) if value is None else np.asarray(value).reshape(-1)
    return [cx.constant(np.full(tuple(shape.tolist()), fill[0], dtype=fill.dtype))]


def _reshape_target(cx: Ctx, in_shape: tuple[int, ...], shape: list[int]) -> tuple[int, ...]:
    allowzero = cx.attr("allowzero", 0)
    out = [in_shape[i] if d == 0 and not allowzero else d for i, d in enumerate(shape)]
    if out.count(-1) > 1:
        raise cx.unsupported(f"Reshape target {shape} has more than one -1")
    if -1 in out:
        known = int(np.prod([d for d in out if d != -1], dtype=np.int64))
        out[out.index(-1)] = int(np.prod(in_shape, dtype=np.int64)) // max(known, 1)
    return tuple(int(d) for d in out)


@importer("Reshape")
def imp_reshape(cx: Ctx, ins: list[Value | None]) -> list[Value]:
    shape = cx.attr("shape") if cx.opset < 5 else cx.const(ins[1], "shape").tolist()
    return [cx.add("Reshape", ins[:1], shape=_reshape_target(cx, ins[0].shape, list(shape)))]


@importer("Flatten")
def imp_flatten(cx: Ctx, ins: list[Value | None]) -> list[Value]:
    x = ins[0]
    axis, rank = cx.attr("axis", 1), len(x.shape)
    if not -rank <= axis <= rank:
        raise cx.unsupported(f"axis {axis} is out of range for rank {rank}")
    axis = axis + rank if axis < 0 else axis  # in [-r, r]: -1 is r - 1, not r
    rows = int(np.prod(x.shape[:axis], dtype=np.int64))
    return [cx.add("Reshape", [x], shape=(rows, x.type.size // max(rows, 1)))]


@importer("Squeeze", "Unsqueeze")
def imp_squeeze(cx: Ctx, ins: list[Value | None]) -> list[Value]:
    x = ins[0]
    if cx.opset >= 13:
        axes = cx.const(ins[1], "axes").tolist() if len(ins) > 1 and ins[1] is not None else None
    else:
        axes = cx.attr("axes")
    shape = list(x.shape)
    if cx.node.op_type == "Squeeze":
        axes = ([i for i, d in enumerate(shape) if d == 1] if axes is None
                else [_axis(a, len(shape), cx) for a in axes])
        for a in axes:
            if shape[a] != 1:
                raise cx.unsupported(f"Squeeze of axis {a} with size {shape[a]}")
        out = [d for i, d in enumerate(shape) if i not in axes]
    else:
        rank = len(shape) + len(axes)
        out = shape
        for a in sorted(_axis(a, rank, cx) for a in axes):
            out.insert(a, 1)
    return [cx.add("Reshape", [x], shape=tuple(out))]


@importer("Transpose")
def imp_transpose(cx: Ctx, ins: list[Value | None]) -> list[Value]:
    rank = len(ins[0].shape)
    perm = tuple(cx.attr("perm", list(range(rank))[::-1]))
    if sorted(perm) != list(range(rank)):
        raise cx.unsupported(f"perm {perm} is not a permutation of {rank} axes")
    return [cx.add("Transpose", ins[:1], perm=perm)]


@importer("Concat")
def imp_concat(cx: Ctx, ins: list[Value | None]) -> list[Value]:
    vals = [v for v in ins if v is not None and v.type.size > 0]
    return [cx.add("Concat", vals, axis=_axis(cx.attr("axis"), len(ins[0].shape), cx))]


def _slice_attrs(shape: tuple[int, ...], starts: list[int], ends: list[int], axes: list[int],
                 steps: list[int]) -> dict:
    rank = len(shape)
    s, e, st = [0] * rank, list(shape), [1] * rank
    for a, b, c, d in zip(axes, starts, ends, steps):
        a %= rank
        n = shape[a]
        if d == 0:
            raise ValueError("Slice step 0")
        lo_clamp, hi_clamp = (0, n) if d > 0 else (-1, n - 1)
        b = b + n if b < 0 else b
        c = c + n if c < 0 else c
        s[a], e[a], st[a] = min(max(b, lo_clamp), hi_clamp), min(max(c, lo_clamp), hi_clamp), d
    return {"starts": tuple(s), "ends": tuple(e), "steps": tuple(st)}


@importer("Slice")
def imp_slice(cx: Ctx, ins: list[Value | None]) -> list[Value]:
    x = ins[0]
    if cx.opset < 10:
        starts, ends = cx.attr("starts"), cx.attr("ends")
        axes = cx.attr("axes", list(range(len(starts))))
        steps = [1] * len(starts)
    else:
        starts, ends = cx.const(ins[1], "starts").tolist(), cx.const(ins[2], "ends").tolist()
        given = lambda i, what, default: (cx.const(ins[i], what).tolist()  # noqa: E731
                                          if len(ins) > i and ins[i] is not None else default)
        axes, steps = given(3, "axes", list(range(len(starts)))), given(4, "steps", [1] * len(starts))
    big = np.iinfo(np.int64).max // 2
    starts = [max(min(v, big), -big) for v in starts]
    ends = [max(min(v, big), -big) for v in ends]
    try:
        attrs = _slice_attrs(x.shape, starts, ends, [_axis(a, len(x.shape), cx) for a in axes], steps)
    except ValueError as e:
        raise cx.unsupported(str(e)) from None
    return [cx.add("Slice", [x], **attrs)]


@importer("Split")
def imp_split(cx: Ctx, ins: list[Value | None]) -> list[Value]:
    x = ins[0]
    axis = _axis(cx.attr("axis", 0), len(x.shape), cx)
    n_out = len(cx.node.output)
    if cx.opset >= 13 and len(ins) > 1 and ins[1] is not None:
        sizes = cx.const(ins[1], "split").tolist()
    elif cx.opset < 13 and cx.attr("split") is not None:
        sizes = list(cx.attr("split"))
    else:
        dim = x.shape[axis]
        n = cx.attr("num_outputs", n_out)
        chunk = -(-dim // n)
        sizes = [min(chunk, dim - i * chunk) for i in range(n)]
    if sum(sizes) != x.shape[axis]:
        raise cx.unsupported(f"split sizes {sizes} do not add up to axis size {x.shape[axis]}")
    outs, start = [], 0
    for size in sizes:
        starts = [0] * len(x.shape)
        ends = list(x.shape)
        starts[axis], ends[axis] = start, start + size
        outs.append(cx.add("Slice", [x], starts=tuple(starts), ends=tuple(ends), steps=(1,) * len(x.shape)))
        start += size
    return outs


@importer("Gather")
def imp_gather(cx: Ctx, ins: list[Value | None]) -> list[Value]:
    x, idx = ins[0], ins[1]
    axis = _axis(cx.attr("axis", 0), len(x.shape), cx)
    if idx.const is not None:
        n = x.shape[axis]
        if np.any(idx.const < -n) or np.any(idx.const >= n):
            raise cx.unsupported(f"indices out of range for axis of size {n}")
    return [cx.add("Gather", [x, idx], axis=axis)]


@importer("Pad")
def imp_pad(cx: Ctx, ins: list[Value | None]) -> list[Value]:
    x = ins[0]
    rank = len(x.shape)
    mode = cx.attr("mode", "constant")
    if cx.opset < 11:
        pads, value = list(cx.attr("pads")), float(cx.attr("value", 0.0))
    else:
        pads = cx.const(ins[1], "pads").tolist()
        has_value = len(ins) > 2 and ins[2] is not None
        value = float(cx.const(ins[2], "constant_value").reshape(-1)[0]) if has_value else 0.0
        if len(ins) > 3 and ins[3] is not None:
            axes = [_axis(a, rank, cx) for a in cx.const(ins[3], "axes").tolist()]
            full = [0] * (2 * rank)
            for i, a in enumerate(axes):
                full[a], full[a + rank] = pads[i], pads[i + len(axes)]
            pads = full
    if mode not in ("constant", "reflect", "edge", "wrap"):
        raise cx.unsupported(f"mode {mode!r}")
    return [cx.add("Pad", [x], pads=tuple(int(p) for p in pads), mode=mode, value=value)]


@importer("Expand")
def imp_expand(cx: Ctx, ins: list[Value | None]) -> list[Value]:
    x = ins[0]
    shape = tuple(np.broadcast_shapes(x.shape, tuple(cx.const(ins[1], "shape").tolist())))
    return [cx.add("Expand", [x], shape=shape)]


@importer("Tile")
def imp_tile(cx: Ctx, ins: list[Value | None]) -> list[Value]:
    return [cx.add("Tile", ins[:1], repeats=tuple(cx.const(ins[1], "repeats").tolist()))]


@importer("Range")
def imp_range(cx: Ctx, ins: list[Value | None]) -> list[Value]:
    start, limit, delta = (cx.const(v, n) for v, n in zip(ins, ("start", "limit", "delta")))
    return [cx.constant(np.arange(start, limit, delta, dtype=start.dtype))]

