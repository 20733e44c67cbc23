"""The reference a workload's outputs are checked against before any timing, and the check itself.

NumPy float64 for a GEMM, onnxruntime (fp32, all optimizations) otherwise; max_rel_err = max|out - ref| / max|ref|.
Imports nothing of the bench but the workload, so kiln/isa can check its runs without importing the protocol."""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .workload import Workload


@dataclass
class Reference:
    outputs: list[np.ndarray] | None
    bytes: float                 # compulsory memory traffic: inputs + weights + outputs
    error: str = ""



# ---- reference and checking ---------------------------------------------------------------------

def reference(w: Workload, threads: int) -> Reference:
    in_bytes = float(sum(a.nbytes for a in w.inputs.values()))
    if w.gemm is not None:
        g = w.gemm
        out = g.a.astype(np.float64) @ g.b.astype(np.float64)
        return Reference([out], in_bytes + g.b.nbytes + 4.0 * g.m * g.n)
    if w.build_torch is not None:
        try:
            outs, weights = _eager_float64(w)
        except Exception as exc:  # reported per record as 'unchecked'
            return Reference(None, in_bytes, f"reference failed: {type(exc).__name__}: {exc}")
        return Reference(outs, in_bytes + weights + sum(o.nbytes / 2 for o in outs))
    try:
        model = w.build_model()
        weights = float(sum(int(np.prod(t.dims)) * 4 for t in model.graph.initializer))
        outs = onnxruntime_outputs(model, w.inputs, threads)
    except Exception as exc:  # reported per record as 'unchecked'
        return Reference(None, in_bytes, f"reference failed: {type(exc).__name__}: {exc}")
    return Reference(outs, in_bytes + weights + sum(o.nbytes for o in outs))


def _eager_float64(w: Workload) -> tuple[list[np.ndarray], float]:
    """A torch workload's outputs from eager PyTorch in float64 (its reference), and its float32 weight bytes."""
    import torch

    module, _ = w.build_torch()
    weights = float(sum(t.numel() * 4 for t in module.state_dict().values() if t.is_floating_point()))
    xs = [torch.from_numpy(np.asarray(a, dtype=np.float64)) for a in w.inputs.values()]
    with torch.no_grad():
        outs = module.double().eval()(*xs)
    return [o.numpy() for o in (outs if isinstance(outs, (tuple, list)) else [outs])], weights


def onnxruntime_outputs(model: Any, feeds: dict[str, np.ndarray], threads: int) -> list[np.ndarray]:
    import onnxruntime as ort
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return [np.asarray(o) for o in sess.run(None, feeds)]


def check(outputs: Sequence[Any], ref: Sequence[np.ndarray], tol: float) -> tuple[bool, float, str]:
    """(ok, max_rel_err, reason). Same-size outputs of another shape are compared flattened."""
    if len(outputs) != len(ref):
        return False, math.inf, f"{len(outputs)} outputs, expected {len(ref)}"
    worst = 0.0
    for i, (out, want) in enumerate(zip(outputs, ref)):
        out = np.asarray(out)
        if out.size != want.size:
            return False, math.inf, f"output {i} has shape {out.shape}, expected {want.shape}"
        diff = np.abs(out.reshape(want.shape).astype(np.float64) - want)
        scale = float(np.max(np.abs(want))) if want.size else 0.0
        err = float(np.max(diff)) / (scale or 1.0) if want.size else 0.0
        worst = max(worst, err if math.isfinite(err) else math.inf)
    if worst > tol:
        return False, worst, f"max relative error {worst:.3g} > {tol:g}"
    return True, worst, ""
