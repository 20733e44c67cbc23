"""Quantized models onto integer kernels (Glow-style: conversions minimized and folded into neighbours).

A QDQ model (onnxruntime's quantize_static / quantize_dynamic, NNCF, kiln.quantize, or QLinearConv/QLinearMatMul
imported in their QDQ form) computes in float between Dequantize and Quantize. This pass rewrites it so that the
anchors run on integers and values stay 8-bit between them:

 1. activation domain — the target's dot product wants one signedness for activations (x86 `vpdpbusd`: u8 × s8,
    kiln.graph.quant_ops.activation_dtype). A Quantize whose every reader is a Dequantize produces that type
    instead (int8 zp z  ⇔  uint8 zp z + 128: the same dequantized values, "add 128" folded into the producer):

        Q(x, s, z):int8 → DQ(·, s, z)            ⇒  Q(x, s, z + 128):uint8 → DQ(·, s, z + 128)

 2. integer data movement — a layout op or a max pool between a Dequantize and a Quantize with the same scalar
    scale and zero point runs on the 8-bit values (they commute exactly), and Q(DQ(x)) with equal parameters is x:

        DQ(x, s, z) → Reshape / Transpose / Slice / MaxPool → Q(·, s, z)   ⇒   Reshape / … (x)

 3. integer anchors — Conv / MatMul reading DQ(x) (per-tensor) and a constant DQ(w) (per-tensor or per output
    channel, any zero point that re-centres w into int8), and MatMulInteger / ConvInteger with a constant weight:

        Conv(DQ(x, sx, zx), DQ(w, sw, zw), b)  ⇒  QConv(x, w − zw, addend) → Cast f32 → · sx·sw (+ b)
        addend[co] = −zx·Σw[co] (+ b / (sx·sw) when b is an int32 bias at that scale, as onnxruntime writes it)

    A depthwise conv accumulates int32 too (u8 · s8 products as 16-bit pairs: `vpdpwssd` / `pmaddwd`; on x86 with
    VNNI a window row's taps as one `vpdpbusd` group per channel, kernel/dot.py LaneDot4). Weights with
    a zero point that does not re-centre into int8, grouped (non-depthwise) convs and non-2-D convs keep their float
    form ("fp32 between DQ and Q": correct).

 4. requantize folding — an integer anchor whose float result goes (through Relu / Clip) only into a Quantize with
    a constant scalar scale sy has the scale folded into one multiplier and the zero point into the rounding:

        QConv → Cast → · m (+ b) → [Relu] → Q(·, sy, zy)   ⇒   QConv → Cast → · (m/sy) (+ b/sy) → [Relu] → Q(·, 1, zy)

    so the anchor's epilogue (kernel/build.py fuses all of it into the accumulator tile) is one multiply-add,
    a round, a clamp and a narrowing store. A residual Add of a dequantized value (read by that Add alone) on the
    way takes the fold into that Dequantize's scale — QConv → … → Add(DQ(r, sr, zr)) → [Relu] → Q(·, sy, zy) ⇒
    … → Add(DQ(r, sr/sy, zr)) → [Relu] → Q(·, 1, zy) — so no division is left (a vdivps per output vector).
    Residual adds of two quantized values (DQ + DQ → Q) and every other op between a DQ and a Q stay float
    elementwise ops that fuse into their neighbours.

Switch: `kiln.compile(model, quantize_qdq=False)` runs a QDQ model entirely in float (its "fake-quant" meaning):
the reference the integer build is tested against."""
from __future__ import annotations

import numpy as np

from kiln.graph.ir import Graph, Node, TensorType, Value
from kiln.graph.ops import infer
from kiln.graph.quant_ops import activation_dtype, dequantize_np
from kiln.graph.quant_pack import INT8_K_GROUP, dot_group, pack_qmatmul
from kiln.target import Target

# single-input ops that commute with a per-tensor (de)quantization with the same parameters (max pooling is
# monotonic; the rest move elements without arithmetic)
DATA_OPS = ("Reshape", "Transpose", "Slice", "Expand", "Tile", "Gather")


