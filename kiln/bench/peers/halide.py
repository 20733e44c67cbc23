"""Halide peer (GEMM only): C = A @ B written as a Halide pipeline, JIT-compiled for the host.

Strategies:
- "hand": B packed into TX-column panels (Bp[xi, k, xo], computed per call: a few % of the run),
  a TY x TX register tile of accumulators (the reduction innermost over k with the tile unrolled),
  tiles of C parallel over row blocks: with AVX-512, 8x32 (2 zmm x 8 rows); with AVX2, 6x16 (2 ymm x
  6 rows: the 8x32 tile's 32 ymm accumulators spill on AVX2's 16 registers, 37 ms on gemm_1024 vs 11).
  Sizes that are not multiples of the tile are handled by GuardWithIf (B's exterior reads 0).
- "adams2019": the same algorithm (no packing stage) scheduled by the Adams2019 autoscheduler with
  its built-in cost model, `parallelism = threads`, estimates = the workload's shape.
Halide's Buffer wraps the numpy arrays without copying (axes reversed: x is the column).

Threads: the Halide JIT runtime's thread pool reads HL_NUM_THREADS when it first runs parallel work
and is shared by every JIT pipeline of the process, with no Python call to resize it. So the first
prepare() sets HL_NUM_THREADS=threads (parallelism of the autoscheduler too) and a later prepare()
with another count raises PeerError (use a fresh process). Placement is the OS's.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from kiln.bench.peers.base import Peer, PeerError, Runner, dist_version, gemm_input, gemm_of, try_import
from kiln.bench.workload import Workload

# register tile per ISA: TX columns (TX/VEC vectors) x TY rows
TILES = {"avx512": (32, 8, 16), "avx2": (16, 6, 8)}
_pool_threads: list[int] = []


def fix_threads(threads: int) -> None:
    if not _pool_threads:
        os.environ["HL_NUM_THREADS"] = str(threads)
        _pool_threads.append(threads)
    if _pool_threads[0] != threads:
        raise PeerError(f"Halide's JIT thread pool was set to {_pool_threads[0]} threads in this process; "
                        f"threads={threads} needs a fresh process")


def build(m: int, n: int, k: int, strategy: str, threads: int) -> tuple[Any, Any, Any]:
    """The compiled pipeline and its two ImageParams (A as A(k, i), B as B(j, k))."""
    import halide as hl

    a_p, b_p = hl.ImageParam(hl.Float(32), 2, "A"), hl.ImageParam(hl.Float(32), 2, "B")
    x, y, xi, xo, yi, yo, kk = (hl.Var(s) for s in ("x", "y", "xi", "xo", "yi", "yo", "kk"))
    r = hl.RDom([(0, k)], "r")
    out = hl.Func("out")
    target = hl.get_jit_target_from_environment()
    TX, TY, VEC = TILES["avx512" if target.has_feature(hl.TargetFeature.AVX512) else "avx2"]
    if strategy == "hand":
        bc = hl.BoundaryConditions.constant_exterior(b_p, 0.0)
        packed, prod = hl.Func("Bp"), hl.Func("prod")
        packed[xi, kk, xo] = bc[xo * TX + xi, kk]
        prod[xi, y, xo] = hl.f32(0)
        prod[xi, y, xo] += a_p[r.x, y] * packed[xi, r.x, xo]
        out[x, y] = prod[x % TX, y, x / TX]
        guard = hl.TailStrategy.GuardWithIf
        out.split(x, xo, xi, TX, guard).split(y, yo, yi, TY, guard).reorder(xi, yi, xo, yo)
        out.parallel(yo).vectorize(xi, VEC)
        prod.compute_at(out, xo).vectorize(xi, VEC).unroll(xi).unroll(y)
        prod.update().reorder(xi, y, r.x).vectorize(xi, VEC).unroll(xi).unroll(y)
        packed.compute_root().parallel(xo).vectorize(xi, VEC)
    else:
        prod = hl.Func("prod")
        prod[x, y] = hl.f32(0)
        prod[x, y] += a_p[r.x, y] * b_p[x, r.x]
        out[x, y] = prod[x, y]
    a_p.dim(0).set_bounds(0, k).dim(1).set_bounds(0, m)
    b_p.dim(0).set_bounds(0, n).dim(1).set_bounds(0, k)
    out.output_buffer().dim(0).set_bounds(0, n).dim(1).set_bounds(0, m)
    pipe = hl.Pipeline(out)
    if strategy == "adams2019":
        a_p.set_estimates([(0, k), (0, m)])
        b_p.set_estimates([(0, n), (0, k)])
        out.set_estimates([(0, n), (0, m)])
        hl.load_plugin(str(Path(hl.__file__).parent / "lib64" / "libautoschedule_adams2019.so"))
        pipe.apply_autoscheduler(target, hl.AutoschedulerParams("Adams2019", {"parallelism": str(threads)}))
    pipe.compile_jit(target)
    return pipe, a_p, b_p


class HalidePeer(Peer):
    name = "halide"
    kinds = frozenset({"gemm"})
    strategies = ("hand", "adams2019")
    requirement = "halide"
    approach = "scheduled kernels (DSL)"

    def available(self) -> tuple[bool, str]:
        return try_import("halide", pip=self.requirement)

    def version(self) -> str:
        return dist_version("halide")

    def prepare(self, workload: Workload, threads: int, strategy: str = "default") -> Runner:
        strategy = self.check(workload, threads, strategy)
        fix_threads(threads)
        import halide as hl

        g = gemm_of(workload)
        pipe, a_p, b_p = build(g.m, g.n, g.k, strategy, threads)
        a, b = gemm_input(workload, g), g.b
        c = np.empty((g.m, g.n), np.float32)
        a_buf, b_buf, c_buf = hl.Buffer(a), hl.Buffer(b), hl.Buffer(c)

        def run() -> list[np.ndarray]:
            a_p.set(a_buf)
            b_p.set(b_buf)
            pipe.realize(c_buf)
            return [c]

        run.keepalive = (a, b, c, a_buf, b_buf, c_buf)  # type: ignore[attr-defined]
        return run
