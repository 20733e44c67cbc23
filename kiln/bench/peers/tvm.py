"""Apache TVM peer: ONNX through the Relax ONNX frontend, built by `tvm.compile`, run by the Relax VM.

Strategies:
- "default": the untuned default pipeline (legalized ops with TVM's default TIR schedules: plain,
  mostly single-threaded loops; slow, which is the point of the row).
- "metaschedule": `relax.get_pipeline("static_shape_tuning", total_trials=trials, ...)`, i.e.
  MetaSchedule tuning of every task then compilation with the tuned database. Only offered when
  the peer is built with a trial budget: `TvmPeer(trials=200)` / `get_peers(["tvm"],
  {"tvm": {"trials": 200}})`. Needs psutil and xgboost; with TVM 0.27.0.post1 it needs
  apache-tvm-ffi==0.1.14.post0 (0.1.15 segfaults in `JSONDatabase.commit_workload`). Tuning time is
  compile time (the 1024 GEMM needed ~390 s for 200 trials here).
Weights are bound as constants (`keep_params_in_input=False`). Target: `{"kind": "llvm", "mcpu":
<host cpu from LLVM>, "num-cores": threads}`.

Threads: TVM's runtime pool reads TVM_NUM_THREADS when it is first created, and on x86 otherwise
assumes hyper-threading and uses half the CPUs (1 here). So prepare() sets TVM_NUM_THREADS=threads if
the pool may not exist yet, then `runtime.config_threadpool(1, threads)` before every run (it can
only shrink below the pool's size). Placement is TVM's (it pins its workers to cores).
"""
from __future__ import annotations

import os
import tempfile

import numpy as np

from kiln.bench.peers.base import Peer, PeerError, Runner, dist_version, input_names, try_import
from kiln.bench.workload import Workload


def target(threads: int):
    import tvm
    from tvm.target import codegen

    return tvm.target.Target({"kind": "llvm", "mcpu": codegen.llvm_get_system_cpu(), "num-cores": threads})


class TvmPeer(Peer):
    name = "tvm"
    kinds = frozenset({"gemm", "conv", "network"})
    requirement = "apache-tvm apache-tvm-ffi==0.1.14.post0"
    approach = "compiler"

    def __init__(self, trials: int = 0, work_dir: str | None = None, max_trials_per_task: int | None = None
                 ) -> None:
        self.trials, self.work_dir, self.max_trials_per_task = trials, work_dir, max_trials_per_task
        self.strategies = ("default", "metaschedule") if trials > 0 else ("default",)

    def available(self) -> tuple[bool, str]:
        ok, why = try_import("tvm", "tvm.relax.frontend.onnx", pip=self.requirement)
        if ok and self.trials > 0:
            ok, why = try_import("psutil", "xgboost", pip="psutil xgboost-cpu")
        return ok, why

    def version(self) -> str:
        return f"{dist_version('apache-tvm')} (tvm-ffi {dist_version('apache-tvm-ffi')})"

    def prepare(self, workload: Workload, threads: int, strategy: str = "default") -> Runner:
        if strategy == "metaschedule" and self.trials <= 0:
            raise PeerError("tvm: metaschedule needs a trial budget, e.g. TvmPeer(trials=200)")
        strategy = self.check(workload, threads, strategy)
        os.environ.setdefault("TVM_NUM_THREADS", str(threads))
        import tvm
        from tvm import relax
        from tvm.relax.frontend.onnx import from_onnx

        model = workload.build_model()
        mod = from_onnx(model, keep_params_in_input=False)
        tgt = target(threads)
        if strategy == "metaschedule":
            work_dir = self.work_dir or tempfile.mkdtemp(prefix=f"kiln-tvm-ms-{workload.name}-")
            kw = {} if self.max_trials_per_task is None else {"max_trials_per_task": self.max_trials_per_task}
            with tgt:
                mod = relax.get_pipeline("static_shape_tuning", total_trials=self.trials, target=tgt,
                                         work_dir=work_dir, **kw)(mod)
        ex = tvm.compile(mod, target=tgt)
        run = vm_runner(ex, [workload.inputs[n] for n in input_names(model)], threads)
        if tvm.runtime.num_threads() != threads:
            raise PeerError(f"TVM's thread pool has {tvm.runtime.num_threads()} threads, not {threads} "
                            f"(TVM_NUM_THREADS={os.environ.get('TVM_NUM_THREADS')} was read when it started)")
        return run


def vm_runner(ex, inputs: list[np.ndarray], threads: int):  # noqa: ANN001, ANN201 - a tvm Executable → a runner
    """A compiled Relax module run on TVM's CPU VM with `threads` threads (re-set before each call: another
    runtime in the process may have resized the pool), returning NumPy outputs."""
    import tvm
    from tvm import relax

    dev = tvm.cpu()
    vm = relax.VirtualMachine(ex, dev)
    main = vm["main"]
    args = [tvm.runtime.tensor(np.ascontiguousarray(a), dev) for a in inputs]
    config = tvm.get_global_func("runtime.config_threadpool")
    config(1, threads)

    def run() -> list[np.ndarray]:
        if tvm.runtime.num_threads() != threads:
            config(1, threads)
        res = main(*args)
        return [r.numpy() for r in ([res] if isinstance(res, tvm.runtime.Tensor) else res)]

    run.keepalive = (vm, ex)  # type: ignore[attr-defined]
    return run