def _const(g: Graph, arr: np.ndarray, hint: str) -> Value:
    arr = np.ascontiguousarray(arr)
    return Value(g.fresh(hint), TensorType(arr.dtype.name, tuple(arr.shape)), const=arr)


def _node(g: Graph, op: str, inputs: list[Value], attrs: dict, name: str) -> Node:
    (t,) = infer(op, [v.type for v in inputs], attrs, name)
    n = Node(op, list(inputs), [], attrs, name)
    n.outputs = [Value(g.fresh(name), t, producer=n)]
    return n


def _scalar(v: Value) -> float | int | None:
    return v.const.reshape(-1)[0].item() if v.const is not None and v.const.size == 1 else None


def _dq(v: Value) -> Node | None:
    p = v.producer
    return p if p is not None and p.op == "Dequantize" else None


def _same_params(a: Node, b: Node) -> bool:
    """Two (de)quantizations with equal constant scalar scale and zero point."""
    sa, za, sb, zb = _scalar(a.inputs[1]), _scalar(a.inputs[2]), _scalar(b.inputs[1]), _scalar(b.inputs[2])
    return None not in (sa, za, sb, zb) and np.float32(sa) == np.float32(sb) and za == zb


# -- 1. activation domain --------------------------------------------------------------------------------------------
def _shift_zero_point(g: Graph, zp: Value, to: str) -> Value:
    shift = 128 if to == "uint8" else -128
    return _const(g, (zp.const.astype(np.int32) + shift).astype(to), f"{zp.name}.{to}")


def flip_activations(g: Graph, act: str) -> None:
    users, outputs = g.consumers(), {id(v) for v in g.outputs}
    for n in g.nodes:
        y = n.outputs[0]
        readers = users.get(id(y), [])
        if n.op != "Quantize" or n.attrs["to"] == act or id(y) in outputs or not readers \
                or any(u.op != "Dequantize" or u.inputs[0] is not y or u.inputs[2].const is None for u in readers) \
                or n.inputs[2].const is None:
            continue
        n.inputs[2] = _shift_zero_point(g, n.inputs[2], act)
        n.attrs = {**n.attrs, "to": act}
        y.type = TensorType(act, y.shape)
        for u in readers:
            u.inputs[2] = _shift_zero_point(g, u.inputs[2], act)


# -- 2. integer data movement ---------------------------------------------------------------------------------------
def integer_data_movement(g: Graph) -> None:
    """Q(op(DQ(x))) → op(x) for DATA_OPS and max pooling, Q(DQ(x)) → x, with equal scalar parameters."""
    users, outputs = g.consumers(), {id(v) for v in g.outputs}
    nodes: list[Node] = []
    for q in g.nodes:
        nodes.append(q)
        if q.op != "Quantize":
            continue
        mid = q.inputs[0].producer
        if mid is None or len(users.get(id(mid.outputs[0]), [])) != 1 or id(mid.outputs[0]) in outputs:
            continue
        if mid.op == "Dequantize" and mid.inputs[0].dtype == q.attrs["to"] and _same_params(mid, q):
            g.replace_uses(q.outputs[0], mid.inputs[0])
            continue
        movable = mid.op in DATA_OPS or (mid.op == "Pool" and mid.attrs["kind"] == "max")
        dq = _dq(mid.inputs[0]) if movable and mid.inputs else None
        if dq is None or dq.inputs[0].dtype != q.attrs["to"] or not _same_params(dq, q) \
                or any(v.const is None for v in mid.inputs[1:]):
            continue
        n = _node(g, mid.op, [dq.inputs[0]] + mid.inputs[1:], dict(mid.attrs), mid.name)
        nodes.insert(len(nodes) - 1, n)
        g.replace_uses(q.outputs[0], n.outputs[0])
    g.nodes = nodes


