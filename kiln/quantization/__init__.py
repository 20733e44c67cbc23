"""Kiln's post-training quantization (Glow-style profile → choose → rewrite), returning a QDQ ONNX model.

    q = kiln.quantize(model, calibration_feeds)          # a QDQ onnx.ModelProto
    exe = kiln.compile(q)                                # integer anchors (graph/passes/quantize_qdq.py)
    kiln.quantization_report(model, q, feeds)            # per-layer SNR against the float model

Steps: prepare (prepare.py: BatchNorms folded into their convs) → plan (qdq.py: which anchors, which tensors) →
calibrate (calibrate.py: the float model compiled by Kiln, run on the feeds, ranges by minmax / percentile /
entropy) → scales and zero points → write the QDQ model."""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx

from kiln.quantization.calibrate import METHODS, check_feeds, observe, qparams
from kiln.quantization.prepare import fold_batchnorm
from kiln.quantization.qdq import plan, write_qdq


def quantize(model: onnx.ModelProto | str, calibration_feeds: Sequence[dict[str, np.ndarray]], *,
             method: str = "minmax", per_channel: bool = True, symmetric: bool = False,
             exclude_nodes: Sequence[str] = (), exclude_ops: Sequence[str] = (), percentile: float = 99.999,
             target: str = "host") -> onnx.ModelProto:
    """A QDQ (int8) version of the float `model`, calibrated on `calibration_feeds` (a list of {input: array}).

    method       how activation ranges are chosen from the observed values: "minmax" | "percentile" | "entropy"
    per_channel  weight scales per output channel (else one per tensor); weights are always symmetric int8
    symmetric    activation zero points 0 (else asymmetric int8 ranges)
    exclude_*    anchors (by node name / op type) left in float"""
    from kiln.frontend.onnx import load_model

    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    proto = fold_batchnorm(load_model(model))   # prepare.py: BatchNorms into their convs, as quant_pre_process
    feeds = check_feeds(proto, calibration_feeds)
    p = plan(proto, tuple(exclude_nodes), tuple(exclude_ops))
    if not p.anchors:
        return proto
    ranges = observe(proto, p.activations, feeds, method, percentile, target)
    params = {t: qparams(*ranges[t], symmetric) for t in p.activations}
    return write_qdq(proto, p, params, per_channel)


def snr_db(ref: np.ndarray, got: np.ndarray) -> float:
    """10·log10(Σ ref² / Σ (ref − got)²); inf when equal."""
    ref, got = np.asarray(ref, np.float64), np.asarray(got, np.float64)
    noise = float(np.sum((ref - got) ** 2))
    return float("inf") if noise == 0 else 10.0 * np.log10(max(float(np.sum(ref ** 2)), 1e-300) / noise)


def quantization_report(fp32_model: onnx.ModelProto, quantized_model: onnx.ModelProto,
                        feeds: Sequence[dict[str, np.ndarray]], target: str = "host") -> list[dict]:
    """Per-layer error of the quantized model against the float one, both compiled by Kiln: for every anchor
    output (Conv/MatMul/Gemm, by tensor name in both models) and every graph output, the SNR in dB and the largest
    absolute error over `feeds`. The quantized model's anchors are read where they are materialized as float."""
    from kiln.compiler import compile as kiln_compile
    from kiln.frontend.onnx import load_model
    from kiln.quantization.calibrate import instrumented
    from kiln.quantization.qdq import ANCHOR_OPS

    f32, q = load_model(fp32_model), load_model(quantized_model)
    feeds = check_feeds(f32, feeds)
    q_tensors = {o for n in q.graph.node for o in n.output}
    layers = [(n.output[0], n.op_type, n.name) for n in f32.graph.node
              if n.op_type in ANCHOR_OPS and n.output[0] in q_tensors]
    finals = [(o.name, "output", o.name) for o in f32.graph.output]
    names = [t for t, _, _ in layers + finals]
    exe_f = kiln_compile(instrumented(f32, names), target=target)
    exe_q = kiln_compile(instrumented(q, names), target=target)
    ref: dict[str, list[np.ndarray]] = {t: [] for t in names}
    got: dict[str, list[np.ndarray]] = {t: [] for t in names}
    for f in feeds:
        for exe, into in ((exe_f, ref), (exe_q, got)):
            outs = dict(zip([o["name"] for o in exe.meta["outputs"]], exe.run(f)))
            for t in names:
                into[t].append(outs[t])
    report = []
    for t, op, node in layers + finals:
        r, g = np.concatenate([a.ravel() for a in ref[t]]), np.concatenate([a.ravel() for a in got[t]])
        report.append({"tensor": t, "op": op, "node": node, "snr_db": snr_db(r, g),
                       "max_abs_err": float(np.abs(r - g).max())})
    return report


__all__ = ["quantize", "quantization_report", "snr_db", "METHODS"]
