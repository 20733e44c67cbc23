"""Compile times (cold, then cached) and errors against onnxruntime for every zoo model and the nine `light`
models that ship inside the onnx package (those against their shipped expected outputs); for the zoo models also
Kiln's cold compile per stage (graph passes, lower + schedule + memory plan, LLVM IR emission, LLVM -O3 + machine
code; a split build's codegen and LLVM stages as CPU seconds over its processes, and their elapsed time) beside
onnxruntime's session creation and OpenVINO's compile_model (2 threads each).

A zoo model's cold compile is timed 1 + --repeat times, each into an empty cache directory: the first in the process
(it also pays the imports the compiler defers and the thread pool's JIT), then the median of the others — one sample
on a shared 2-core host spread 3.1–4.2 s for resnet50 (2026-11-30).

    python benchmarks/compile_report.py [--zoo-only] [--repeat N] [MODEL ...]"""
from __future__ import annotations

import argparse
import os
import tempfile
import time

import numpy as np
import onnx
import onnxruntime as ort
from onnx import numpy_helper

import kiln
from kiln import zoo
from kiln.compiler import finish_cache_writes


def ort_run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    so = ort.SessionOptions()
    so.intra_op_num_threads, so.log_severity_level = 2, 3
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, feeds)


def timed_compile(model: onnx.ModelProto, **kw: object) -> tuple[kiln.Executable, float]:
    t = time.perf_counter()
    exe = kiln.compile(model, num_threads=2, **kw)
    return exe, time.perf_counter() - t


def peer_session_s(model: onnx.ModelProto) -> tuple[float, float | None]:
    """onnxruntime's InferenceSession creation and OpenVINO's read + compile_model, seconds (None: no OpenVINO)."""
    data = model.SerializeToString()
    so = ort.SessionOptions()
    so.intra_op_num_threads, so.log_severity_level = 2, 3
    t = time.perf_counter()
    ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])
    ort_s = time.perf_counter() - t
    try:
        import openvino as ov
    except ImportError:
        return ort_s, None
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "m.onnx")
        with open(path, "wb") as f:
            f.write(data)
        t = time.perf_counter()
        ov.Core().compile_model(ov.Core().read_model(path), "CPU", {"INFERENCE_NUM_THREADS": 2})
        return ort_s, time.perf_counter() - t


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("models", nargs="*", default=zoo.names(), help="zoo model names (default: all)")
    p.add_argument("--zoo-only", action="store_true", help="skip the onnx package's light models")
    p.add_argument("--repeat", type=int, default=3, help="cold compiles after the first, each into an empty cache "
                   "(their median is reported beside the first; default 3)")
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as caches:  # the compile caches (resnet50's entry is its 100 MB of weights)
        report(a.models, a.zoo_only, a.repeat, caches)


def report(models: list[str], zoo_only: bool, repeat: int, caches: str) -> None:
    rows, stages = [], []
    for name in models:
        model, feeds = zoo.build(name), zoo.inputs(name)
        colds = []
        for _ in range(1 + max(0, repeat)):
            os.environ["KILN_CACHE_DIR"] = tempfile.mkdtemp(dir=caches)  # a cache miss every time
            colds.append(timed_compile(model))  # until the executable is returned; its cache entry is written meanwhile
            finish_cache_writes()
        first, rest = colds[0][1], colds[1:] or colds
        cold_exe, cold = sorted(rest, key=lambda c: c[1])[len(rest) // 2]
        warms = [timed_compile(model) for _ in range(3)]  # cache hits: the median of three
        exe, warm = warms[0][0], sorted(w for _, w in warms)[1]
        out, ref = exe.run(feeds)[0], ort_run(model, feeds)[0]
        err = float(np.abs(out - ref).max())
        rows.append((f"zoo:{name}", f"{first:.2f}", cold, f"{warm:.2f}", err, err / float(np.abs(ref).max())))
        ort_s, ov_s = peer_session_s(model)
        stages.append((f"zoo:{name}", cold, cold_exe.meta["compile_s"], ort_s, ov_s))
    light = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")
    for f in sorted(x for x in os.listdir(light) if x.endswith(".onnx") and not zoo_only):
        model = onnx.load(os.path.join(light, f))
        exe, cold = timed_compile(model, cache=False)
        feeds = {exe.input_names[0]: np.random.default_rng(0).standard_normal(exe.inputs[0].shape).astype(np.float32)}
        out = exe.run(feeds)[0]
        expected = numpy_helper.to_array(onnx.load_tensor(os.path.join(light, f[:-5] + "_output_0.pb")))
        err = float(np.abs(out - ort_run(model, feeds)[0]).max())
        rows.append((f[:-5], "", cold, "", err, float(np.abs(out - expected).max() / np.abs(expected).max())))
    print("| model | compile s (cold, first in process) | compile s (cold, median) | compile s (cached) "
          "| max abs err vs onnxruntime | max rel err |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, first, cold, warm, err, rel in rows:
        print(f"| {name} | {first} | {cold:.2f} | {warm} | {err:.2e} | {rel:.2e} |")
    print("\n| model | Kiln cold s (median run) | graph | lower | codegen | llvm | codegen+llvm wall "
          "| onnxruntime session s | OpenVINO compile s |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name, cold, st, ort_s, ov_s in stages:
        parts = " | ".join(f"{_stage(st, k):.2f}" for k in ("graph", "lower", "codegen", "llvm"))
        wall = st.get("codegen+llvm", st.get("codegen", 0.0) + st.get("llvm", 0.0))
        print(f"| {name} | {cold:.2f} | {parts} | {wall:.2f} | {ort_s:.2f} | {'' if ov_s is None else f'{ov_s:.2f}'} |")
    print("\ncodegen, llvm: seconds of one process, or, split into compile units (kiln/codegen/split.py), CPU seconds "
          "summed over the processes; codegen+llvm wall: the two stages' elapsed time.")


def _stage(st: dict[str, float], k: str) -> float:
    """A stage's seconds: its elapsed time in one process, or its CPU seconds over the processes of a split build."""
    return st.get(f"{k}_cpu", st.get(k, 0.0))


if __name__ == "__main__":
    main()