# -- 3. integer anchors -----------------------------------------------------------------------------------------------
def _activation(g: Graph, x: Value, zx: int, act: str, new: list[Node], name: str) -> tuple[Value, int]:
    """x in the activation domain `act` (a u8 ↔ s8 shift where its producer could not be flipped) and its zero point."""
    if x.dtype == act:
        return x, zx
    shift = 128 if act == "uint8" else -128
    wide = _node(g, "Cast", [x], {"to": "int32"}, f"{name}.widen")
    moved = _node(g, "Add", [wide.outputs[0], _const(g, np.array(shift, np.int32), "shift")], {}, f"{name}.shift")
    narrow = _node(g, "Cast", [moved.outputs[0]], {"to": act}, f"{name}.narrow")
    new += [wide, moved, narrow]
    return narrow.outputs[0], zx + shift


def _weights(w: Value, axis: int) -> tuple[np.ndarray, np.ndarray] | None:
    """(w re-centred to int8, per-output-channel float scale along `axis`) from a constant Dequantize (or a
    Transpose of one: Gemm's transB), or None when it does not re-centre (a zero point leaving values outside int8)
    or its scale/zero point vary along another axis."""
    perm = None
    if w.producer is not None and w.producer.op == "Transpose":
        perm, w = w.producer.attrs["perm"], w.producer.inputs[0]
    dq = _dq(w)
    if dq is None or any(v.const is None for v in dq.inputs):
        return None
    wq, sw, zw = (v.const for v in dq.inputs)
    src_axis = perm[axis] if perm is not None else axis
    if wq.dtype.name not in ("int8", "uint8"):
        return None
    n_out = wq.shape[src_axis]
    for p in (sw, zw):
        if p.size != 1 and (p.size != n_out or p.ndim > wq.ndim or
                            np.broadcast_to(p, wq.shape).strides[src_axis] == 0):
            return None
    centred = wq.astype(np.int32) - np.broadcast_to(zw.astype(np.int32), wq.shape)
    if centred.min() < -128 or centred.max() > 127:
        return None
    scale = np.broadcast_to(sw.astype(np.float32), wq.shape)
    scale = np.moveaxis(scale, src_axis, 0).reshape(n_out, -1)[:, 0]
    if perm is not None:
        centred = np.transpose(centred, perm)
    return np.ascontiguousarray(centred.astype(np.int8)), np.ascontiguousarray(scale)


def _float_of(v: Value) -> np.ndarray | None:
    """A constant's float value (a DQ of constants evaluated)."""
    if v.const is not None:
        return v.const.astype(np.float32)
    dq = _dq(v)
    if dq is not None and all(x.const is not None for x in dq.inputs):
        return dequantize_np(*(x.const for x in dq.inputs))
    return None


def _bias_addend(b: Value | None, scale: np.ndarray, n_out: int) -> tuple[np.ndarray, np.ndarray | None]:
    """(int32 addend, float bias or None): an int32 DQ'd bias at the accumulator's scale goes into the integers."""
    if b is None:
        return np.zeros(n_out, np.int32), None
    dq = _dq(b)
    if dq is not None and dq.inputs[0].dtype == "int32" and all(x.const is not None for x in dq.inputs):
        bq, sb, zb = (x.const for x in dq.inputs)
        sb = np.broadcast_to(sb.astype(np.float32).reshape(-1), (n_out,))
        if not zb.any() and bq.size == n_out and np.allclose(sb, scale, rtol=1e-6, atol=0):
            return bq.reshape(n_out).astype(np.int32), None
    return np.zeros(n_out, np.int32), _float_of(b).reshape(n_out)


