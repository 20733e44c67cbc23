"""Compile times (cold, then cached) and errors against onnxruntime for every zoo model and the nine `light`
models that ship inside the onnx package (those against their shipped expected outputs).

    python benchmarks/compile_report.py"""
from __future__ import annotations

import os
import tempfile
import time

import numpy as np
import onnx
import onnxruntime as ort
from onnx import numpy_helper

import kiln
from kiln import zoo


def ort_run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    so = ort.SessionOptions()
    so.intra_op_num_threads, so.log_severity_level = 2, 3
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, feeds)


def timed_compile(model: onnx.ModelProto, **kw: object) -> tuple[kiln.Executable, float]:
    t = time.perf_counter()
    exe = kiln.compile(model, num_threads=2, **kw)
    return exe, time.perf_counter() - t


def main() -> None:
    os.environ["KILN_CACHE_DIR"] = tempfile.mkdtemp()
    rows = []
    for name in zoo.names():
        model, feeds = zoo.build(name), zoo.inputs(name)
        _, cold = timed_compile(model)
        exe, warm = timed_compile(model)
        out, ref = exe.run(feeds)[0], ort_run(model, feeds)[0]
        err = float(np.abs(out - ref).max())
        rows.append((f"zoo:{name}", cold, f"{warm:.2f}", err, err / float(np.abs(ref).max())))
    light = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")
    for f in sorted(x for x in os.listdir(light) if x.endswith(".onnx")):
        model = onnx.load(os.path.join(light, f))
        exe, cold = timed_compile(model, cache=False)
        feeds = {exe.input_names[0]: np.random.default_rng(0).standard_normal(exe.inputs[0].shape).astype(np.float32)}
        out = exe.run(feeds)[0]
        expected = numpy_helper.to_array(onnx.load_tensor(os.path.join(light, f[:-5] + "_output_0.pb")))
        err = float(np.abs(out - ort_run(model, feeds)[0]).max())
        rows.append((f[:-5], cold, "", err, float(np.abs(out - expected).max() / np.abs(expected).max())))
    print("| model | compile s (cold) | compile s (cached) | max abs err vs onnxruntime | max rel err |")
    print("|---|---:|---:|---:|---:|")
    for name, cold, warm, err, rel in rows:
        print(f"| {name} | {cold:.2f} | {warm} | {err:.2e} | {rel:.2e} |")


if __name__ == "__main__":
    main()
