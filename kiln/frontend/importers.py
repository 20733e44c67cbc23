"""One import function per ONNX op type, registered in IMPORTERS.

Each takes the import context and the node's input Values (None for an omitted optional input) and
returns the Values of the node's outputs, built from Kiln core ops with every attribute normalized
(explicit axes, pads, shapes; opset differences resolved here and nowhere else)."""
from __future__ import annotations

import functools
from collections.abc import Callable

import numpy as np

from kiln.errors import KilnError, ModelError
from kiln.frontend.onnx import Ctx, dtype_of
from kiln.graph.ir import Value
from kiln.graph.ops import check_size, conv_out

Importer = Callable[[Ctx, list[Value | None]], list[Value]]
IMPORTERS: dict[str, Importer] = {}


def importer(*names: str) -> Callable[[Importer], Importer]:
    def reg(fn: Importer) -> Importer:
        @functools.wraps(fn)
        def guarded(cx: Ctx, ins: list[Value | None]) -> list[Value]:
            """A malformed node (missing input, bad attribute, inconsistent shapes) is a ModelError naming it,
            never a stray IndexError/TypeError/ZeroDivisionError from the import function."""
            try:
                return fn(cx, ins)
            except KilnError:
                raise
            except (IndexError, KeyError, TypeError, ValueError, ZeroDivisionError, AttributeError,
                    OverflowError) as e:
                raise ModelError(f"node '{cx.name}' ({cx.node.op_type}, opset {cx.opset}): invalid inputs or "
                                 f"attributes: {type(e).__name__}: {e}") from None
        for n in names:
            IMPORTERS[n] = guarded
        return guarded
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
          "Round", "Sin", "Cos", "Softplus", "Sign", "Not", "HardSwish", "Mish", "Tan", "Sinh", "Cosh", "Asin",
          "Acos", "Atan", "Asinh", "Acosh", "Atanh", "Softsign", "IsNaN"]


@importer(*_UNARY)
def imp_unary(cx: Ctx, ins: list[Value | None]) -> list[Value]:
    return [cx.add(cx.node.op_type, ins[:1])]


@importer("BitwiseNot")
def imp_bitwise_not(cx: Ctx, ins: list[Value | None]) -> list[Value]:
    return [cx.add("Not", ins[:1])]


@importer("Swish")
def imp_swish(cx: Ctx, ins: list[Value | None]) -> list[Value]:
    return [cx.add("Swish", ins[:1], alpha=float(cx.attr("alpha", 1.0)))]


@importer("Shrink")
def imp_shrink(cx: Ctx, ins: list[Value | None]) -> list[Value]:
    return [cx.add("Shrink", ins[:1], lambd=float(cx.attr("lambd", 0.5)), bias=float(cx.attr("bias", 0.0)))]


@importer("IsInf")
def imp_isinf(cx: Ctx, ins: list[Value | None]) -> list[Value]:
    return [cx.add("IsInf", ins[:1], positive=int(cx.attr("detect_positive", 1)),
                   negative=int(cx.attr("detect_negative", 1)))]


@importer("Identity", "Dropout")
def imp_identity(cx: Ctx, ins: list[Value | None]) -> list[Value]:
    training = len(ins) > 2 and ins[2] is not None and cx.const(ins[2], "training_mode").any()
    ratio = float(cx.const(ins[1], "ratio").reshape(-1)[0]) if len(ins) > 1 and ins[1] is not None else 0.5
    if cx.node.op_type == "Dropout" and training and ratio != 0.0:
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
    x = ins[0]
    if cx.opset < 11:
        lo, hi = cx.attr("min", -np.inf), cx.attr("max", np.inf)
        return [cx.add("Clip", [x], min=float(lo), max=float(hi))]
    bounds = [ins[i] if len(ins) > i and ins[i] is not None else None for i in (1, 2)]
    if all(b is None or b.const is not None for b in bounds):
        lo, hi = (float(b.const.reshape(-1)[0]) if b is not None else d for b, d in zip(bounds, (-np.inf, np.inf)))
        return [cx.add("Clip", [x], min=lo, max=hi)]
    if bounds[0] is not None:  # run-time bounds: min(max(x, lo), hi), as the spec defines Clip
        x = cx.add("Max", [x, bounds[0]])
    if bounds[1] is not None:
        x = cx.add("Min", [x, bounds[1]])
    return [x]