def _epilogue(g: Graph, acc: Value, scale: np.ndarray, bias: np.ndarray | None, shape: tuple[int, ...],
              name: str, new: list[Node]) -> Value:
    """acc (int32 or float32) → float32 · scale (+ bias), the per-channel constants shaped `shape` to broadcast."""
    v = acc
    if acc.dtype != "float32":
        cast = _node(g, "Cast", [acc], {"to": "float32"}, f"{name}.dequant")
        new.append(cast)
        v = cast.outputs[0]
    mul = _node(g, "Mul", [v, _const(g, scale.reshape(shape), "acc_scale")], {"requant": True}, f"{name}.scale")
    new.append(mul)
    v = mul.outputs[0]
    if bias is not None:
        add = _node(g, "Add", [v, _const(g, bias.astype(np.float32).reshape(shape), "bias")], {"requant": True},
                    f"{name}.bias")
        new.append(add)
        v = add.outputs[0]
    return v


def _integer_operands(g: Graph, x: Value, w: Value, axis: int, act: str, new: list[Node],
                      name: str) -> tuple[Value, int, np.float32, np.ndarray, np.ndarray] | None:
    """An anchor's integer operands: its activation (from a per-tensor DequantizeLinear: the integer value, zero
    point and scale) and its constant weight quantized along `axis` (integer values, per-channel scales); None
    when either is not so. Nodes are added to `new` only once both are known to be integer."""
    dq = _dq(x)
    if dq is None or _scalar(dq.inputs[1]) is None or _scalar(dq.inputs[2]) is None:
        return None
    wts = _weights(w, axis)
    if wts is None:
        return None
    xq, zx = _activation(g, dq.inputs[0], int(_scalar(dq.inputs[2])), act, new, name)
    return xq, zx, np.float32(_scalar(dq.inputs[1])), wts[0], wts[1]


def _conv_anchor(g: Graph, n: Node, act: str, new: list[Node]) -> Value | None:
    x, w = n.inputs[0], n.inputs[1]
    a = n.attrs
    if len(x.shape) != 4:
        return None
    co, cig = w.shape[0], w.shape[1]
    depthwise = a["group"] > 1 and a["group"] == co == x.shape[1] and cig == 1
    if a["group"] != 1 and not depthwise:
        return None
    operands = _integer_operands(g, x, w, 0, act, new, n.name)
    if operands is None:
        return None
    xq, zx, sx, wc, sw = operands
    scale = (sx * sw).astype(np.float32)
    addend, bias = _bias_addend(n.inputs[2] if len(n.inputs) > 2 else None, scale, co)
    wsum = wc.astype(np.int64).reshape(co, -1).sum(axis=1)
    addend = addend.astype(np.int64) - zx * wsum
    wcon, add = _const(g, wc, w.name + ".int8"), _const(g, addend.astype(np.int32), "addend")
    attrs = {**a, "fill": zx, "acc": "int32"}
    q = _node(g, "QConv", [xq, wcon, add], attrs, n.name)
    new.append(q)
    return _epilogue(g, q.outputs[0], scale, bias, (co, 1, 1), n.name, new)


def _matmul_anchor(g: Graph, n: Node, act: str, new: list[Node]) -> Value | None:
    x, w = n.inputs
    operands = _integer_operands(g, x, w, 1, act, new, n.name) if len(w.shape) == 2 else None
    if operands is None:
        return None
    xq, zx, sx, wc, sw = operands
    addend = -zx * wc.astype(np.int64).sum(axis=0)
    q = _node(g, "QMatMul", [xq, _const(g, wc, w.name + ".int8"), _const(g, addend.astype(np.int32), "addend")],
              {k: v for k, v in n.attrs.items() if k == "strategy"}, n.name)
    new.append(q)
    return _epilogue(g, q.outputs[0], (sx * sw).astype(np.float32), None, (w.shape[1],), n.name, new)


