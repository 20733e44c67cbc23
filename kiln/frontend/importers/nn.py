"""Matrix products (MatMul, Gemm), convolution and pooling, normalizations and softmax."""
from __future__ import annotations

import numpy as np

from kiln.errors import ModelError
from kiln.frontend.context import Ctx
from kiln.frontend.importers.registry import _axis, importer
from kiln.graph import symbolic
from kiln.graph.ir import Value
from kiln.graph.ops import broadcast, conv_out


# -- matrix products ----------------------------------------------------------------------------------------
@importer("MatMul")
def imp_matmul(cx: Ctx, ins: list[Value | None]) -> list[Value]:
    a, b = ins[0], ins[1]
    batch_a, batch_b = a.shape[:-2] if len(a.shape) > 1 else (), b.shape[:-2] if len(b.shape) > 1 else ()
    out_shape = broadcast(batch_a, batch_b)
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
    rows = symbolic.prod(x.shape[:axis])
    flat = cx.add("Reshape", [x], shape=(rows, symbolic.prod(x.shape[axis:])))
    return [cx.add("Reshape", [cx.add(op, [flat], axis=1)], shape=x.shape)]