def cast_to(cx: Ctx, x: Value, to: str) -> Value:
    """Cast; float16 is stored as float32 rounded to half precision (Kiln computes in float32)."""
    if to == "float16":
        y = cx.add("Cast", [x], to="float32") if x.dtype != "float32" else x
        return cx.add("RoundFloat16", [y])
    return cx.add("Cast", [x], to=to)


@importer("Cast")
def imp_cast(cx: Ctx, ins: list[Value | None]) -> list[Value]:
    if cx.attr("saturate", 1) != 1 or cx.attr("round_mode", "up") != "up":
        pass  # only meaningful for float8 targets, which Kiln refuses by type anyway
    return [cast_to(cx, ins[0], dtype_of(cx.attr("to"), cx.name))]


@importer("CastLike")
def imp_cast_like(cx: Ctx, ins: list[Value | None]) -> list[Value]:
    return [cx.add("Cast", [ins[0]], to=ins[1].dtype)]


@importer("Add", "Sub", "Mul", "Div", "Pow", "PRelu", "Equal", "Less", "Greater", "LessOrEqual",
          "GreaterOrEqual", "And", "Or", "Xor", "Mod")
def imp_binary(cx: Ctx, ins: list[Value | None]) -> list[Value]:
    a, b = ins[0], ins[1]
    if cx.node.op_type == "Mod":
        fmod = int(cx.attr("fmod", 0))
        return [cx.add("Mod", [a, b], fmod=fmod)]
    if cx.node.op_type == "PRelu" and len(b.shape) < len(a.shape) and b.shape and b.shape[-1] == a.shape[1] \
            and len(b.shape) == 1 and a.shape[-1] != b.shape[-1]:
        b = cx.add("Reshape", [b], shape=(b.shape[0],) + (1,) * (len(a.shape) - 2))  # opset-7 style slope
    return [cx.add(cx.node.op_type, [a, b])]


