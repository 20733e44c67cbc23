"""OpenVINO peer: the ONNX model read by OpenVINO's frontend and compiled for the "CPU" device in f32.

Precision: on CPUs with AVX512_BF16 (Zen 4 here) OpenVINO runs in bf16 by default (~3e-3 relative
error, and faster); `INFERENCE_PRECISION_HINT = f32` forces the fp32 row that the other peers are
compared on. Strategy "bf16" keeps OpenVINO's default precision for reference.

torch.nn workloads (kind "torch") and strategy "torch-compile": see `_torch_module` below.

Threads: `INFERENCE_NUM_THREADS = threads`, `NUM_STREAMS = 1` and `PERFORMANCE_HINT = LATENCY`
(one inference at a time, batch 1); OpenVINO's TBB executor pins nothing unless ENABLE_CPU_PINNING
says so, which is left at its default. Each run is a synchronous `infer` on one InferRequest with
shared-memory input tensors.

`import openvino` sends a telemetry event by forking a sender process (a fork inside a process that
already runs JAX/torch thread pools, and a network call the benchmark should not make); it is
skipped when CI=true, so the import runs with CI=true set for its duration only.
"""
from __future__ import annotations

import contextlib
import logging
import os
import shutil
from collections.abc import Iterator
from typing import Any

import numpy as np

from kiln.bench.peers.base import FeedRunner, Peer, PeerError, Runner, dist_version, save_model
from kiln.bench.workload import Workload


def import_openvino() -> Any:
    """`import openvino` without its import-time telemetry fork (see the module docstring)."""
    old = os.environ.get("CI")
    os.environ["CI"] = "true"
    try:
        import openvino
    finally:
        if old is None:
            del os.environ["CI"]
        else:
            os.environ["CI"] = old
    return openvino


class OpenVinoPeer(Peer):
    name = "openvino"
    kinds = frozenset({"gemm", "conv", "network", "torch"})
    strategies = ("default", "bf16", "torch-compile")
    requirement = "openvino"
    approach = "runtime with vendor kernels"

    def available(self) -> tuple[bool, str]:
        try:
            import_openvino()
        except Exception as e:
            return False, f"cannot import openvino ({type(e).__name__}: {e}); pip install {self.requirement}"
        return True, ""

    def version(self) -> str:
        return dist_version("openvino")

    precisions = ("fp32", "int8", "bf16")

    def prepare(self, workload: Workload, threads: int, strategy: str = "default") -> Runner:
        strategy = self.check(workload, threads, strategy)
        if strategy == "torch-compile" or workload.build_torch is not None:
            return _torch_module(import_openvino(), workload, threads, strategy)
        run = compiled_runner(read_model(workload), threads, "f32" if strategy == "default" else None)
        feeds = {k: np.ascontiguousarray(v) for k, v in workload.inputs.items()}

        def timed() -> list[np.ndarray]:
            return run(feeds)

        timed.keepalive = run.keepalive  # type: ignore[attr-defined]
        return timed

    def prepare_precision(self, workload: Workload, threads: int, strategy: str, precision: str,
                          calibration: list[dict[str, np.ndarray]]) -> FeedRunner:
        """fp32 and int8 compile with INFERENCE_PRECISION_HINT = f32 (the int8 model's float parts must not turn
        bf16), bf16 with = bf16; int8 is NNCF's post-training `quantize` of the model on `calibration`."""
        self.check(workload, threads, strategy)
        model = read_model(workload)
        if precision == "int8":
            import nncf
            names = [i.get_any_name() for i in model.inputs]
            data = nncf.Dataset(calibration, lambda feeds: {n: feeds[n] for n in names})
            model = nncf.quantize(model, data, subset_size=len(calibration))
        return compiled_runner(model, threads, {"fp32": "f32", "int8": "f32", "bf16": "bf16"}[precision])


def read_model(workload: Workload) -> Any:
    ov = import_openvino()
    path = save_model(workload.build_model(), workload.name)
    try:
        model = ov.Core().read_model(str(path))
        # read_model may map the weights from the file: a copy in memory before the directory goes away
        return model.clone() if hasattr(model, "clone") else model
    finally:
        shutil.rmtree(path.parent, ignore_errors=True)


def precision_of(compiled: Any) -> str:
    """The inference precision a compiled model runs at: 'f32', 'bf16', 'f16'."""
    t = compiled.get_property("INFERENCE_PRECISION_HINT")
    return str(t.get_type_name() if hasattr(t, "get_type_name") else t)


