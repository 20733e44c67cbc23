"""The peer interface: one other system (a runtime, a compiler, a BLAS) that `kiln bench` measures against.

A peer compiles/prepares a workload once and hands back a zero-argument callable that runs one
inference; the harness times `prepare` as compile time and the callable as run time. Every peer is
optional: `available()` says why it cannot run instead of raising at import, so this module and its
siblings import nothing heavy at module level.
"""
from __future__ import annotations

import importlib
import importlib.metadata
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from kiln.bench.workload import GemmSpec, Workload

Runner = Callable[[], list[np.ndarray]]
FeedRunner = Callable[[dict[str, np.ndarray]], list[np.ndarray]]


class PeerError(RuntimeError):
    """A peer cannot run this workload (wrong kind, unknown strategy, unsupported op...)."""


class Peer:
    """Base class; subclasses set `name`, `kinds`, `strategies` and implement the three methods."""

    name: str = ""
    kinds: frozenset[str] = frozenset()
    strategies: tuple[str, ...] = ("default",)
    #: pip requirement(s) that make the peer available, used in the skip reason
    requirement: str = ""
    #: how it builds its kernels, for the report's strategy section (kiln.bench.report.APPROACHES)
    approach: str = ""

    def available(self) -> tuple[bool, str]:
        """(True, "") when the peer can run here, else (False, reason with the install hint)."""
        raise NotImplementedError

    def version(self) -> str:
        raise NotImplementedError

    def prepare(self, workload: Workload, threads: int, strategy: str = "default") -> Runner:
        """Compile once; return a callable running ONE inference on `workload.inputs`."""
        raise NotImplementedError

    #: the precisions `kiln bench --precision` measures this peer at (fp32 is `prepare`'s)
    precisions: tuple[str, ...] = ("fp32",)

    def precision_available(self, precision: str) -> tuple[bool, str]:
        """(True, "") when the peer runs at `precision` here, else why not."""
        ok, why = self.available()
        if ok and precision not in self.precisions:
            return False, f"{self.name} has no {precision} path in kiln bench"
        return ok, why

    def prepare_precision(self, workload: Workload, threads: int, strategy: str, precision: str,
                          calibration: list[dict[str, np.ndarray]]) -> FeedRunner:
        """Compile at `precision` (quantizing with `calibration` for int8); return a callable running one
        inference on the feeds it is given (the timed feeds, then the evaluation inputs)."""
        raise PeerError(f"{self.name} has no {precision} path in kiln bench")

    # ---- helpers shared by the subclasses -------------------------------------------------
    def check(self, workload: Workload, threads: int, strategy: str) -> str:
        """Validate kind/threads/strategy and return the resolved strategy ("default" = the first one)."""
        ok, why = self.available()
        if not ok:
            raise PeerError(f"{self.name} unavailable: {why}")
        if workload.kind not in self.kinds:
            raise PeerError(f"{self.name} does not handle {workload.kind} workloads "
                            f"(only {sorted(self.kinds)})")
        if threads < 1:
            raise PeerError(f"threads must be >= 1, got {threads}")
        if strategy == "default":
            return self.strategies[0]
        if strategy not in self.strategies:
            raise PeerError(f"{self.name}: unknown strategy {strategy!r}; known: {self.strategies}")
        return strategy

    def __repr__(self) -> str:
        return f"<peer {self.name}>"


def try_import(*modules: str, pip: str) -> tuple[bool, str]:
    """Import each module; on failure say which one and how to install it."""
    for mod in modules:
        try:
            importlib.import_module(mod)
        except Exception as e:  # a broken install is as unavailable as a missing one
            return False, f"cannot import {mod} ({type(e).__name__}: {e}); pip install {pip}"
    return True, ""


def loadable(load: Callable[[], object], requirement: str) -> tuple[bool, str]:
    """available() of a peer that is a shared library loaded through ctypes."""
    try:
        load()
    except OSError as e:
        return False, f"{e}; pip install {requirement}"
    return True, ""


def dist_version(*dists: str) -> str:
    """Version of the first installed distribution among `dists` ('' when none is)."""
    for d in dists:
        try:
            return importlib.metadata.version(d)
        except importlib.metadata.PackageNotFoundError:
            continue
    return ""


def gemm_of(workload: Workload) -> GemmSpec:
    """The GemmSpec of a GEMM workload, checked: library peers call BLAS on it directly."""
    g = workload.gemm
    if g is None:
        raise PeerError(f"workload {workload.name} has no GemmSpec")
    a, b = writable_f32(g.a), writable_f32(g.b)
    if a.shape != (g.m, g.k) or b.shape != (g.k, g.n):
        raise PeerError(f"GemmSpec shapes A{a.shape} B{b.shape} do not match m,n,k={g.m},{g.n},{g.k}")
    return GemmSpec(g.m, g.n, g.k, a, b)


def gemm_input(workload: Workload, spec: GemmSpec) -> np.ndarray:
    """The runtime A: the workload's single feed when present (so every system reads the same array)."""
    if len(workload.inputs) == 1:
        a = next(iter(workload.inputs.values()))
        if a.shape == (spec.m, spec.k):
            return writable_f32(a)
    return spec.a


def writable_f32(x: np.ndarray) -> np.ndarray:
    """C-contiguous float32, copied when read-only (weights from numpy_helper are; Halide refuses them)."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    return x if x.flags.writeable else x.copy()


def input_names(model: Any) -> list[str]:
    """The model's runtime inputs in order (graph inputs that are not initializers)."""
    init = {t.name for t in model.graph.initializer}
    return [i.name for i in model.graph.input if i.name not in init]


def save_model(model: Any, name: str = "model", directory: str | Path | None = None) -> Path:
    """Write an ONNX model to a file in a fresh temp dir (for tools that only read files).

    Big weights go to an external data file beside it; the caller removes the directory."""
    import onnx

    d = Path(directory or tempfile.mkdtemp(prefix=f"kiln-{name}-"))
    d.mkdir(parents=True, exist_ok=True)
    path = d / "model.onnx"
    big = model.ByteSize() > 1_500_000_000
    onnx.save_model(model, str(path), save_as_external_data=big, location="model.onnx.data" if big else None)
    return path


CBLAS_ROW_MAJOR, CBLAS_NO_TRANS = 101, 111


def cblas_sgemm_runner(fn: Callable[..., None], a: np.ndarray, b: np.ndarray, m: int, n: int, k: int,
                 set_threads: Callable[[], object]) -> Runner:
    """Bind a row-major `cblas_sgemm` (OpenBLAS, MKL) to fixed buffers; C is allocated once and reused.

    `set_threads` runs before each call (a cheap library call) so a runner keeps its own thread count
    even when another runner of the same library was prepared with a different one in between.
    """
    c = np.empty((m, n), np.float32)
    pa, pb, pc = a.ctypes.data, b.ctypes.data, c.ctypes.data

    def run() -> list[np.ndarray]:
        set_threads()
        fn(CBLAS_ROW_MAJOR, CBLAS_NO_TRANS, CBLAS_NO_TRANS, m, n, k, 1.0, pa, k, pb, n, 0.0, pc, n)
        return [c]

    run.keepalive = (a, b, c)  # type: ignore[attr-defined]
    return run