@importer("BitwiseAnd", "BitwiseOr", "BitwiseXor")
def imp_bitwise(cx: Ctx, ins: list[Value | None]) -> list[Value]:
    return [cx.add({"BitwiseAnd": "BitAnd", "BitwiseOr": "BitOr", "BitwiseXor": "BitXor"}[cx.node.op_type], ins[:2])]


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
    if len(in_shape) != nd + 2 or len(strides) != nd or len(dil) != nd or len(pads) != 2 * nd:
        raise ModelError(f"node '{cx.name}': kernel {kernel}, strides {strides}, dilations {dil}, pads {pads} "
                         f"do not fit an input of shape {in_shape}")
    if min(kernel) < 1 or min(strides) < 1 or min(dil) < 1 or min(pads, default=0) < 0:
        raise ModelError(f"node '{cx.name}': kernel {kernel}, strides {strides} and dilations {dil} must be ≥ 1, "
                         f"pads {pads} ≥ 0")
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
    strides, dil = tuple(cx.attr("strides", [1] * nd)), tuple(cx.attr("dilations", [1] * nd))
    out_pad = tuple(cx.attr("output_padding", [0] * nd))
    auto, out_shape = cx.attr("auto_pad", "NOTSET"), cx.attr("output_shape")
    if auto not in ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"):
        raise cx.unsupported(f"auto_pad={auto!r}")
    pads = tuple(cx.attr("pads", [0] * 2 * nd)) if auto in ("NOTSET", "VALID") else None
    if out_shape is not None or pads is None:  # pads that give the requested output size (as onnxruntime)
        want = list(out_shape)[-nd:] if out_shape is not None else [x.shape[2 + i] * strides[i] for i in range(nd)]
        total = [strides[i] * (x.shape[2 + i] - 1) + out_pad[i] + (w.shape[2 + i] - 1) * dil[i] + 1 - want[i]
                 for i in range(nd)]
        lo = [t // 2 if auto == "SAME_UPPER" else t - t // 2 for t in total]
        pads = tuple(lo) + tuple(t - l for t, l in zip(total, lo))
    attrs = dict(group=int(cx.attr("group", 1)), strides=strides, pads=pads, dilations=dil, output_padding=out_pad)
    args = [x, w] + ([ins[2]] if len(ins) > 2 and ins[2] is not None else [])
    return [cx.add("ConvTranspose", args, **attrs)]


@importer("MaxPool", "AveragePool", "LpPool")
def imp_pool(cx: Ctx, ins: list[Value | None]) -> list[Value]:
    x = ins[0]
    if len(x.shape) < 3:
        raise cx.unsupported(f"{cx.node.op_type} on rank-{len(x.shape)} input")
    kernel = tuple(cx.attr("kernel_shape"))
    win = _window(cx, x.shape, kernel, ceil=bool(cx.attr("ceil_mode", 0)))
    kind = {"MaxPool": "max", "AveragePool": "avg", "LpPool": "lp"}[cx.node.op_type]
    y = cx.add("Pool", [x], kind=kind, kernel=kernel, include_pad=bool(cx.attr("count_include_pad", 0)),
               p=int(cx.attr("p", 2)), **win)
    if len(cx.node.output) > 1 and cx.node.output[1]:  # MaxPool's Indices: flat index of each maximum
        win.pop("count_pads")
        return [y, cx.add("MaxPoolIndex", [x], kernel=kernel, storage_order=int(cx.attr("storage_order", 0)),
                          **win)]
    return [y]


@importer("GlobalAveragePool", "GlobalMaxPool")
def imp_global_pool(cx: Ctx, ins: list[Value | None]) -> list[Value]:
    x = ins[0]
    kind = "mean" if cx.node.op_type == "GlobalAveragePool" else "max"
    return [cx.add("Reduce", [x], kind=kind, axes=tuple(range(2, len(x.shape))), keepdims=True)]


# -- normalizations ------------------------------------------------------------------------------------------
@importer("BatchNormalization")
def imp_batchnorm(cx: Ctx, ins: list[Value | None]) -> list[Value]:
    eps = float(cx.attr("epsilon", 1e-5))
    if not cx.attr("training_mode", 0):
        if len([o for o in cx.node.output if o]) > 1 and cx.opset >= 14:
            raise cx.unsupported("running mean/var outputs without training_mode")
        return [cx.add("BatchNormalization", ins[:5], epsilon=eps)]
    # training: normalize with the batch statistics; also output the updated running statistics
    x, scale, bias, mean, var = ins[:5]
    momentum = float(cx.attr("momentum", 0.9))
    axes = (0,) + tuple(range(2, len(x.shape)))
    bmean = cx.add("Reduce", [x], kind="mean", axes=axes, keepdims=True)
    d = cx.add("Sub", [x, bmean])
    bvar = cx.add("Reduce", [cx.add("Mul", [d, d])], kind="mean", axes=axes, keepdims=True)
    cshape = (x.shape[1],) + (1,) * (len(x.shape) - 2)
    rstd = cx.add("Div", [cx.constant(np.array(1.0, np.float32)),
                          cx.add("Sqrt", [cx.add("Add", [bvar, cx.constant(np.array(eps, np.float32))])])])
    y = cx.add("Add", [cx.add("Mul", [cx.add("Mul", [d, rstd]), cx.add("Reshape", [scale], shape=cshape)]),
                       cx.add("Reshape", [bias], shape=cshape)])
    m = cx.constant(np.array(momentum, np.float32))
    m1 = cx.constant(np.array(1.0 - momentum, np.float32))
    flat = lambda v: cx.add("Reshape", [v], shape=(x.shape[1],))  # noqa: E731
    run_mean = cx.add("Add", [cx.add("Mul", [mean, m]), cx.add("Mul", [flat(bmean), m1])])
    run_var = cx.add("Add", [cx.add("Mul", [var, m]), cx.add("Mul", [flat(bvar), m1])])
    return [y, run_mean, run_var]


@importer("LayerNormalization")
def imp_layernorm(cx: Ctx, ins: list[Value | None]) -> list[Value]:
    x = ins[0]
    args = [x, ins[1]] + ([ins[2]] if len(ins) > 2 and ins[2] is not None else [])
    axis, eps = _axis(cx.attr("axis", -1), len(x.shape), cx), float(cx.attr("epsilon", 1e-5))
    y = cx.add("LayerNormalization", args, axis=axis, epsilon=eps)
    if len([o for o in cx.node.output if o]) == 1:
        return [y]
    axes = tuple(range(axis, len(x.shape)))  # Mean and InvStdDev (keepdims), as training graphs read them
    mean = cx.add("Reduce", [x], kind="mean", axes=axes, keepdims=True)
    d = cx.add("Sub", [x, mean])
    var = cx.add("Reduce", [cx.add("Mul", [d, d])], kind="mean", axes=axes, keepdims=True)
    rstd = cx.add("Div", [cx.constant(np.array(1.0, np.float32)),
                          cx.add("Sqrt", [cx.add("Add", [var, cx.constant(np.array(eps, np.float32))])])])
    return [y, mean, rstd]


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
    axes = tuple(sorted({_axis(int(a), rank, cx) for a in axes}))  # [1, -1] name one axis once
    return [cx.add("Reduce", [x], kind=_REDUCE_KIND[cx.node.op_type], axes=axes,
                   keepdims=bool(cx.attr("keepdims", 1)))]


@importer("ArgMax", "ArgMin")
def imp_argreduce(cx: Ctx, ins: list[Value | None]) -> list[Value]:
    x = ins[0]
    return [cx.add("ArgReduce", [x], kind=cx.node.op_type[3:].lower(),
                   axis=_axis(cx.attr("axis", 0), len(x.shape), cx), keepdims=bool(cx.attr("keepdims", 1)),
                   last=bool(cx.attr("select_last_index", 0)))]


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
            arr = np.asarray(v, dtype=dtype) if dtype else np.asarray(v)
            return [cx.constant(arr.astype(np.float32) if arr.dtype == np.float16 else arr)]  # float16: widened
    raise cx.unsupported("Constant without a numeric value")


@importer("ConstantOfShape")
def imp_constant_of_shape(cx: Ctx, ins: list[Value | None]) -> list[Value]:
    shape = cx.const(ins[0], "shape").astype(np.int64)
    if np.any(shape < 0):
        raise ModelError(f"node '{cx.name}': negative dimension in shape {shape.tolist()}")
    check_size(int(np.prod(shape, dtype=np.float64)) * 4, cx.name)
    value = cx.attr("value")
    fill = np.zeros(1, np.float32) if value is None else np.asarray(value).reshape(-1)
    fill = fill.astype(np.float32) if fill.dtype == np.float16 else fill
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
    start, limit, delta = (cx.const(v, n).reshape(-1)[0] for v, n in zip(ins, ("start", "limit", "delta")))
    if delta == 0:
        raise ModelError(f"node '{cx.name}': Range with delta 0")
    n = max(int(np.ceil((float(limit) - float(start)) / float(delta))), 0)
    check_size(n * np.dtype(start.dtype).itemsize, cx.name)
    return [cx.constant(np.arange(start, limit, delta, dtype=start.dtype))]



# -- ops built from the core set at import ------------------------------------------------------------------
def _scalar(cx: Ctx, v: float, like: Value) -> Value:
    return cx.constant(np.array(v, dtype=like.dtype))


def _opt(ins: list[Value | None], i: int) -> Value | None:
    return ins[i] if len(ins) > i else None


@importer("Trilu")
def imp_trilu(cx: Ctx, ins: list[Value | None]) -> list[Value]:
    x = ins[0]
    if len(x.shape) < 2:
        raise cx.unsupported(f"Trilu on rank-{len(x.shape)} input")
    k = int(cx.const(ins[1], "k").reshape(-1)[0]) if _opt(ins, 1) is not None else 0
    n, m = x.shape[-2:]
    diff = np.arange(m)[None, :] - np.arange(n)[:, None]
    keep = diff >= k if cx.attr("upper", 1) else diff <= k
    return [cx.add("Where", [cx.constant(keep), x, _scalar(cx, 0, x)])]


@importer("Hardmax")
def imp_hardmax(cx: Ctx, ins: list[Value | None]) -> list[Value]:
    x = ins[0]
    rank = len(x.shape)
    axis = _axis(cx.attr("axis", -1 if cx.opset >= 13 else 1), rank, cx)
    src = x
    if cx.opset < 13:  # over the flattened [axis:] dims
        src = cx.add("Reshape", [x], shape=(int(np.prod(x.shape[:axis], dtype=np.int64)),
                                            int(np.prod(x.shape[axis:], dtype=np.int64))))
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


# -- Einsum: diagonals, sums, then pairwise contractions as batched MatMuls -----------------------------------
def _einsum_terms(cx: Ctx, eq: str, ranks: list[int]) -> tuple[list[list[str]], list[str]]:
    eq = eq.replace(" ", "")
    lhs, arrow, rhs = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(ranks):
        raise cx.unsupported(f"equation {eq!r} names {len(terms)} operands, got {len(ranks)}")
    ell_rank = max((r - len(t.replace("...", "")) for t, r in zip(terms, ranks) if "..." in t), default=0)
    ell = [f"@{i}" for i in range(ell_rank)]  # broadcast (ellipsis) dims, right-aligned across operands
    out_terms = []
    for t, r in zip(terms, ranks):
        head, dots, tail = t.partition("...")
        n = r - len(head) - len(tail) if dots else 0
        letters = list(head) + (ell[ell_rank - n:] if dots else []) + list(tail)
        if len(letters) != r:
            raise cx.unsupported(f"term {t!r} does not match an operand of rank {r}")
        out_terms.append(letters)
    if arrow:
        head, dots, tail = rhs.partition("...")
        out = list(head) + (ell if dots else []) + list(tail)
    else:
        counts: dict[str, int] = {}
        for t in out_terms:
            for ch in t:
                counts[ch] = counts.get(ch, 0) + 1
        out = ell + sorted(ch for ch, k in counts.items() if k == 1 and not ch.startswith("@"))
    return out_terms, out


def _einsum_prepare(cx: Ctx, v: Value, letters: list[str], keep: set[str]) -> tuple[Value, list[str]]:
    """Take repeated letters' diagonals and sum away letters nothing else needs."""
    while len(set(letters)) < len(letters):
        ch = next(c for c in letters if letters.count(c) > 1)
        p = letters.index(ch)
        q = letters.index(ch, p + 1)
        n = v.shape[p]
        eye = np.zeros([n if i in (p, q) else 1 for i in range(len(letters))], dtype=bool)
        eye[tuple(np.arange(n) if i in (p, q) else 0 for i in range(len(letters)))] = True
        v = cx.add("Reduce", [cx.add("Where", [cx.constant(eye), v, _scalar(cx, 0, v)])], kind="sum", axes=(q,),
                   keepdims=False)
        letters = letters[:q] + letters[q + 1:]
    drop = tuple(i for i, ch in enumerate(letters) if ch not in keep)
    if drop:
        v = cx.add("Reduce", [v], kind="sum", axes=drop, keepdims=False)
        letters = [ch for ch in letters if ch in keep]
    return v, letters


def _permute(cx: Ctx, v: Value, letters: list[str], order: list[str]) -> Value:
    perm = tuple(letters.index(ch) for ch in order)
    return cx.add("Transpose", [v], perm=perm) if perm != tuple(range(len(perm))) else v


@importer("Einsum")
def imp_einsum(cx: Ctx, ins: list[Value | None]) -> list[Value]:
    vals = [v for v in ins if v is not None]
    terms, out = _einsum_terms(cx, cx.attr("equation"), [len(v.shape) for v in vals])
    size: dict[str, int] = {}
    for v, t in zip(vals, terms):
        for ch, d in zip(t, v.shape):
            if size.get(ch, 1) != 1 and d not in (1, size[ch]):
                raise cx.unsupported(f"dimension {ch!r} is {size[ch]} and {d}")
            size[ch] = max(size.get(ch, 1), d)
    acc, acc_l = _einsum_prepare(cx, vals[0], terms[0], set(out).union(*terms[1:]))
    for i in range(1, len(vals)):
        later = set(out).union(*terms[i + 1:])
        b, b_l = _einsum_prepare(cx, vals[i], terms[i], later | set(acc_l))
        acc, acc_l = _einsum_prepare(cx, acc, acc_l, later | set(b_l))
        keep = later
        batch = [ch for ch in acc_l if ch in b_l and ch in keep]
        contract = [ch for ch in acc_l if ch in b_l and ch not in keep]
        left = [ch for ch in acc_l if ch not in b_l]
        right = [ch for ch in b_l if ch not in acc_l]
        a2 = _permute(cx, acc, acc_l, batch + left + contract)
        b2 = _permute(cx, b, b_l, batch + contract + right)
        bshape = tuple(size[ch] for ch in batch)
        nb, m = int(np.prod(bshape, dtype=np.int64)), int(np.prod([size[c] for c in left], dtype=np.int64))
        k, n = int(np.prod([size[c] for c in contract], dtype=np.int64)), int(np.prod([size[c] for c in right],
                                                                                      dtype=np.int64))
        full_a = bshape + tuple(a2.shape[len(batch):])
        full_b = bshape + tuple(b2.shape[len(batch):])
        if a2.shape != full_a:
            a2 = cx.add("Expand", [a2], shape=full_a)
        if b2.shape != full_b:
            b2 = cx.add("Expand", [b2], shape=full_b)
        y = cx.add("MatMul", [cx.add("Reshape", [a2], shape=(nb, m, k)), cx.add("Reshape", [b2], shape=(nb, k, n))])
        acc_l = batch + left + right
        acc = cx.add("Reshape", [y], shape=tuple(size[ch] for ch in acc_l))
    acc, acc_l = _einsum_prepare(cx, acc, acc_l, set(out))
    return [_permute(cx, acc, acc_l, out)]


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


# -- indexing ops ---------------------------------------------------------------------------------------------
@importer("GatherElements")
def imp_gather_elements(cx: Ctx, ins: list[Value | None]) -> list[Value]:
    x, idx = ins[0], ins[1]
    axis = _axis(cx.attr("axis", 0), len(x.shape), cx)
    if len(idx.shape) != len(x.shape):
        raise ModelError(f"node '{cx.name}': GatherElements indices of rank {len(idx.shape)} for data of rank "
                         f"{len(x.shape)}")
    return [cx.add("GatherElements", [x, idx], axis=axis)]


@importer("GatherND")
def imp_gather_nd(cx: Ctx, ins: list[Value | None]) -> list[Value]:
    x, idx = ins[0], ins[1]
    b = int(cx.attr("batch_dims", 0))
    if not idx.shape or idx.shape[-1] > len(x.shape) - b:
        raise ModelError(f"node '{cx.name}': GatherND indices {idx.shape} do not fit data {x.shape}")
    return [cx.add("GatherND", [x, idx], batch_dims=b)]


@importer("ScatterElements", "Scatter")
def imp_scatter_elements(cx: Ctx, ins: list[Value | None]) -> list[Value]:
    x, idx, upd = ins[:3]
    axis = _axis(cx.attr("axis", 0), len(x.shape), cx)
    if idx.shape != upd.shape or len(idx.shape) != len(x.shape):
        raise ModelError(f"node '{cx.name}': indices {idx.shape} and updates {upd.shape} must have the same shape "
                         f"and the rank of data {x.shape}")
    return [cx.add("ScatterElements", [x, idx, upd], axis=axis, reduction=cx.attr("reduction", "none"))]


@importer("ScatterND")
def imp_scatter_nd(cx: Ctx, ins: list[Value | None]) -> list[Value]:
    x, idx, upd = ins[:3]
    k = idx.shape[-1] if idx.shape else 0
    if not idx.shape or k > len(x.shape) or upd.shape != idx.shape[:-1] + x.shape[k:]:
        raise ModelError(f"node '{cx.name}': ScatterND indices {idx.shape} / updates {upd.shape} do not fit data "
                         f"{x.shape}")
    return [cx.add("ScatterND", [x, idx, upd], reduction=cx.attr("reduction", "none"))]


@importer("CumSum")
def imp_cumsum(cx: Ctx, ins: list[Value | None]) -> list[Value]:
    x = ins[0]
    axis = _axis(int(cx.const(ins[1], "axis").reshape(-1)[0]), len(x.shape), cx)
    return [cx.add("CumSum", [x], axis=axis, exclusive=int(cx.attr("exclusive", 0)),
                   reverse=int(cx.attr("reverse", 0)))]


@importer("TopK")
def imp_topk(cx: Ctx, ins: list[Value | None]) -> list[Value]:
    x = ins[0]
    axis = _axis(cx.attr("axis", -1), len(x.shape), cx)
    k = int(cx.attr("k")) if cx.opset < 10 else int(cx.const(ins[1], "K").reshape(-1)[0])
    if not 0 <= k <= x.shape[axis]:
        raise ModelError(f"node '{cx.name}': TopK k={k} for an axis of size {x.shape[axis]}")
    idx = cx.add("TopKIndex", [x], axis=axis, k=k, largest=int(cx.attr("largest", 1)))
    return [cx.add("GatherElements", [x, idx], axis=axis), idx]


@importer("ReverseSequence")
def imp_reverse_sequence(cx: Ctx, ins: list[Value | None]) -> list[Value]:
    return [cx.add("ReverseSequence", ins[:2], batch_axis=int(cx.attr("batch_axis", 1)),
                   time_axis=int(cx.attr("time_axis", 0)))]