def compiled_runner(model: Any, threads: int, precision_hint: str | None) -> FeedRunner:
    """Compile for "CPU" (threads, one stream, latency) with the given INFERENCE_PRECISION_HINT (None: OpenVINO's
    default, bf16 on CPUs with AVX512_BF16/AMX), checked to be what the compiled model reports."""
    ov = import_openvino()
    core = ov.Core()
    config: dict[str, Any] = {"INFERENCE_NUM_THREADS": threads, "NUM_STREAMS": 1, "PERFORMANCE_HINT": "LATENCY"}
    if precision_hint is not None:
        config["INFERENCE_PRECISION_HINT"] = precision_hint
    compiled = core.compile_model(model, "CPU", config)
    if precision_hint is not None:
        got = precision_of(compiled)
        if got != precision_hint:
            raise PeerError(f"OpenVINO compiled with inference precision {got}, not {precision_hint}")
    req = compiled.create_infer_request()
    names = [i.get_any_name() for i in compiled.inputs]
    outs = compiled.outputs

    def run(feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        res = req.infer({n: np.ascontiguousarray(feeds[n]) for n in names}, share_inputs=True)
        return [res[o] for o in outs]

    run.keepalive = (core, compiled)  # type: ignore[attr-defined]
    return run


def _torch_module(ov: Any, workload: Workload, threads: int, strategy: str) -> Runner:
    """Strategy "torch-compile": OpenVINO's torch.compile backend (`backend="openvino"`, registered by the openvino
    wheel) on the torch module (a torch workload's own nn.Module, or the ONNX model translated to aten ops),
    compiled at the first call, which is made here (so compile_s includes it). Other strategies on a torch
    workload: the nn.Module read by OpenVINO's PyTorch frontend (`openvino.convert_model`)."""
    import torch

    from kiln.bench.peers.torch import module_and_inputs, outputs_to_numpy, set_threads

    config = {"INFERENCE_NUM_THREADS": threads, "NUM_STREAMS": 1, "PERFORMANCE_HINT": "LATENCY"}
    if strategy != "bf16":
        config["INFERENCE_PRECISION_HINT"] = "f32"
    set_threads(threads)  # ATen's pool, for what the torch.compile backend leaves to eager PyTorch
    module, xs = module_and_inputs(workload)
    if strategy == "torch-compile":
        # aot_autograd: the backend's own make_fx trace (the default) fails under torch 2.13's dynamo ("sources
        # must not be empty for symbol"); through AOTAutograd it gets a traced graph with parameters as constants
        compiled = torch.compile(module, backend="openvino", options={
            "device": "CPU", "aot_autograd": True, "config": {k: str(v) for k, v in config.items()}})
        with torch.no_grad(), _openvino_failures() as failures:
            compiled(*xs)
        if failures:  # the backend swallows its errors and compiles with inductor instead: not OpenVINO's number
            raise RuntimeError(f"openvino's torch.compile backend failed (it fell back to inductor): {failures[0]}")

        def run_compiled() -> list[np.ndarray]:
            with torch.no_grad():
                return outputs_to_numpy(compiled(*xs))

        return run_compiled
    core = ov.Core()
    with torch.no_grad():
        model = core.compile_model(ov.convert_model(module, example_input=tuple(xs)), "CPU", config)
    req = model.create_infer_request()
    feeds = {i: x.numpy() for i, x in enumerate(xs)}
    outs = model.outputs

    def run() -> list[np.ndarray]:
        res = req.infer(feeds, share_inputs=True)
        return [res[o] for o in outs]

    run.keepalive = (core, model)  # type: ignore[attr-defined]
    return run


@contextlib.contextmanager
def _openvino_failures() -> Iterator[list[str]]:
    """The failures OpenVINO's torch.compile backend logs (at debug level) before falling back to inductor."""
    failures: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.getMessage().startswith("Failed in OpenVINO"):
                failures.append(record.getMessage())

    log = logging.getLogger("openvino.frontend.pytorch.torchdynamo.backend")
    handler, level = Collect(logging.DEBUG), log.level
    log.addHandler(handler)
    log.setLevel(logging.DEBUG)
    try:
        yield failures
    finally:
        log.removeHandler(handler)
        log.setLevel(level)
