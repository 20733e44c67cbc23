"""IREE peer: ONNX imported with iree-import-onnx, compiled by iree-compile for llvm-cpu, run on local-task.

Strategies (compiler flags on top of `--iree-llvmcpu-target-cpu=host`):
- "default": IREE's defaults (O0, no data tiling: `linalg.matmul` tiled with sizes that must divide
  the shape; odd shapes fall back to scalar code).
- "data-tiling": `--iree-opt-level=O2 --iree-opt-data-tiling=true --iree-llvmcpu-enable-ukernels=none`:
  each matmul becomes pack -> mmt4d -> unpack, constant weights packed at compile time, mmt4d
  vectorized by MLIR codegen.
- "data-tiling+ukernels": the same with `--iree-llvmcpu-enable-ukernels=all` (mmt4d/pack/unpack as
  IREE's inlined C microkernels).
- "data-tiling+ukernels+conv": also IREE's experimental data tiling of convolutions
  (`--iree-dispatch-creation-experimental-set-data-tiling-ops`, repeated once per op family; it
  *replaces* the default {matmul, scaled_matmul}, so those are listed too: `=convolution` alone
  turned off data tiling of matmuls, gemm 129x771x257 went 0.5 -> 16 ms). 3x3 conv 256ch 14x14
  ~1.8x faster here; depthwise not helped.

Threads: `--task_topology_max_group_count=threads` (one worker per group) parsed as a runtime flag
before the local-task driver is created. IREE's Python API caches that driver for the process, so the
first prepare() fixes the count; a later one with another count raises PeerError (use a fresh
process). Placement is IREE's topology default.
The feeds are copied to device buffers once in prepare(); each run invokes the function and copies
the results to host numpy arrays.
"""
from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from kiln.bench.peers.base import Peer, PeerError, Runner, dist_version, input_names, save_model, try_import
from kiln.bench.workload import Workload

STRATEGY_FLAGS: dict[str, tuple[str, ...]] = {
    "default": (),
    "data-tiling": ("--iree-opt-level=O2", "--iree-opt-data-tiling=true",
                    "--iree-llvmcpu-enable-ukernels=none"),
    "data-tiling+ukernels": ("--iree-opt-level=O2", "--iree-opt-data-tiling=true",
                             "--iree-llvmcpu-enable-ukernels=all"),
    "data-tiling+ukernels+conv": ("--iree-opt-level=O2", "--iree-opt-data-tiling=true",
                                  "--iree-llvmcpu-enable-ukernels=all",
                                  *(f"--iree-dispatch-creation-experimental-set-data-tiling-ops={f}"
                                    for f in ("matmul", "scaled_matmul", "convolution"))),
}
_driver_threads: list[int] = []


def import_onnx(onnx_path: Path, mlir_path: Path) -> None:
    """iree-import-onnx, in-process (the console script is a thin wrapper around this)."""
    from iree.compiler.tools.import_onnx.__main__ import main, parse_arguments

    main(parse_arguments([str(onnx_path), "-o", str(mlir_path)]))


def device(threads: int):
    """The local-task device, its executor created with `threads` workers on first use."""
    import iree.runtime as rt

    if not _driver_threads:
        rt.flags.parse_flags(f"--task_topology_max_group_count={threads}")
        _driver_threads.append(threads)
    if _driver_threads[0] != threads:
        raise PeerError(f"IREE's local-task driver was created with {_driver_threads[0]} threads in this "
                        f"process; threads={threads} needs a fresh process")
    return rt.get_device("local-task")


class IreePeer(Peer):
    name = "iree"
    kinds = frozenset({"gemm", "conv", "network"})
    strategies = tuple(STRATEGY_FLAGS)
    requirement = "iree-base-compiler iree-base-runtime"
    approach = "compiler"

    def __init__(self, extra_flags: Sequence[str] = ()) -> None:
        self.extra_flags = tuple(extra_flags)

    def available(self) -> tuple[bool, str]:
        return try_import("iree.compiler", "iree.runtime", "iree.compiler.tools.import_onnx.__main__",
                          pip=self.requirement)

    def version(self) -> str:
        return f"compiler {dist_version('iree-base-compiler')}, runtime {dist_version('iree-base-runtime')}"

    def prepare(self, workload: Workload, threads: int, strategy: str = "default") -> Runner:
        strategy = self.check(workload, threads, strategy)
        import iree.compiler as ic
        import iree.runtime as rt

        dev = device(threads)
        model = workload.build_model()
        onnx_path = save_model(model, workload.name)
        try:
            mlir = onnx_path.with_suffix(".mlir")
            import_onnx(onnx_path, mlir)
            flags = ["--iree-llvmcpu-target-cpu=host", *STRATEGY_FLAGS[strategy], *self.extra_flags]
            vmfb = ic.compile_file(str(mlir), target_backends=["llvm-cpu"], extra_args=flags)
            func_name = _func_name(mlir)
        finally:
            shutil.rmtree(onnx_path.parent, ignore_errors=True)
        config = rt.Config(device=dev)
        ctx = rt.SystemContext(config=config)
        ctx.add_vm_module(rt.VmModule.copy_buffer(ctx.instance, vmfb))
        fn = ctx.modules.module[func_name]
        args = [rt.asdevicearray(dev, np.ascontiguousarray(workload.inputs[n])) for n in input_names(model)]

        def run() -> list[np.ndarray]:
            res = fn(*args)
            return [r.to_host() for r in (res if isinstance(res, (tuple, list)) else [res])]

        run.keepalive = (ctx, config)  # type: ignore[attr-defined]
        return run


def _func_name(mlir: Path) -> str:
    """The imported function's name (iree-import-onnx names it after the ONNX graph)."""
    import re

    with open(mlir, errors="replace") as f:
        for line in f:
            m = re.search(r"func\.func @([\w$.-]+)\(", line) or re.search(r'func\.func @"([^"]+)"\(', line)
            if m:
                return m.group(1)
    raise PeerError("no func.func in the imported MLIR")