def _integer_op_anchor(g: Graph, n: Node, act: str, new: list[Node]) -> Value | None:
    """MatMulInteger / ConvInteger with a constant weight (and weight zero point) → QMatMul / QConv (int32)."""
    x, w, zx_v, zw_v = n.inputs
    if w.const is None or zw_v.const is None:
        return None
    is_conv = n.op == "ConvInteger"
    if is_conv and (len(x.shape) != 4 or zx_v.const is None or n.attrs["group"] != 1):
        return None
    if not is_conv and len(w.shape) != 2:
        return None
    centred = w.const.astype(np.int32) - np.broadcast_to(zw_v.const.astype(np.int32), w.shape)
    if centred.min() < -128 or centred.max() > 127:
        return None
    wc = centred.astype(np.int8)
    axis = 0 if is_conv else 1
    wsum = np.moveaxis(wc.astype(np.int64), axis, 0).reshape(w.shape[axis], -1).sum(axis=1)
    if zx_v.const is not None:
        xq, zx = _activation(g, x, int(_scalar(zx_v)), act, new, n.name)
        ins = [xq, _const(g, wc, w.name + ".int8"), _const(g, (-zx * wsum).astype(np.int32), "addend")]
    else:  # a zero point computed at run time (DynamicQuantizeLinear): its correction in the epilogue
        if x.dtype != act or zx_v.type.size != 1:
            return None
        ins = [x, _const(g, wc, w.name + ".int8"), _const(g, np.zeros(w.shape[axis], np.int32), "addend"),
               _const(g, (-wsum).astype(np.int32), "negwsum"), zx_v]
    if is_conv:
        q = _node(g, "QConv", ins, {**n.attrs, "fill": int(_scalar(zx_v)) + (0 if x.dtype == act else
                                                                              (128 if act == "uint8" else -128)),
                                    "acc": "int32"}, n.name)
    else:
        q = _node(g, "QMatMul", ins, {}, n.name)
    new.append(q)
    return q.outputs[0]


def packed_matmul(g: Graph, q: Node, target: Target, group: int) -> Node:
    """QMatMul → QPackedMatMul (weights in the VNNI layout, graph/quant_pack.py) on fixed-width targets and AArch64's
    scalable ones (NEON-width panels: an SVE target runs the NEON tile), for the register tile and the microkernels
    (schedule/int8.py, int8_ukernel.py); under a library strategy whose library has an integer GEMM for these
    activations the weights stay as they are, for it (schedule/library.py)."""
    w = q.inputs[1]
    if not target.fixed_dot_tiles or w.const is None:  # (SVE targets: NEON-width panels)
        return q
    strategy = str(q.attrs.get("strategy", "direct"))
    if strategy.startswith("library"):
        from kiln.library import integer_gemm, library_of
        if integer_gemm(library_of(strategy), q.inputs[0].dtype):
            return q
    nr = 2 * target.lanes(32)
    bp = _const(g, pack_qmatmul(w.const, nr, group), w.name + ".packed")
    return _node(g, "QPackedMatMul", [q.inputs[0], bp] + q.inputs[2:],
                 {**q.attrs, "n": w.shape[1], "nr": nr, "k": w.shape[0]}, q.name)


def pad_channels(g: Graph, q: Node, new: list[Node]) -> Node:
    """A dense QConv whose input channels are not a multiple of 4 (an RGB stem) reads them padded with its zero
    point, against zero weights: then every 4-byte group of its blocked input is whole."""
    x, w = q.inputs[0], q.inputs[1]
    ci = x.shape[1]
    if q.attrs["group"] != 1 or ci % INT8_K_GROUP == 0 or q.attrs["acc"] != "int32":
        return q
    extra = -ci % INT8_K_GROUP
    pad = _node(g, "Pad", [x], {"pads": (0, 0, 0, 0, 0, extra, 0, 0), "mode": "constant",
                                "value": q.attrs["fill"]}, f"{q.name}.pad_channels")
    wp = np.zeros((w.shape[0], ci + extra) + w.shape[2:], np.int8)
    wp[:, :ci] = w.const
    new.append(pad)
    return _node(g, "QConv", [pad.outputs[0], _const(g, wp, w.name + ".padded")] + q.inputs[2:], q.attrs, q.name)


ANCHORS = {"Conv": _conv_anchor, "MatMul": _matmul_anchor, "MatMulInteger": _integer_op_anchor,
           "ConvInteger": _integer_op_anchor}


