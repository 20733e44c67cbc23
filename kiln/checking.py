"""Comparing a run's outputs with a reference (onnxruntime), shared by `kiln run --check` on the host and under
qemu (kiln/cross/cli.py)."""
from __future__ import annotations

import numpy as np


def check_outputs(names: list[str], outs: list[np.ndarray], ref: list[np.ndarray], rtol: float, where: str = "",
                  indent: str = "  ") -> int:
    """Print each output's error against onnxruntime's (max abs, and max abs ÷ max |ref|); 1 if any is over
    `rtol`, else 0."""
    status = 0
    for name, o, r in zip(names, outs, ref):
        err = float(np.abs(o.astype(np.float64) - r).max()) if o.size else 0.0
        scale = float(np.abs(r).max()) if r.size else 0.0
        rel = err / scale if scale else err
        ok = rel <= rtol
        status |= 0 if ok else 1
        print(f"{indent}check {name}{where} vs onnxruntime: max abs err {err:.3g}, max rel err {rel:.3g} "
              f"→ {'OK' if ok else 'MISMATCH'} (rtol {rtol})")
    return status
