"""Write a QDQ model: QuantizeLinear → DequantizeLinear pairs on the anchors' activations, DequantizeLinear on their
int8 weights — the form graph/passes/quantize_qdq.py turns into integer anchors.

For every Conv / MatMul / Gemm with a constant float weight (not excluded by name or op type):

    x ─ Q(sx, zx) ─ DQ ─┐                                  activation input (int8, per tensor)
    w_q:int8 ─ DQ(sw[c], 0, axis) ─ Conv/MatMul/Gemm ─ [Add const] ─ [Relu|Clip] ─ [Add r ─ [Relu|Clip]] ─ y ─┐
                                                                                   y ─ Q(sy, zy) ─ DQ ─ readers

weights symmetric int8 per output channel (or per tensor), a Conv bias int32 at the accumulator's scale sx·sw (as
onnxruntime writes it: the pass adds it to the int32 accumulator; a MatMul's bias Add stays float, in the
epilogue), and the anchor's output quantized after the bias and activation it feeds alone (so the pass folds
the requantization into the accumulator tile; an activation may be several nodes: the exporters' erf GELU, SiLU) —
and after a residual Add `r` it feeds alone whose other operand is computed earlier and whose sum an anchor reads
(ResNet's and MobileNetV2's blocks; not a transformer's residual stream, read by LayerNorm): that Add and its
activation run in the anchor's epilogue on the float result, so quantizing between them would only add a rounding
and ~8 vector operations per output vector. A graph output stays float (the logits keep their precision)."""
from __future__ import annotations

from collections.abc import Container
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper, numpy_helper

ANCHOR_OPS = ("Conv", "MatMul", "Gemm")
FOLLOWERS = ("Relu", "Clip")
# ops an activation written out node by node is made of (GELU: Div, Erf, Add, Mul, Mul; SiLU: Sigmoid, Mul; ...)
ELEMENTWISE = frozenset({"Add", "Sub", "Mul", "Div", "Pow", "Sqrt", "Neg", "Exp", "Erf", "Tanh", "Sigmoid",
                         "HardSigmoid", "HardSwish", "Gelu", "Relu", "Clip"})
MAX_REGION = 12
# ops an 8-bit value passes through to the anchor that reads it (moved, pooled, joined: quantize_qdq runs the
# movements on the integers, the others on its dequantized value)
PASS_THROUGH = frozenset({"Reshape", "Transpose", "Flatten", "Squeeze", "Unsqueeze", "Slice", "Expand", "Tile",
                          "Gather", "Concat", "Split", "MaxPool", "AveragePool", "GlobalAveragePool",
                          "GlobalMaxPool", "Pad", "Identity"})


@dataclass
class Plan:
    anchors: list[onnx.NodeProto]
    activations: list[str]          # tensors that get Q → DQ (inputs and outputs of anchors)
    weights: dict[str, int]         # weight initializer → its output-channel axis


def _consumers(g: onnx.GraphProto) -> dict[str, list[onnx.NodeProto]]:
    out: dict[str, list[onnx.NodeProto]] = {}
    for n in g.node:
        for i in n.input:
            out.setdefault(i, []).append(n)
    return out


def activation_region(y: str, users: dict[str, list[onnx.NodeProto]], inits: Container[str], outputs: set[str]
                      ) -> str:
    """What an activation computes from y alone when it is written as several elementwise nodes — the nodes that read
    only y, constants and each other, with one tensor leaving them (y itself read by nothing else) — or y."""
    inside: set[int] = set()  # the region's nodes, by identity (protobuf messages compare by value)
    have = {y}
    grew = True
    while grew and len(inside) < MAX_REGION:
        grew = False
        for t in list(have):
            for r in users.get(t, []):
                if id(r) not in inside and r.op_type in ELEMENTWISE and all(i in have or i in inits or not i
                                                                            for i in r.input):
                    inside.add(id(r))
                    have.update(r.output)
                    grew = True
    leaving = [t for t in have if t in outputs or any(id(r) not in inside for r in users.get(t, []))]
    return leaving[0] if inside and len(leaving) == 1 and leaving[0] != y else y


def _weight_axis(n: onnx.NodeProto) -> int:
    if n.op_type == "Conv":
        return 0
    if n.op_type == "Gemm":
        trans_b = next((a.i for a in n.attribute if a.name == "transB"), 0)
        return 0 if trans_b else 1
    return 1


