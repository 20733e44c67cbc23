"""Time one system on one zoo model with a plain perf_counter loop, to check `kiln bench`'s numbers against.

    python benchmarks/spot_check.py resnet18 onnxruntime|openvino|kiln

Run each system in its own process (as kiln bench does); 2 threads; 10 warm-up runs, median of 50."""
from __future__ import annotations

import sys
import time
from collections.abc import Callable

import numpy as np

from kiln import zoo


def runner(system: str, name: str) -> Callable[[], object]:
    model, feeds = zoo.build(name), zoo.inputs(name)
    if system == "onnxruntime":
        import onnxruntime as ort
        so = ort.SessionOptions()
        so.intra_op_num_threads, so.inter_op_num_threads = 2, 1
        sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
        return lambda: sess.run(None, feeds)
    if system == "openvino":
        import openvino as ov
        core = ov.Core()
        compiled = core.compile_model(core.read_model(model.SerializeToString()), "CPU",
                                      {"INFERENCE_NUM_THREADS": 2, "INFERENCE_PRECISION_HINT": "f32"})
        req = compiled.create_infer_request()
        return lambda: req.infer(feeds)
    import kiln
    exe = kiln.compile(model, num_threads=2, cache=False)
    return lambda: exe.run(feeds)


def main(name: str, system: str) -> None:
    run = runner(system, name)
    for _ in range(10):
        run()
    times = []
    for _ in range(50):
        t = time.perf_counter()
        run()
        times.append(time.perf_counter() - t)
    print(f"{system} {name}: median {np.median(times) * 1e3:.2f} ms (plain loop, 50 runs after 10 warm-up)")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
