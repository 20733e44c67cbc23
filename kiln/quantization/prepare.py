"""Before planning: fold each BatchNormalization into the Conv before it, on the ONNX model (what onnxruntime's
`quant_pre_process` does before its quantizer).

    Conv(x, W, b) → BatchNormalization(γ, β, μ, σ², ε)    ⇒    Conv(x, W·s, (b − μ)·s + β),   s = γ / √(σ² + ε)

Without it the QDQ model quantizes the conv's output *before* its BatchNorm: the normalization then runs in float
between a DequantizeLinear and a QuantizeLinear, and every integer conv's output leaves the blocked layout for it —
on resnet50 a quarter of the int8 model's time went to BatchNorm and layout kernels. Kiln's float pipeline folds
BatchNorm in the graph IR (graph/passes/fold_batchnorm.py); the quantizer works on the ONNX model, so it folds
here, where the scales are chosen from the folded weights. A Conv read by others too, or a BatchNorm in training
mode or with non-constant parameters, is left as it is."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper


def fold_batchnorm(model: onnx.ModelProto) -> onnx.ModelProto:
    m = onnx.ModelProto()
    m.CopyFrom(model)
    g = m.graph
    inits = {t.name: t for t in g.initializer}
    readers: dict[str, int] = {}
    for n in g.node:
        for i in n.input:
            readers[i] = readers.get(i, 0) + 1
    outputs = {o.name for o in g.output}
    producer = {o: n for n in g.node for o in n.output}
    dropped: set[int] = set()
    for bn in g.node:
        conv = producer.get(bn.input[0]) if bn.op_type == "BatchNormalization" else None
        if conv is None or conv.op_type != "Conv" or readers.get(conv.output[0]) != 1 or conv.output[0] in outputs:
            continue
        params = [inits.get(t) for t in (conv.input[1], *bn.input[1:5])]
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in bn.attribute}
        if any(p is None for p in params) or attrs.get("training_mode", 0) or len(bn.output) > 1 \
                or readers.get(conv.input[1]) != 1:
            continue
        w, gamma, beta, mean, var = (numpy_helper.to_array(p).astype(np.float64) for p in params)
        b = numpy_helper.to_array(inits[conv.input[2]]).astype(np.float64) \
            if len(conv.input) > 2 and conv.input[2] in inits else np.zeros(w.shape[0])
        s = gamma / np.sqrt(var + float(attrs.get("epsilon", 1e-5)))
        wname, bname = f"{conv.input[1]}_bnfolded", f"{bn.output[0]}_bnfolded_bias"
        g.initializer.extend([numpy_helper.from_array((w * s.reshape(-1, 1, 1, 1)).astype(np.float32), wname),
                              numpy_helper.from_array(((b - mean) * s + beta).astype(np.float32), bname)])
        del conv.input[1:]
        conv.input.extend([wname, bname])
        conv.output[0] = bn.output[0]
        dropped.add(id(bn))
    kept = [n for n in g.node if id(n) not in dropped]
    del g.node[:]
    g.node.extend(kept)
    used = {i for n in g.node for i in n.input} | outputs
    gone = {t.name for t in g.initializer if t.name not in used}
    live = [t for t in g.initializer if t.name not in gone]
    del g.initializer[:]
    g.initializer.extend(live)
    inputs = [i for i in g.input if i.name not in gone]  # old models list initializers as inputs too
    del g.input[:]
    g.input.extend(inputs)
    return m