def _is_anchor(n: onnx.NodeProto, inits: dict[str, onnx.TensorProto], exclude_nodes: tuple[str, ...],
               exclude_ops: tuple[str, ...]) -> bool:
    """A Conv / MatMul / Gemm with a float32 weight initializer that quantizes (not excluded, not grouped)."""
    if n.op_type not in ANCHOR_OPS or n.name in exclude_nodes or n.op_type in exclude_ops or len(n.input) < 2:
        return False
    w = inits.get(n.input[1])
    if w is None or w.data_type != onnx.TensorProto.FLOAT or len(w.dims) not in (2, 4) \
            or (n.op_type == "Gemm" and any(a.name == "transA" and a.i for a in n.attribute)):
        return False
    group = next((a.i for a in n.attribute if a.name == "group"), 1) if n.op_type == "Conv" else 1
    return group == 1 or group == w.dims[0]  # grouped convs keep their float form: quantizing them only adds error


def _read_by_anchor(y: str, users: dict[str, list[onnx.NodeProto]], anchor_inputs: set[str]) -> bool:
    """Whether an anchor reads y, directly or through PASS_THROUGH ops."""
    seen, todo = {y}, [y]
    while todo:
        t = todo.pop()
        if t in anchor_inputs:
            return True
        for r in users.get(t, []):
            if r.op_type in PASS_THROUGH:
                todo += [o for o in r.output if o not in seen]
                seen.update(r.output)
    return False


def plan(model: onnx.ModelProto, exclude_nodes: tuple[str, ...], exclude_ops: tuple[str, ...]) -> Plan:
    g = model.graph
    inits = {t.name: t for t in g.initializer}
    users, outputs = _consumers(g), {o.name for o in g.output}
    position = {o: i for i, node in enumerate(g.node) for o in node.output}
    acts, weights = [], {}
    produced: list[str] = []   # each anchor's output, after what its kernel computes in its epilogue
    skips: set[str] = set()    # residual operands those epilogues read
    anchors = [n for n in g.node if _is_anchor(n, inits, exclude_nodes, exclude_ops)]
    anchor_inputs = {n.input[0] for n in anchors}
    for n in anchors:
        weights[n.input[1]] = _weight_axis(n)
        acts.append(n.input[0])
        y, skip = n.output[0], None
        for follow in ("Add", *FOLLOWERS, "region", "residual", *FOLLOWERS):
            # through a constant bias add, then an activation (one node, or several: activation_region), then a
            # residual Add and its activation, each y's only reader; the residual Add only when its other operand is
            # computed before this anchor (that one, a downsample conv or the block's input, is quantized and stored;
            # this anchor's kernel adds it in its epilogue with the float result in registers: no requantization in
            # between)
            if follow == "residual":
                before_residual = y
            if follow == "region":
                y = activation_region(y, users, inits, outputs) if y not in outputs else y
                continue
            r = users.get(y, [])
            if len(r) != 1 or y in outputs or r[0].name in exclude_nodes:
                continue
            add_in = [i for i in r[0].input if i != y]
            if follow == "Add":
                ok = r[0].op_type == "Add" and any(i in inits for i in r[0].input)
            elif follow == "residual":
                ok = r[0].op_type == "Add" and len(add_in) == 1 and add_in[0] not in inits and \
                    position.get(add_in[0], -1) < position[n.output[0]]
            else:
                ok = r[0].op_type in FOLLOWERS
            if ok:
                y = r[0].output[0]
                skip = add_in[0] if follow == "residual" else skip
        if y != before_residual and not any(r.op_type in ANCHOR_OPS and r.input[0] == y for r in users.get(y, [])):
            # the sum is quantized only where an anchor reads it anyway (a ResNet block's output); a transformer's
            # residual stream (read by LayerNorm) stays float: quantizing it there lost 2.5 dB on bert_base
            y = before_residual
        elif skip is not None:
            skips.add(skip)
        produced.append(y)
    # an output is quantized where an anchor reads it (it is then stored 8-bit), or a residual Add followed into an
    # anchor's epilogue: one read only by float ops (a transformer's Q, K, V for attention's float products, the
    # residual stream) stays float — a quantize step there only adds error (bert_base: 23.66 → 23.85 dB)
    readers = anchor_inputs | skips
    acts += [y for y in produced if y not in outputs and _read_by_anchor(y, users, readers)]
    return Plan(anchors, list(dict.fromkeys(acts)), weights)


