"""The precision axis of `kiln bench --precision fp32,int8,bf16`: data, quantized models, quality.

* Data, deterministic and built in code: per workload, `calibration_feeds` (100 inputs by default, the same for
  every system that calibrates) and `evaluation_feeds` (500 further inputs), shaped and typed like the
  workload's feeds (standard normal float32, as the zoo's inputs are; integer feeds such as token ids drawn
  from the range the workload's own feed covers). Seeds differ from the timed feed's, and from each other.
* Quantized models, each system's own tool on the same calibration data: onnxruntime's `quantize_static`
  (QDQ, S8S8, per-channel weights: `ort_qdq_model`), NNCF's `quantize` for OpenVINO (kiln/bench/peers/
  openvino.py), PT2E with the X86 inductor quantizer for PyTorch (kiln/bench/peers/inductor.py), and
  `kiln.quantize` for Kiln (kiln/bench/kiln_system.py).
* Quality against the fp32 run of the same system on the evaluation inputs (`Quality`): top-1 agreement
  (classifiers: an output [1, classes]), signal-to-noise ratio of the outputs in dB, and max relative error.

Before timing, a low-precision row is checked against the workload's fp32 reference like every row, with the
tolerance of its precision (`SNR_FLOOR`): a floor that only a broken system misses (random weights make
int8 much noisier than on a trained model), the quality columns say how good it is.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .workload import Workload

PRECISIONS: tuple[str, ...] = ("fp32", "int8", "bf16")
CALIBRATION_INPUTS = 100
EVALUATION_INPUTS = 500
CALIBRATION_SEED = 1000
EVALUATION_SEED = 2000
# Output SNR (dB) a low-precision run must reach against the fp32 reference before it is timed.
# bf16: resnet50 with random weights (50 layers) reaches 19.8 dB in Kiln and 18.7 dB in OpenVINO's own bf16 on an AMX
# host — both correct; a bf16 path that pairs or rounds wrongly lands far below 15
SNR_FLOOR: dict[str, float] = {"int8": 10.0, "bf16": 15.0}

FeedRunner = Callable[[dict[str, np.ndarray]], list[np.ndarray]]


def check_precision(p: str) -> str:
    if p not in PRECISIONS:
        raise ValueError(f"unknown precision {p!r}; known: {', '.join(PRECISIONS)}")
    return p


def _like(x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    if np.issubdtype(x.dtype, np.floating):
        return rng.standard_normal(x.shape).astype(x.dtype)
    if x.dtype == np.bool_:
        return rng.integers(0, 2, x.shape).astype(np.bool_)
    lo, hi = int(x.min()), int(x.max())
    return rng.integers(lo, max(hi, lo) + 1, x.shape).astype(x.dtype)


def _feeds(w: Workload, seed: int, n: int) -> Iterator[dict[str, np.ndarray]]:
    for i in range(n):
        rng = np.random.default_rng([seed, i])
        yield {k: _like(v, rng) for k, v in w.inputs.items()}


def calibration_feeds(w: Workload, n: int = CALIBRATION_INPUTS) -> list[dict[str, np.ndarray]]:
    """The calibration set: `n` inputs like the workload's, the same for every system and every run."""
    return list(_feeds(w, CALIBRATION_SEED, n))


def evaluation_feeds(w: Workload, n: int = EVALUATION_INPUTS) -> Iterator[dict[str, np.ndarray]]:
    """The evaluation set: `n` further inputs (a generator: 500 resnet50 inputs are 300 MB)."""
    return _feeds(w, EVALUATION_SEED, n)


@dataclass
class Quality:
    """Accumulates low-precision outputs against fp32 outputs of the same system, input by input."""
    inputs: int = 0
    agree: int = 0
    classified: int = 0
    signal: float = 0.0
    noise: float = 0.0
    max_rel_err: float = 0.0
    per_output: list[str] = field(default_factory=list)

    def add(self, low: list[np.ndarray], ref: list[np.ndarray]) -> None:
        if len(low) != len(ref):
            raise ValueError(f"{len(low)} outputs, the fp32 run gave {len(ref)}")
        self.inputs += 1
        for lo, r in zip(low, ref):
            lo = np.asarray(lo, np.float64).reshape(np.shape(r))
            r = np.asarray(r, np.float64)
            self.signal += float(np.sum(r * r))
            self.noise += float(np.sum((lo - r) ** 2))
            scale = float(np.max(np.abs(r))) or 1.0
            self.max_rel_err = max(self.max_rel_err, float(np.max(np.abs(lo - r))) / scale)
        first = np.asarray(ref[0])
        if first.ndim == 2 and first.shape[0] == 1 and first.shape[1] > 1:  # a classifier's logits
            self.classified += 1
            self.agree += int(np.argmax(low[0]) == np.argmax(first))

    def result(self) -> dict[str, Any]:
        snr = math.inf if self.noise == 0 else 10.0 * math.log10(self.signal / self.noise) if self.signal else -math.inf
        return {"eval_inputs": self.inputs, "snr_db": snr, "quality_max_rel_err": self.max_rel_err,
                "top1_agreement": self.agree / self.classified if self.classified else None}


def snr_db(out: list[np.ndarray], ref: list[np.ndarray]) -> float:
    q = Quality()
    q.add(out, ref)
    return float(q.result()["snr_db"])


def evaluate(low: FeedRunner, fp32: FeedRunner, w: Workload, n: int) -> dict[str, Any]:
    """Quality of `low` against `fp32` (the same system) on the first `n` evaluation inputs."""
    q = Quality()
    for feeds in evaluation_feeds(w, n):
        q.add(low(feeds), fp32(feeds))
    return q.result()


class _Reader:
    """onnxruntime.quantization's CalibrationDataReader over a list of feeds."""

    def __init__(self, feeds: list[dict[str, np.ndarray]]) -> None:
        self._it = iter(feeds)

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self._it, None)


def ort_qdq_model(model: Any, calibration: list[dict[str, np.ndarray]]) -> Any:
    """`quantize_static` as Intel's and Microsoft's CPU recipes use it: QDQ format, int8 activations and weights
    (S8S8), per-channel weights, MinMax calibration on `calibration`; returns the quantized ModelProto."""
    import tempfile
    from pathlib import Path

    import onnx
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    with tempfile.TemporaryDirectory(prefix="kiln-qdq-") as d:
        src, pre, dst = Path(d) / "fp32.onnx", Path(d) / "pre.onnx", Path(d) / "int8.onnx"
        onnx.save_model(model, str(src))
        try:  # the recommended pre-processing (shape inference, graph optimization); plain model if it fails
            quant_pre_process(str(src), str(pre), skip_symbolic_shape=True)
        except Exception:
            pre = src
        quantize_static(str(pre), str(dst), _Reader(calibration), quant_format=QuantFormat.QDQ,
                        activation_type=QuantType.QInt8, weight_type=QuantType.QInt8, per_channel=True)
        return onnx.load_model(str(dst))