def integer_anchors(g: Graph, target: Target, options: dict[str, bool] | None = None) -> None:
    act = activation_dtype(target)
    group = dot_group(target, options)
    nodes: list[Node] = []
    for n in g.nodes:
        new: list[Node] = []
        y = ANCHORS[n.op](g, n, act, new) if n.op in ANCHORS and n.outputs[0].dtype in ("float32", "int32") else None
        if y is None:
            nodes.append(n)
            continue
        for i, m in enumerate(new):  # the anchor in its final form: packed weights, whole 4-byte groups
            if m.op in ("QMatMul", "QConv"):
                pre: list[Node] = []
                final = packed_matmul(g, m, target, group) if m.op == "QMatMul" else pad_channels(g, m, pre)
                if final is not m:
                    new[i:i + 1] = pre + [final]
                    for later in new:
                        later.inputs = [final.outputs[0] if v is m.outputs[0] else v for v in later.inputs]
                    if y is m.outputs[0]:
                        y = final.outputs[0]
                break
        nodes += new
        g.replace_uses(n.outputs[0], y)  # the readers of n's output all come later in g.nodes (topological order)
    g.nodes = nodes


# -- 4. requantize folding --------------------------------------------------------------------------------------------
def fold_requantize(g: Graph) -> None:
    users, outputs = g.consumers(), {id(v) for v in g.outputs}

    def only_reader(v: Value) -> Node | None:
        us = users.get(id(v), [])
        return us[0] if len(us) == 1 and id(v) not in outputs else None

    for mul in g.nodes:
        if not mul.attrs.get("requant") or mul.op != "Mul":
            continue
        chain = [mul]
        nxt = only_reader(mul.outputs[0])
        if nxt is not None and nxt.attrs.get("requant") and nxt.op == "Add":
            chain.append(nxt)
            nxt = only_reader(nxt.outputs[0])
        # a residual Add of a dequantized value read by it alone (kiln.quantize leaves it to the epilogue), and that
        # value's Dequantize
        residual = skip = None
        if nxt is not None and nxt.op == "Add" and len(nxt.inputs) == 2:
            other = next((v for v in nxt.inputs if v is not chain[-1].outputs[0]), None)
            dq = _dq(other) if other is not None else None
            if dq is not None and only_reader(other) is nxt and _scalar(dq.inputs[1]) is not None:
                residual, skip = nxt, dq
                nxt = only_reader(nxt.outputs[0])
        act = None
        if nxt is not None and nxt.op in ("Relu", "Clip"):
            act = nxt
            nxt = only_reader(nxt.outputs[0])
        last = act or residual or chain[-1]
        if nxt is None or nxt.op != "Quantize" or nxt.inputs[0] is not last.outputs[0]:
            continue
        sy = _scalar(nxt.inputs[1])
        if sy is None or not sy > 0:
            continue
        inv = np.float32(1.0) / np.float32(sy)
        for c in chain:
            c.inputs[1] = _const(g, (c.inputs[1].const.astype(np.float64) * inv).astype(np.float32), "requant")
        if skip is not None:  # (x − z)·s + … then ÷ sy  ⇒  (x − z)·(s/sy) + …: the division leaves the epilogue
            skip.inputs[1] = _const(g, np.array(np.float64(_scalar(skip.inputs[1])) * inv, np.float32), "requant")
        if act is not None and act.op == "Clip":
            act.attrs = {**act.attrs, "min": act.attrs["min"] * float(inv), "max": act.attrs["max"] * float(inv)}
        nxt.inputs[1] = _const(g, np.array(1.0, np.float32), "one")


def quantize_qdq(g: Graph, target: Target, options: dict[str, bool] | None = None) -> Graph:
    if not any(n.op in ("Dequantize", "MatMulInteger", "ConvInteger") for n in g.nodes):
        return g
    flip_activations(g, activation_dtype(target))
    integer_data_movement(g)
    integer_anchors(g, target, options)
    fold_requantize(g)
    return g