def quantize_weight(w: np.ndarray, axis: int, per_channel: bool) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric int8: (w_q, scale) with scale per index of `axis` (or one scalar)."""
    if per_channel:
        red = tuple(i for i in range(w.ndim) if i != axis)
        amax = np.abs(w).max(axis=red)
    else:
        amax = np.array(np.abs(w).max())
    scale = np.where(amax > 0, amax / 127.0, 1.0).astype(np.float32)
    shape = [1] * w.ndim
    if per_channel:
        shape[axis] = -1
    q = np.clip(np.round(w / scale.reshape(shape)), -127, 127).astype(np.int8)
    return q, scale


def write_qdq(model: onnx.ModelProto, p: Plan, act_params: dict[str, tuple[np.float32, np.int8]],
              per_channel: bool) -> onnx.ModelProto:
    m = onnx.ModelProto()
    m.CopyFrom(model)
    g = m.graph
    opset = next((o for o in m.opset_import if o.domain in ("", "ai.onnx")), None)
    if opset is not None and opset.version < 13:  # DequantizeLinear's `axis` (per-channel weights)
        opset.version = 13
    inits = {t.name: t for t in g.initializer}
    renames: dict[str, str] = {}
    new_inits: list[onnx.TensorProto] = []
    qdq_nodes: dict[str, list[onnx.NodeProto]] = {}  # inserted after the producer of the key (or first for inputs)
    for t, (s, zp) in act_params.items():
        sn, zn = f"{t}_scale", f"{t}_zero_point"
        new_inits += [numpy_helper.from_array(np.array(s, np.float32), sn),
                      numpy_helper.from_array(np.array(zp, np.int8), zn)]
        qdq_nodes[t] = [helper.make_node("QuantizeLinear", [t, sn, zn], [f"{t}_q"], name=f"{t}_QuantizeLinear"),
                        helper.make_node("DequantizeLinear", [f"{t}_q", sn, zn], [f"{t}_dq"],
                                         name=f"{t}_DequantizeLinear")]
        renames[t] = f"{t}_dq"
    weight_nodes = []
    for wname, axis in p.weights.items():
        wq, scale = quantize_weight(numpy_helper.to_array(inits[wname]), axis, per_channel)
        sn, zn = f"{wname}_scale", f"{wname}_zero_point"
        new_inits += [numpy_helper.from_array(wq, f"{wname}_quantized"), numpy_helper.from_array(scale, sn),
                      numpy_helper.from_array(np.zeros(scale.shape, np.int8), zn)]
        attrs = {"axis": axis} if per_channel else {}
        weight_nodes.append(helper.make_node("DequantizeLinear", [f"{wname}_quantized", sn, zn], [f"{wname}_dq"],
                                             name=f"{wname}_DequantizeLinear", **attrs))
        renames[wname] = f"{wname}_dq"
    at = {id(n): i for i, n in enumerate(model.graph.node)}
    for n in (g.node[at[id(a)]] for a in p.anchors):  # a conv bias: int32 at scale sx·sw (onnxruntime's form)
        if n.op_type != "Conv" or len(n.input) < 3 or n.input[2] not in inits or n.input[0] not in act_params:
            continue
        b = numpy_helper.to_array(inits[n.input[2]]).astype(np.float64)
        sw = quantize_weight(numpy_helper.to_array(inits[n.input[1]]), 0, per_channel)[1]
        sb = (np.float64(act_params[n.input[0]][0]) * sw.astype(np.float64)).astype(np.float32)
        sb = np.broadcast_to(sb, b.shape).copy() if per_channel else sb
        bq = np.clip(np.round(b / sb), -2**31, 2**31 - 1).astype(np.int32)
        name = n.input[2]
        new_inits += [numpy_helper.from_array(bq, f"{name}_quantized"), numpy_helper.from_array(sb, f"{name}_scale"),
                      numpy_helper.from_array(np.zeros(sb.shape, np.int32), f"{name}_zero_point")]
        weight_nodes.append(helper.make_node(
            "DequantizeLinear", [f"{name}_quantized", f"{name}_scale", f"{name}_zero_point"], [f"{name}_dq"],
            name=f"{name}_DequantizeLinear", **({"axis": 0} if per_channel else {})))
        n.input[2] = f"{name}_dq"
    nodes: list[onnx.NodeProto] = list(weight_nodes)
    graph_inputs = {i.name for i in g.input}
    for t in act_params:
        if t in graph_inputs or t in inits:
            nodes += qdq_nodes[t]
    for n in g.node:
        for i, name in enumerate(n.input):
            if name in renames:
                n.input[i] = renames[name]
        nodes.append(n)
        for o in n.output:
            nodes += qdq_nodes.get(o, [])
    used = {i for n in nodes for i in n.input}
    keep = [t for t in g.initializer if t.name in used]
    del g.initializer[:]
    g.initializer.extend(keep + new_inits)
    del g.node[:]
    g.node.extend(nodes)
    return m
